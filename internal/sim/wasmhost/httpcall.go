package wasmhost

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// callResponse is what on_http_call_response may read: the HTTP-call
// response header map (":status" first), trailers and body.
type callResponse struct {
	headers  *headerMap
	trailers *headerMap
	body     []byte
}

// doHTTPCall performs a dispatch_http_call over real HTTP and delivers the
// fully buffered response to the root context, like Envoy's async client:
// a connect failure or timeout comes back as a 503 or 504 response from
// the router, not as a failure; only a reset after the response started is
// a failure (on_http_call_response with zero sizes, get_status
// BrokenConnection "reset").
func (h *Host) doHTTPCall(v *vm, root *wctx, token uint32, cl *cluster, hdrs *headerMap, body []byte, trailers []Pair, timeout time.Duration) {
	ctx := context.Background()
	var cancel context.CancelFunc
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	resp := h.callOut(ctx, cl, hdrs, body)
	if resp == nil {
		v.mu.Lock()
		root.status, root.statusMsg = uint32(StatusBrokenConnection), "reset"
		v.mu.Unlock()
		v.call(root, "proxy_on_http_call_response", v.fn.onHTTPCallResponse, uint64(root.id), uint64(token), 0, 0, 0)
		v.mu.Lock()
		root.status, root.statusMsg = 0, ""
		v.mu.Unlock()
		return
	}
	v.mu.Lock()
	root.callResp = resp
	v.mu.Unlock()
	v.call(root, "proxy_on_http_call_response", v.fn.onHTTPCallResponse, uint64(root.id), uint64(token),
		uint64(len(resp.headers.pairs)), uint64(len(resp.body)), uint64(len(resp.trailers.pairs)))
	v.mu.Lock()
	root.callResp = nil
	v.mu.Unlock()
}

func (h *Host) callOut(ctx context.Context, cl *cluster, hdrs *headerMap, body []byte) *callResponse {
	local := func(code int, msg string) *callResponse {
		hm := &headerMap{}
		hm.add(":status", itoa(int64(code)))
		hm.add("content-length", itoa(int64(len(msg))))
		hm.add("content-type", "text/plain")
		return &callResponse{headers: hm, trailers: &headerMap{}, body: []byte(msg)}
	}
	// The async client runs the router, whose load-balancer context exposes
	// the call's headers: a cluster with the override_host policy sends the
	// call to the addresses named in the destination header, in order on
	// connect failure, else the fallback (least request) picks.
	dest, _ := hdrs.get(h.cfg.DestinationHeader)
	hosts := cl.overrideHosts(dest)
	if len(hosts) == 0 {
		for len(hosts) < len(cl.hosts) {
			hosts = append(hosts, cl.leastRequest(hosts))
		}
	}
	if len(hosts) == 0 {
		return local(http.StatusServiceUnavailable, "no healthy upstream")
	}
	method, _ := hdrs.get(":method")
	path, _ := hdrs.get(":path")
	authority, _ := hdrs.get(":authority")
	var (
		resp *http.Response
		uh   *upstreamHost
		err  error
	)
	for _, uh = range hosts {
		u, perr := url.Parse("http://" + uh.addr + path)
		if perr != nil {
			return local(http.StatusBadRequest, "invalid path")
		}
		req, rerr := http.NewRequestWithContext(ctx, method, u.String(), strings.NewReader(string(body)))
		if rerr != nil {
			return local(http.StatusBadRequest, rerr.Error())
		}
		req.Host = authority
		req.ContentLength = int64(len(body))
		if len(body) == 0 {
			req.Body = http.NoBody
		}
		for _, p := range hdrs.pairs {
			if strings.HasPrefix(p.Key, ":") || hopByHop[p.Key] || p.Key == "content-length" {
				continue
			}
			req.Header.Add(p.Key, p.Value)
		}
		uh.active.Add(1)
		resp, err = h.transport.RoundTrip(req)
		uh.active.Add(-1)
		if err == nil || !isConnectFailure(err) {
			break
		}
	}
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			return local(http.StatusGatewayTimeout, "upstream request timeout")
		}
		code, msg, _ := upstreamFailure(err)
		return local(code, msg)
	}
	defer resp.Body.Close()
	uh.requests.Add(1)
	h.countUpstream(uh.addr)
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			return local(http.StatusGatewayTimeout, "upstream request timeout")
		}
		return nil
	}
	r := &callResponse{headers: responseHeaderMap(resp, 0), trailers: &headerMap{}, body: data}
	r.headers.remove("x-envoy-upstream-service-time")
	for k, vals := range resp.Trailer {
		for _, val := range vals {
			r.trailers.add(k, val)
		}
	}
	return r
}
