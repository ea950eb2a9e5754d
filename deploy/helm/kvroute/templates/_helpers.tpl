{{/* The engines' namespace. */}}
{{- define "kvroute.enginesNamespace" -}}
{{- .Values.engines.namespace | default .Release.Namespace -}}
{{- end -}}

{{/* The Secret holding the state token. */}}
{{- define "kvroute.tokenSecret" -}}
{{- if .Values.state.existingSecret -}}
{{- .Values.state.existingSecret -}}
{{- else if .Values.state.token -}}
kvroute-state-token
{{- else -}}
{{- fail "set state.token (the chart creates the Secret) or state.existingSecret (a Secret with the key \"token\")" -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "kvroute.labels" -}}
app.kubernetes.io/part-of: kvroute
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* The Wasm image reference, without a scheme. */}}
{{- define "kvroute.wasmImage" -}}
{{- printf "%s:%s" .Values.wasm.repository .Values.wasm.tag -}}
{{- end -}}

{{/*
The plugin configuration (JSON) both filters receive. Call with a dict:
root (the chart context), decodeCluster and prefillCluster (the Envoy
cluster names of the engines on this platform).
*/}}
{{- define "kvroute.pluginConfig" -}}
{{- $v := .root.Values -}}
{{- $cfg := dict "endpoints" (list) "strategy" $v.router.strategy "destinationHeader" $v.router.destinationHeader "fallbacks" $v.router.fallbacks "bodyRouting" $v.router.bodyRouting "maxBodyBytes" $v.router.maxBodyBytes "state" (dict "path" $v.state.path "tokenEnv" "KVROUTE_STATE_TOKEN") -}}
{{- if $v.engines.prefillService -}}
{{- $_ := set $cfg "disaggregation" (dict "prefillStrategy" $v.router.strategy "threshold" $v.router.disaggregationThreshold) -}}
{{- $_ := set $cfg "pd" (dict "prefillCluster" .prefillCluster "decodeCluster" .decodeCluster "protocol" $v.engines.protocol) -}}
{{- end -}}
{{- toJson (mergeOverwrite $cfg (deepCopy $v.router.extraConfig)) -}}
{{- end -}}

{{/* The state URL of the chart's own gateway, if it has one. */}}
{{- define "kvroute.gatewayStateURL" -}}
{{- if eq .Values.gateway.type "istio" -}}
http://{{ .Values.gateway.istio.service }}:{{ .Values.state.port }}{{ .Values.state.path }}
{{- else if eq .Values.gateway.type "envoyGateway" -}}
{{- if not .Values.gateway.envoyGateway.service -}}
{{- fail "set gateway.envoyGateway.service: the in-cluster address of the Service Envoy Gateway creates for the Gateway (kubectl get svc -n envoy-gateway-system)" -}}
{{- end -}}
http://{{ .Values.gateway.envoyGateway.service }}:{{ .Values.state.port }}{{ .Values.state.path }}
{{- end -}}
{{- end -}}
