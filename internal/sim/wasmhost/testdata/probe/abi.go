//go:build wasip1

package main

import (
	"strconv"
	"strings"
	"unsafe"
)

//go:wasmimport env proxy_get_metric
func proxyGetMetric(id uint32, ret unsafe.Pointer) uint32

//go:wasmimport env proxy_resolve_shared_queue
func proxyResolveSharedQueue(vp unsafe.Pointer, vs uint32, np unsafe.Pointer, ns uint32, ret unsafe.Pointer) uint32

//go:wasmimport env proxy_register_shared_queue
func proxyRegisterSharedQueue(np unsafe.Pointer, ns uint32, ret unsafe.Pointer) uint32

//go:wasmimport env proxy_dequeue_shared_queue
func proxyDequeueSharedQueue(tok uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_set_buffer_bytes
func proxySetBufferBytes(t, start, length uint32, dp unsafe.Pointer, ds uint32) uint32

//go:wasmimport env proxy_call_foreign_function
func proxyCallForeignFunction(np unsafe.Pointer, ns uint32, ap unsafe.Pointer, as uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_done
func proxyDone() uint32

//go:wasmimport env proxy_grpc_call
func proxyGrpcCall(sp unsafe.Pointer, ss uint32, snp unsafe.Pointer, sns uint32, mp unsafe.Pointer, ms uint32, ip unsafe.Pointer, is uint32, rp unsafe.Pointer, rs uint32, timeout uint32, ret unsafe.Pointer) uint32

//go:wasmimport env proxy_get_header_map_size
func proxyGetHeaderMapSize(t uint32, ret unsafe.Pointer) uint32

// abiBattery runs host calls whose Envoy status is known and returns
// "name=status" pairs, for TestABIStatusesMatchEnvoy.
func abiBattery() string {
	var out []string
	rec := func(name string, st uint32) { out = append(out, name+"="+strconv.Itoa(int(st))) }
	var p, n, x uint32
	pp, pn := unsafe.Pointer(&p), unsafe.Pointer(&n)
	kp, kn := ptr("no-such-header")
	rec("get_header_missing", proxyGetHeaderMapValue(0, kp, kn, pp, pn))
	rec("get_header_bad_type", proxyGetHeaderMapValue(99, kp, kn, pp, pn))
	rec("get_call_response_header_outside", proxyGetHeaderMapValue(6, kp, kn, pp, pn))
	rec("add_response_trailer", addHeader(3, "a", "b"))
	rec("header_map_size_request", proxyGetHeaderMapSize(0, unsafe.Pointer(&x)))
	rec("counter_increment_zero", proxyIncrementMetric(metric(0, "probe.abi.counter"), 0))
	rec("counter_increment_negative", proxyIncrementMetric(metric(0, "probe.abi.counter"), -1))
	rec("gauge_increment_negative", proxyIncrementMetric(metric(1, "probe.abi.gauge"), -1))
	var v uint64
	rec("get_metric_histogram", proxyGetMetric(metric(2, "probe.abi.histogram"), unsafe.Pointer(&v)))
	rec("get_metric_unknown", proxyGetMetric(4000, unsafe.Pointer(&v)))
	np, nn := ptr("x")
	rec("define_metric_bad_type", proxyDefineMetric(5, np, nn, unsafe.Pointer(&x)))
	sk, sn := ptr("probe.abi.missing")
	var cas uint32
	rec("get_shared_missing", proxyGetSharedData(sk, sn, pp, pn, unsafe.Pointer(&cas)))
	ck, cn := ptr("probe.abi.cas")
	proxySetSharedData(ck, cn, np, nn, 0)
	proxyGetSharedData(ck, cn, pp, pn, unsafe.Pointer(&cas))
	rec("set_shared_stale_cas", proxySetSharedData(ck, cn, np, nn, cas+1000))
	rec("set_shared_cas_zero", proxySetSharedData(ck, cn, np, nn, 0))
	qn, qs := ptr("probe.abi.none")
	rec("resolve_queue_unknown", proxyResolveSharedQueue(nil, 0, qn, qs, unsafe.Pointer(&x)))
	rec("dequeue_unknown", proxyDequeueSharedQueue(999999, pp, pn))
	rq, rs := ptr("probe.abi.q")
	var tok uint32
	proxyRegisterSharedQueue(rq, rs, unsafe.Pointer(&tok))
	rec("dequeue_empty", proxyDequeueSharedQueue(tok, pp, pn))
	lp, ln := ptr("m")
	rec("log_bad_level", proxyLog(7, lp, ln))
	rec("effective_context_unknown", proxySetEffectiveContext(999999))
	rec("get_buffer_bad_type", proxyGetBufferBytes(9, 0, 10, pp, pn))
	rec("get_call_response_body_outside", proxyGetBufferBytes(4, 0, 10, pp, pn))
	rec("get_plugin_config_outside", proxyGetBufferBytes(7, 0, 10, pp, pn))
	rec("set_vm_config", proxySetBufferBytes(6, 0, 0, np, nn))
	rec("set_request_body_headers_phase", proxySetBufferBytes(0, 0, 0, np, nn))
	fp, fn := ptr("no_such_function")
	rec("foreign_function_unknown", proxyCallForeignFunction(fp, fn, nil, 0, pp, pn))
	rec("done_outside_shutdown", proxyDone())
	gp, gn := ptr("nocluster")
	rec("grpc_call", proxyGrpcCall(gp, gn, gp, gn, gp, gn, nil, 0, nil, 0, 1000, unsafe.Pointer(&x)))
	rec("continue_stream_bad", proxyContinueStream(9))
	rec("continue_stream_upstream", proxyContinueStream(3))
	_, st := property("no_such_property")
	rec("property_unknown", st)
	vmid, st := property("plugin_vm_id")
	rec("property_vm_id_"+vmid, st)
	path, st := property("request", "path")
	rec("property_request_path", st)
	rec("property_request_path_value_"+path, st)
	name, st := property("plugin_name")
	rec("property_plugin_name_"+name, st)
	root, st := property("plugin_root_id")
	rec("property_plugin_root_id_"+root, st)
	hp := pairs([][2]string{{":method", "GET"}, {":path", "/"}})
	up, un := ptr("engines")
	rec("http_call_no_authority", proxyHTTPCall(up, un, unsafe.Pointer(&hp[0]), uint32(len(hp)), nil, 0, nil, 0, 1000, unsafe.Pointer(&x)))
	return strings.Join(out, ",")
}
