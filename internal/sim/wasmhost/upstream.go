package wasmhost

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Forwarding upstream: the emulation of Envoy's terminal router filter
// (envoy.filters.http.router), which picks the upstream host when the
// request headers reach it, then streams the body up and the response
// back. Not to be confused with kvroute.router, the filter under test, or
// dispatch.Dispatcher, its decision glue.

func (s *stream) routeHeaders(eos bool) {
	if dr := s.h.cfg.DirectResponse; dr != nil {
		s.localReply(dr.Status, []byte(dr.Body), nil, "direct_response")
		return
	}
	s.routed = true
	dest, _ := s.reqHeaders.get(s.h.cfg.DestinationHeader)
	var attempts []string
	var hosts []*upstreamHost
	cl := s.h.clusters[s.h.cfg.RouteCluster]
	if s.h.cfg.OriginalDst {
		addr, ok := originalDst(dest)
		if !ok {
			s.localReply(http.StatusServiceUnavailable, []byte("no healthy upstream"), nil, "no_healthy_upstream")
			return
		}
		attempts = []string{addr}
		hosts = []*upstreamHost{nil}
		if cl != nil {
			hosts[0] = cl.byAddr[addr]
		}
	} else {
		if cl == nil || len(cl.hosts) == 0 {
			s.localReply(http.StatusServiceUnavailable, []byte("no healthy upstream"), nil, "no_healthy_upstream")
			return
		}
		hosts = cl.overrideHosts(dest)
		if len(hosts) == 0 {
			// Fallback policy: least request, and on a connect failure
			// another host that was not tried yet (retry on connect-failure
			// with previous hosts excluded).
			for len(hosts) < len(cl.hosts) {
				hosts = append(hosts, cl.leastRequest(hosts))
			}
		}
		for _, uh := range hosts {
			attempts = append(attempts, uh.addr)
		}
	}
	req := s.upstreamRequest(eos)
	ctx, cancel := context.WithCancel(context.Background())
	s.upCancel = cancel
	s.upGen++
	gen := s.upGen
	if eos {
		s.startRouteTimer()
	}
	go s.h.forward(s, gen, ctx, req, attempts, hosts)
}

func (s *stream) startRouteTimer() {
	if s.h.cfg.RouteTimeout > 0 && s.routeTimer == nil {
		s.routeTimer = time.NewTimer(s.h.cfg.RouteTimeout)
	}
}

func (s *stream) routeData(chunk []byte, eos bool) {
	if s.upBody == nil {
		return
	}
	if len(chunk) > 0 {
		s.upBody.Write(chunk)
	}
	if eos {
		s.upBody.Close()
		s.startRouteTimer()
	}
}

// upstreamRequest converts the (filtered) request header map into the
// request sent upstream. The body streams through a pipe.
func (s *stream) upstreamRequest(eos bool) *http.Request {
	hm := s.reqHeaders
	method, _ := hm.get(":method")
	path, _ := hm.get(":path")
	authority, _ := hm.get(":authority")
	req := &http.Request{Method: method, Header: http.Header{}, Host: authority, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
	req.ContentLength = 0
	for _, p := range hm.pairs {
		if strings.HasPrefix(p.Key, ":") || hopByHop[p.Key] {
			continue
		}
		if p.Key == "content-length" {
			if n, err := strconv.ParseInt(p.Value, 10, 64); err == nil {
				req.ContentLength = n
			}
			continue
		}
		req.Header[http.CanonicalHeaderKey(p.Key)] = append(req.Header[http.CanonicalHeaderKey(p.Key)], p.Value)
	}
	if eos {
		req.Body = http.NoBody
		req.ContentLength = 0
	} else {
		s.upBody = newBodyPipe()
		req.Body = s.upBody
		if _, ok := hm.get("content-length"); !ok {
			req.ContentLength = -1
		}
	}
	if s.h.cfg.RouteTimeout > 0 {
		req.Header.Set("X-Envoy-Expected-Rq-Timeout-Ms", strconv.FormatInt(s.h.cfg.RouteTimeout.Milliseconds(), 10))
	}
	req.RequestURI = path // carried to forward, which builds the URL per attempt
	return req
}

// forward tries the hosts in order; only a connect failure moves to the
// next one (Envoy retries connect-failure with the override_host list).
func (h *Host) forward(s *stream, gen int, ctx context.Context, proto *http.Request, attempts []string, hosts []*upstreamHost) {
	var lastErr error
	for i, addr := range attempts {
		req := proto.Clone(ctx)
		req.RequestURI = ""
		u, err := url.Parse("http://" + addr + proto.RequestURI)
		if err != nil {
			lastErr = err
			break
		}
		req.URL = u
		req.Body = proto.Body
		if req.Body != nil && req.Body != http.NoBody {
			req.Body = noClose{proto.Body}
		}
		uh := hosts[i]
		if uh != nil {
			uh.active.Add(1)
		}
		resp, err := h.transport.RoundTrip(req)
		if err != nil {
			if uh != nil {
				uh.active.Add(-1)
			}
			lastErr = err
			if isConnectFailure(err) && i+1 < len(attempts) {
				continue
			}
			s.post(event{kind: evUpstreamError, err: err, gen: gen})
			return
		}
		if uh != nil {
			uh.requests.Add(1)
		}
		h.countUpstream(addr)
		eos := resp.ContentLength == 0 || proto.Method == http.MethodHead
		s.post(event{kind: evUpstreamHeaders, resp: resp, gen: gen, addr: addr, eos: eos})
		if !eos {
			h.pumpResponse(s, gen, ctx, resp)
		} else {
			resp.Body.Close()
		}
		if uh != nil {
			uh.active.Add(-1)
		}
		return
	}
	s.post(event{kind: evUpstreamError, err: lastErr, gen: gen})
}

// pumpResponse hands the response body to the stream chunk by chunk (one
// Read is one chunk, so SSE events keep their boundaries) and waits for
// each to be processed.
func (h *Host) pumpResponse(s *stream, gen int, ctx context.Context, resp *http.Response) {
	defer resp.Body.Close()
	var read int64
	for {
		buf := make([]byte, 32<<10)
		n, err := resp.Body.Read(buf)
		read += int64(n)
		eos := err == io.EOF || (resp.ContentLength > 0 && read >= resp.ContentLength && err == nil)
		// As Envoy's HTTP/1 codec delivers a body: every read's bytes with
		// end_stream false, then the end as an empty chunk of its own
		// (onBody, then onMessageCompleteBase's empty decodeData), so a
		// filter sees the same callbacks here as in Envoy.
		for _, c := range [2]struct {
			data []byte
			eos  bool
		}{{buf[:n], false}, {nil, eos}} {
			if len(c.data) == 0 && !c.eos {
				continue
			}
			ack := make(chan struct{})
			s.post(event{kind: evUpstreamData, data: c.data, eos: c.eos, gen: gen, ack: ack})
			select {
			case <-ack:
			case <-ctx.Done():
				return
			case <-h.done:
				return
			}
		}
		if eos {
			return
		}
		if err != nil {
			s.post(event{kind: evUpstreamError, err: err, gen: gen})
			return
		}
	}
}

// upstreamFailure maps a failed upstream request to Envoy's local reply.
func upstreamFailure(err error) (int, string, string) {
	if err == nil {
		return http.StatusServiceUnavailable, "no healthy upstream", "no_healthy_upstream"
	}
	if isConnectFailure(err) {
		return http.StatusServiceUnavailable,
			"upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, transport failure reason: " + err.Error(),
			"upstream_reset_before_response_started{remote_connection_failure}"
	}
	return http.StatusServiceUnavailable,
		"upstream connect error or disconnect/reset before headers. reset reason: connection termination",
		"upstream_reset_before_response_started{connection_termination}"
}

func isConnectFailure(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

type noClose struct{ io.Reader }

func (noClose) Close() error { return nil }

// bodyPipe is an unbounded in-memory pipe: the stream writes without
// blocking, the upstream request reads.
type bodyPipe struct {
	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte
	closed bool
	err    error
}

func newBodyPipe() *bodyPipe {
	p := &bodyPipe{}
	p.cond = sync.NewCond(&p.mu)
	return p
}

func (p *bodyPipe) Write(b []byte) {
	p.mu.Lock()
	p.buf = append(p.buf, b...)
	p.mu.Unlock()
	p.cond.Broadcast()
}

func (p *bodyPipe) Close() error { p.CloseWithError(nil); return nil }

func (p *bodyPipe) CloseWithError(err error) {
	p.mu.Lock()
	if !p.closed {
		p.closed, p.err = true, err
	}
	p.mu.Unlock()
	p.cond.Broadcast()
}

func (p *bodyPipe) Read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.buf) == 0 && !p.closed {
		p.cond.Wait()
	}
	if len(p.buf) > 0 {
		n := copy(b, p.buf)
		p.buf = p.buf[n:]
		return n, nil
	}
	if p.err != nil {
		return 0, p.err
	}
	return 0, io.EOF
}
