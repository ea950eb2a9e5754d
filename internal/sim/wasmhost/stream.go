package wasmhost

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A stream is one HTTP request through the filter chain, emulating Envoy's
// filter manager: request headers and body go through the filters in order
// and then to the router; the response comes back through them in reverse.
// The handler goroutine owns the stream; VM callbacks that act on it
// (continue_stream, send_local_response) post events to it.

type evKind int

const (
	evReqData evKind = iota
	evReqError
	evContinueRequest
	evContinueResponse
	evLocalReply
	evReset
	evUpstreamHeaders
	evUpstreamData
	evUpstreamError
)

type event struct {
	kind    evKind
	ctx     *wctx
	data    []byte
	eos     bool
	code    int
	body    []byte
	headers []Pair
	details string
	resp    *http.Response
	err     error
	gen     int
	addr    string
	ack     chan struct{}
}

// dirState is the iteration state of one direction.
type dirState struct {
	at      int  // filter where headers are stopped (valid when stopped)
	stopped bool // headers are stopped at filter at
	stopAll bool // ...with StopAll*: body is held, not delivered to the filter
	// stopAllBuffer: StopAllIterationAndBuffer (413 past the buffer limit)
	// rather than ...AndWatermark (flow control: the stream just waits).
	stopAllBuffer bool
	started       bool // headers entered the chain
	fs            []filterData
}

type filterData struct {
	pending    []byte // body held by the filter manager while headers stopAll here
	pendingEOS bool
	buffering  bool // the filter returned StopIterationAndBuffer (or ...AndWatermark) on data
	watermark  bool // ...AndWatermark: past the limit the stream waits instead of 413
	buf        []byte
	bufEOS     bool
}

type stream struct {
	h    *Host
	v    *vm // nil when the chain has no Wasm filter
	w    http.ResponseWriter
	r    *http.Request
	ctxs []*wctx

	mu    sync.Mutex
	queue []event
	wake  chan struct{}

	start        time.Time
	localAddr    string
	reqHeaders   *headerMap
	respHeaders  *headerMap
	reqBodySize  int64
	bodyRead     atomic.Int64 // bytes the body reader got
	readerDone   chan struct{}
	respBodySize int64
	details      string
	props        map[string][]byte

	dec, enc dirState

	routed       bool
	upGen        int
	upCancel     context.CancelFunc
	upBody       *bodyPipe
	upstreamAddr string
	routeTimer   *time.Timer

	failReplied  bool
	localReplied bool
	wroteHeaders bool
	done         bool
	aborted      bool
}

func (s *stream) post(e event) {
	s.mu.Lock()
	s.queue = append(s.queue, e)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *stream) setProperty(key string, val []byte) {
	if s.props == nil {
		s.props = map[string][]byte{}
	}
	s.props[key] = val
}

func (s *stream) getProperty(key string) ([]byte, bool) {
	v, ok := s.props[key]
	return v, ok
}

func (s *stream) logReqHeaders() *headerMap  { return s.reqHeaders }
func (s *stream) logRespHeaders() *headerMap { return s.respHeaders }

// serve runs the stream to its end.
func (h *Host) serveStream(w http.ResponseWriter, r *http.Request) {
	s := &stream{h: h, w: w, r: r, wake: make(chan struct{}, 1), start: time.Now()}
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		s.localAddr = la.String()
	}
	n := len(h.cfg.Filters)
	s.dec.fs = make([]filterData, n)
	s.enc.fs = make([]filterData, n)
	if n > 0 {
		s.v = h.vms[h.worker(r)]
		s.v.streams.Add(1)
		s.ctxs = make([]*wctx, n)
		for i := range s.ctxs {
			s.ctxs[i] = &wctx{vm: s.v, filter: i, root: s.v.roots[i], s: s, id: 0}
		}
	}
	s.reqHeaders = requestHeaderMap(r)
	for _, name := range h.cfg.RemoveRequestHeaders {
		s.reqHeaders.remove(strings.ToLower(name))
	}
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex()

	noBody := r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0
	if !noBody {
		readerDone := make(chan struct{})
		s.readerDone = readerDone
		go func() {
			defer close(readerDone)
			s.readBody()
		}()
		// The body reader must be gone before the handler returns, or the
		// server's next read races with it. A stream that ended before the
		// body did (a local reply, an early response) closes its connection
		// as Envoy's delayed close does: the response goes out, and the
		// rest of the body is read and dropped for DelayedCloseTimeout, so
		// a client still writing it is not reset before it reads the
		// response. An aborted stream, or a client still sending after the
		// delay, stops reading by expiring the read deadline, which also
		// closes the connection.
		defer func() {
			select {
			case <-readerDone:
				return
			default:
			}
			if !s.aborted {
				_ = rc.Flush()
				_ = rc.SetReadDeadline(time.Now().Add(h.cfg.DelayedCloseTimeout))
				select {
				case <-readerDone:
					return
				case <-time.After(h.cfg.DelayedCloseTimeout):
				}
			}
			_ = rc.SetReadDeadline(time.Now())
			select {
			case <-readerDone:
			case <-time.After(2 * time.Second):
			}
		}()
	}
	h.activeStreams.Add(1)
	defer h.activeStreams.Add(-1)

	s.dec.started = true
	s.decodeHeaders(0, noBody)

	idle := time.NewTimer(h.cfg.StreamIdleTimeout)
	defer idle.Stop()
	var routeC <-chan time.Time
	for !s.done {
		s.mu.Lock()
		q := s.queue
		s.queue = nil
		s.mu.Unlock()
		for _, e := range q {
			if s.done {
				break
			}
			s.handle(e)
		}
		if s.done {
			break
		}
		if len(q) > 0 {
			idle.Reset(h.cfg.StreamIdleTimeout)
		}
		if s.routeTimer != nil {
			routeC = s.routeTimer.C
		}
		select {
		case <-s.wake:
		case <-r.Context().Done():
			s.details = "downstream_remote_disconnect"
			s.abort()
		case <-h.done:
			s.abort()
		case <-idle.C:
			s.localReply(http.StatusRequestTimeout, []byte("stream timeout"), nil, "stream_idle_timeout")
		case <-routeC:
			routeC = nil
			s.routeTimer = nil
			s.localReply(http.StatusGatewayTimeout, []byte("upstream request timeout"), nil, "upstream_response_timeout")
		}
	}
	s.complete()
	if s.aborted {
		defer panic(http.ErrAbortHandler) // after the body reader stopped
	}
}

// worker picks the VM for a new stream of r (see Dispatch).
func (h *Host) worker(r *http.Request) int {
	if h.cfg.Dispatch == DispatchStream || r.RemoteAddr == "" {
		return int(uint64(h.nextWorker.Add(1)-1) % uint64(len(h.vms)))
	}
	f := fnv.New32a()
	io.WriteString(f, r.RemoteAddr)
	return int(f.Sum32() % uint32(len(h.vms)))
}

// bodyIncomplete reports whether request body bytes are still unread.
func (s *stream) bodyIncomplete() bool {
	if s.readerDone == nil {
		return false
	}
	select {
	case <-s.readerDone:
		return false
	default:
	}
	return s.r.ContentLength < 0 || s.bodyRead.Load() < s.r.ContentLength
}

func (s *stream) readBody() {
	for {
		buf := make([]byte, 64<<10)
		n, err := s.r.Body.Read(buf)
		s.bodyRead.Add(int64(n))
		if n > 0 {
			s.post(event{kind: evReqData, data: buf[:n]})
		}
		if err == io.EOF {
			// The end comes on its own, as an empty last chunk: see
			// pumpResponse.
			s.post(event{kind: evReqData, eos: true})
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			s.post(event{kind: evReqError, err: err})
			return
		}
	}
}

func (s *stream) handle(e event) {
	switch e.kind {
	case evReqData:
		s.reqBodySize += int64(len(e.data))
		if !s.localReplied {
			s.decodeData(0, e.data, e.eos)
		}
	case evReqError:
		s.details = "downstream_remote_disconnect"
		s.abort()
	case evContinueRequest:
		if !s.localReplied {
			s.continueDecoding(e.ctx.filter)
		}
	case evContinueResponse:
		s.continueEncoding(e.ctx.filter)
	case evLocalReply:
		s.localReply(e.code, e.body, e.headers, e.details)
	case evReset:
		s.details = e.details
		s.abort()
	case evUpstreamHeaders:
		if e.gen != s.upGen || s.localReplied {
			e.resp.Body.Close()
			return
		}
		s.upstreamAddr = e.addr
		s.respHeaders = responseHeaderMap(e.resp, time.Since(s.start))
		s.details = "via_upstream"
		s.enc.started = true
		s.encodeHeaders(len(s.ctxs)-1, e.eos)
	case evUpstreamData:
		if e.gen == s.upGen && !s.localReplied {
			s.respBodySize += int64(len(e.data))
			s.encodeData(len(s.ctxs)-1, e.data, e.eos)
		}
		close(e.ack)
	case evUpstreamError:
		if e.gen != s.upGen || s.localReplied {
			return
		}
		if s.enc.started {
			s.details = "upstream_reset_after_response_started"
			s.abort()
			return
		}
		code, body, details := upstreamFailure(e.err)
		s.localReply(code, []byte(body), nil, details)
	}
}

// Filter calls, with Envoy's CHECK_FAIL and status conversion.

func (s *stream) failed() bool { return s.v != nil && s.v.failed.Load() }

// failCheck is CHECK_FAIL_HTTP: on a failed VM, fail open continues the
// stream past the filter; fail closed answers 503 once.
func (s *stream) failCheck() bool {
	if s.h.cfg.FailOpen {
		return true
	}
	if !s.failReplied {
		s.failReplied = true
		s.h.failClosedReplies.Add(1)
		s.localReply(http.StatusServiceUnavailable, nil, nil, "wasm_fail_stream")
	}
	return false
}

func (s *stream) ensureCreated(c *wctx) {
	if c.created {
		return
	}
	c.created = true
	v := s.v
	v.mu.Lock()
	v.nextContextID++
	c.id = v.nextContextID
	v.contexts[c.id] = c
	v.mu.Unlock()
	if !v.failed.Load() {
		v.call(c, "proxy_on_context_create", v.fn.onContextCreate, uint64(c.id), uint64(c.root.id))
	}
}

// headersStatus calls a headers callback and converts its result as
// proxy-wasm-cpp-host does: local response or unknown value →
// StopAllIterationAndWatermark; StopIteration → StopAllIterationAndWatermark
// unless the plugin allows StopIteration (request headers only decide by
// the plugin setting; Envoy applies it to both directions).
func (s *stream) headersStatus(c *wctx, request bool, eos bool) (cont bool, stopAll bool, buffer bool) {
	if s.failed() {
		return s.failCheck(), true, false
	}
	v := s.v
	fn, name, hm := v.fn.onResponseHeaders, "proxy_on_response_headers", s.respHeaders
	if request {
		fn, name, hm = v.fn.onRequestHeaders, "proxy_on_request_headers", s.reqHeaders
	}
	nh := len(hm.pairs)
	res, stop, ok := v.call(c, name, fn, uint64(c.id), uint64(nh), b2u(eos))
	if !ok || s.failed() {
		return s.failCheck(), true, false
	}
	if stop || res > headersStopAllIterationAndWatermark {
		return false, true, false
	}
	switch res {
	case headersContinue:
		return true, false, false
	case headersStopIteration:
		return false, !s.h.cfg.Filters[c.filter].AllowOnHeadersStopIteration, false
	case headersStopAllIterationAndBuffer:
		return false, true, true
	}
	return false, true, false
}

// dataStatus calls a body callback and converts its result.
func (s *stream) dataStatus(c *wctx, request bool, size int, eos bool) uint64 {
	if s.failed() {
		if s.failCheck() {
			return dataContinue
		}
		return dataStopIterationNoBuffer
	}
	v := s.v
	fn, name := v.fn.onResponseBody, "proxy_on_response_body"
	if request {
		fn, name = v.fn.onRequestBody, "proxy_on_request_body"
	}
	res, stop, ok := v.call(c, name, fn, uint64(c.id), uint64(size), b2u(eos))
	if !ok || s.failed() {
		if s.failCheck() {
			return dataContinue
		}
		return dataStopIterationNoBuffer
	}
	if stop || res > dataStopIterationNoBuffer {
		return dataStopIterationNoBuffer
	}
	return res
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// Decoding (request path).

func (s *stream) decodeHeaders(f int, eos bool) {
	d := &s.dec
	for ; f < len(s.ctxs); f++ {
		if s.localReplied || s.done {
			return
		}
		c := s.ctxs[f]
		s.ensureCreated(c)
		c.reqHeaders = s.reqHeaders
		cont, stopAll, buffer := s.headersStatus(c, true, eos)
		if cont {
			c.reqHeaders = nil
			continue
		}
		d.at, d.stopped, d.stopAll, d.stopAllBuffer = f, true, stopAll, buffer
		return
	}
	if s.localReplied || s.done {
		return
	}
	d.at, d.stopped = len(s.ctxs), false
	s.routeHeaders(eos)
}

func (s *stream) bufferLimitExceeded(n int) bool {
	if n > s.h.cfg.BufferLimitBytes {
		s.localReply(http.StatusRequestEntityTooLarge, []byte("Payload Too Large"), nil, "request_payload_too_large")
		return true
	}
	return false
}

func (s *stream) decodeData(f int, chunk []byte, eos bool) {
	d := &s.dec
	for ; f < len(s.ctxs); f++ {
		if s.localReplied || s.done {
			return
		}
		c, fd := s.ctxs[f], &d.fs[f]
		if d.stopped && d.at == f && d.stopAll {
			// StopAllIteration*: Envoy buffers the body and does not call
			// the filter until it continues. Past the buffer limit,
			// ...AndBuffer answers 413 and ...AndWatermark (the default
			// conversion of a Pause) applies flow control: the stream waits.
			fd.pending = append(fd.pending, chunk...)
			fd.pendingEOS = eos
			if d.stopAllBuffer {
				s.bufferLimitExceeded(len(fd.pending))
			}
			return
		}
		var body *[]byte
		if fd.buffering {
			fd.buf = append(fd.buf, chunk...)
			fd.bufEOS = eos
			if !fd.watermark && s.bufferLimitExceeded(len(fd.buf)) {
				return
			}
			body = &fd.buf
		} else {
			tmp := chunk
			body = &tmp
		}
		c.reqBody = body
		st := s.dataStatus(c, true, len(*body), eos)
		fd.buffering = false
		switch st {
		case dataContinue:
			c.reqBody = nil
			chunk = *body
			fd.buf = nil
			if d.stopped && d.at == f {
				// Continue on data while the headers wait (StopIteration)
				// sends the headers on first. Envoy keeps the filter's
				// header map here (only continue_stream drops it), so later
				// writes succeed but no longer reach the upstream.
				d.stopped = false
				s.decodeHeaders(f+1, false)
			}
		case dataStopIterationAndBuffer, dataStopIterationAndWatermark:
			fd.buffering = true
			fd.watermark = st == dataStopIterationAndWatermark
			fd.buf = *body
			fd.bufEOS = eos
			c.reqBody = &fd.buf
			return
		default: // StopIterationNoBuffer: the filter keeps (or drops) the data
			c.reqBody = nil
			return
		}
	}
	if s.localReplied || s.done {
		return
	}
	s.routeData(chunk, eos)
}

// continueDecoding resumes the request at filter f (continue_stream).
func (s *stream) continueDecoding(f int) {
	d := &s.dec
	fd := &d.fs[f]
	c := s.ctxs[f]
	c.reqHeaders, c.reqBody = nil, nil
	if d.stopped && d.at == f {
		stopAll := d.stopAll
		d.stopped = false
		s.decodeHeaders(f+1, s.reqEOSAtHeaders())
		if stopAll {
			// The held body goes to this same filter first.
			if len(fd.pending) > 0 || fd.pendingEOS {
				p, e := fd.pending, fd.pendingEOS
				fd.pending, fd.pendingEOS = nil, false
				s.decodeData(f, p, e)
			}
			return
		}
	}
	if fd.buffering {
		b, e := fd.buf, fd.bufEOS
		fd.buffering, fd.buf, fd.bufEOS = false, nil, false
		s.decodeData(f+1, b, e)
	}
}

func (s *stream) reqEOSAtHeaders() bool {
	return s.r.Body == nil || s.r.Body == http.NoBody || s.r.ContentLength == 0
}

// Encoding (response path), filters in reverse order.

func (s *stream) encodeHeaders(f int, eos bool) {
	e := &s.enc
	for ; f >= 0; f-- {
		if s.done {
			return
		}
		c := s.ctxs[f]
		if !c.created || c.failureReplySent || (s.failReplied && s.failed()) {
			continue
		}
		c.respHeaders = s.respHeaders
		cont, stopAll, buffer := s.headersStatus(c, false, eos)
		if cont {
			c.respHeaders = nil
			continue
		}
		e.at, e.stopped, e.stopAll, e.stopAllBuffer = f, true, stopAll, buffer
		return
	}
	e.at, e.stopped = -1, false
	s.writeHeaders(eos)
}

func (s *stream) encodeData(f int, chunk []byte, eos bool) {
	e := &s.enc
	for ; f >= 0; f-- {
		if s.done {
			return
		}
		c, fd := s.ctxs[f], &e.fs[f]
		if !c.created || c.failureReplySent || (s.failReplied && s.failed()) {
			continue
		}
		if e.stopped && e.at == f && e.stopAll {
			fd.pending = append(fd.pending, chunk...)
			fd.pendingEOS = eos
			if e.stopAllBuffer && len(fd.pending) > s.h.cfg.BufferLimitBytes {
				s.details = "response_payload_too_large"
				s.abort()
			}
			return
		}
		var body *[]byte
		if fd.buffering {
			fd.buf = append(fd.buf, chunk...)
			fd.bufEOS = eos
			body = &fd.buf
		} else {
			tmp := chunk
			body = &tmp
		}
		c.respBody = body
		st := s.dataStatus(c, false, len(*body), eos)
		fd.buffering = false
		switch st {
		case dataContinue:
			c.respBody = nil
			chunk = *body
			fd.buf = nil
			if e.stopped && e.at == f {
				e.stopped = false
				s.encodeHeaders(f-1, false)
			}
		case dataStopIterationAndBuffer, dataStopIterationAndWatermark:
			fd.buffering = true
			fd.buf = *body
			fd.bufEOS = eos
			c.respBody = &fd.buf
			return
		default:
			c.respBody = nil
			return
		}
	}
	s.writeData(chunk, eos)
}

func (s *stream) continueEncoding(f int) {
	e := &s.enc
	fd := &e.fs[f]
	s.ctxs[f].respBody = nil
	if e.stopped && e.at == f {
		stopAll := e.stopAll
		e.stopped = false
		// continue_stream(Response) drops the request maps only (Envoy).
		s.encodeHeaders(f-1, false)
		if stopAll {
			if len(fd.pending) > 0 || fd.pendingEOS {
				p, eos := fd.pending, fd.pendingEOS
				fd.pending, fd.pendingEOS = nil, false
				s.encodeData(f, p, eos)
			}
			return
		}
	}
	if fd.buffering {
		b, eos := fd.buf, fd.bufEOS
		fd.buffering, fd.buf, fd.bufEOS = false, nil, false
		s.encodeData(f-1, b, eos)
	}
}

// Downstream writes.

func (s *stream) writeHeaders(eos bool) {
	if s.wroteHeaders {
		return
	}
	s.wroteHeaders = true
	code := 200
	hdr := s.w.Header()
	for _, p := range s.respHeaders.pairs {
		if p.Key == ":status" {
			code, _ = strconv.Atoi(p.Value)
			continue
		}
		if strings.HasPrefix(p.Key, ":") || hopByHop[p.Key] {
			continue
		}
		hdr.Add(p.Key, p.Value)
	}
	if code < 100 || code > 999 {
		code = http.StatusBadGateway
	}
	hdr.Set("Server", "envoy") // the connection manager's server_header_transformation: OVERWRITE
	if s.bodyIncomplete() {
		// A response before the whole request (a local reply from the
		// headers, an early upstream answer): Envoy closes an HTTP/1
		// connection then, so unread body bytes never parse as the next
		// request.
		hdr.Set("Connection", "close")
	}
	s.w.WriteHeader(code)
	if eos {
		s.done = true
	} else if fl, ok := s.w.(http.Flusher); ok {
		fl.Flush()
	}
}

func (s *stream) writeData(chunk []byte, eos bool) {
	if !s.wroteHeaders {
		s.writeHeaders(false)
	}
	if len(chunk) > 0 {
		if _, err := s.w.Write(chunk); err != nil {
			s.details = "downstream_remote_disconnect"
			s.abort()
			return
		}
		if fl, ok := s.w.(http.Flusher); ok {
			fl.Flush()
		}
	}
	if eos {
		s.done = true
	}
}

// localReply is Envoy's sendLocalReply: the reply goes through the encoder
// side of every filter that has a context, and ends the stream. Once the
// response has started, the stream is reset instead.
func (s *stream) localReply(code int, body []byte, extra []Pair, details string) {
	if s.done {
		return
	}
	if s.wroteHeaders {
		s.details = details
		s.abort()
		return
	}
	if s.localReplied {
		return
	}
	s.localReplied = true
	s.details = details
	s.stopUpstream()
	hm := &headerMap{}
	hm.add(":status", strconv.Itoa(code))
	if len(body) > 0 {
		hm.add("content-length", strconv.Itoa(len(body)))
		hm.add("content-type", "text/plain")
	}
	for _, p := range extra {
		hm.add(p.Key, p.Value)
	}
	s.respHeaders = hm
	if s.enc.started {
		// The upstream response is inside the encoder filters but not yet
		// sent: Envoy replaces it directly, without running the filters
		// again.
		s.writeHeaders(len(body) == 0)
		if len(body) > 0 {
			s.respBodySize = int64(len(body))
			s.writeData(body, true)
		}
		return
	}
	s.enc.started = true
	s.encodeHeaders(len(s.ctxs)-1, len(body) == 0)
	if len(body) > 0 && !s.done {
		s.respBodySize = int64(len(body))
		if s.enc.stopped && s.enc.at >= 0 {
			fd := &s.enc.fs[s.enc.at]
			fd.pending, fd.pendingEOS = append(fd.pending, body...), true
			return
		}
		s.encodeData(len(s.ctxs)-1, body, true)
	}
}

func (s *stream) abort() {
	if s.done {
		return
	}
	s.stopUpstream()
	s.done = true
	s.aborted = true
}

func (s *stream) stopUpstream() {
	if s.upCancel != nil {
		s.upCancel()
		s.upCancel = nil
	}
	if s.upBody != nil {
		s.upBody.CloseWithError(errors.New("stream ended"))
	}
	s.upGen++
	if s.routeTimer != nil {
		s.routeTimer.Stop()
		s.routeTimer = nil
	}
}

// complete ends the stream for the filters: on_log for each context (with
// the stream's final header maps readable), then on_done and on_delete.
func (s *stream) complete() {
	s.stopUpstreamQuietly()
	if s.v == nil {
		return
	}
	v := s.v
	for _, c := range s.ctxs {
		if !c.created || v.failed.Load() {
			continue
		}
		c.reqHeaders, c.respHeaders, c.reqBody, c.respBody = nil, nil, nil, nil
		c.accessLog = true
		v.call(c, "proxy_on_log", v.fn.onLog, uint64(c.id))
		c.accessLog = false
	}
	for _, c := range s.ctxs {
		if !c.created {
			continue
		}
		if !v.failed.Load() {
			v.call(c, "proxy_on_done", v.fn.onDone, uint64(c.id))
			v.call(c, "proxy_on_delete", v.fn.onDelete, uint64(c.id))
		}
		v.mu.Lock()
		delete(v.contexts, c.id)
		v.mu.Unlock()
	}
}

func (s *stream) stopUpstreamQuietly() {
	if s.upCancel != nil && s.done && !s.aborted {
		// Response complete: let the connection return to the pool.
		s.upCancel = nil
	}
	if s.routeTimer != nil {
		s.routeTimer.Stop()
	}
}

// Header conversion.

var hopByHop = map[string]bool{"connection": true, "keep-alive": true, "proxy-connection": true,
	"transfer-encoding": true, "upgrade": true, "te": true, "trailer": true}

// requestHeaderMap builds the request header map a filter sees in Envoy for
// an HTTP/1.1 request: pseudo-headers first, then the headers lower-cased
// (sorted, since Go does not keep their order), plus x-forwarded-proto and
// a generated x-request-id when the client sent none.
func requestHeaderMap(r *http.Request) *headerMap {
	hm := &headerMap{pairs: make([]Pair, 0, len(r.Header)+6)}
	host := r.Host
	hm.add(":authority", host)
	hm.add(":path", r.URL.RequestURI())
	hm.add(":method", r.Method)
	hm.add(":scheme", "http")
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		lk := strings.ToLower(k)
		if hopByHop[lk] || lk == "host" {
			continue
		}
		for _, val := range r.Header[k] {
			hm.add(lk, val)
		}
	}
	if r.ContentLength > 0 && len(r.Header.Values("Content-Length")) == 0 {
		hm.add("content-length", strconv.FormatInt(r.ContentLength, 10))
	}
	if r.ContentLength < 0 {
		hm.add("transfer-encoding", "chunked")
	}
	hm.replace("x-forwarded-proto", "http")
	if _, ok := hm.get("x-request-id"); !ok {
		hm.add("x-request-id", newUUID())
	}
	return hm
}

func responseHeaderMap(resp *http.Response, elapsed time.Duration) *headerMap {
	hm := &headerMap{pairs: make([]Pair, 0, len(resp.Header)+3)}
	hm.add(":status", strconv.Itoa(resp.StatusCode))
	keys := make([]string, 0, len(resp.Header))
	for k := range resp.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		lk := strings.ToLower(k)
		if hopByHop[lk] {
			continue
		}
		for _, val := range resp.Header[k] {
			hm.add(lk, val)
		}
	}
	if resp.ContentLength >= 0 && len(resp.Header.Values("Content-Length")) == 0 {
		hm.add("content-length", strconv.FormatInt(resp.ContentLength, 10))
	}
	hm.add("x-envoy-upstream-service-time", strconv.FormatInt(elapsed.Milliseconds(), 10))
	return hm
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
