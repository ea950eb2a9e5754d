package dispatch

import (
	"encoding/binary"
	"errors"
	"math"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scorer"
)

// ttftModels learns, for each host, how long its first token takes as a
// function of the work the predicted_ttft scorer prices (pending prompt
// tokens plus the request's uncached tokens): TTFT = base + perToken x
// work, fitted by exponentially weighted least squares over the host's
// recent responses. perToken is the inverse of the host's prefill rate as
// the gateway sees it; base is the queueing and fixed delay the gateway's
// own accounting does not explain (other gateways' traffic, decode steps
// sharing the batch, the engine's scheduling).
//
// Scope: one gateway. With Config.Shared the records live in the gateway's
// shared data under one key, so every worker learns from every response
// and scores with the same models; without it, per Dispatcher. Other gateways
// learn their own from their own traffic: a gateway's samples describe the
// hosts as well as anyone's, so nothing is merged. A record carries its
// slot's generation: a slot given to another host starts afresh.
type ttftModels struct {
	st    index.Store // nil: local
	get   index.AppendGetter
	local []byte // the records when st is nil
	buf   []byte
	// Contended counts samples dropped after the retries.
	Contended uint64
}

const (
	ttftKey = "kvroute/ttft"
	// ttftRecordBytes: generation (4), then weight, Σw, Σt, Σw², Σwt as
	// float64 (40).
	ttftRecordBytes = 44
	// ttftDecay weighs each older sample down: about the last 20 responses
	// of a host make its model, so it follows a host that slows down
	// within seconds at production rates.
	ttftDecay = 0.95
	// ttftMinWeight is the sample weight (about 3 responses) before a
	// host's model is used.
	ttftMinWeight = 2.8
	// ttftMaxSlots bounds the table (and a corrupt slot number).
	ttftMaxSlots = 1 << 14
)

func newTTFTModels(st index.Store) *ttftModels {
	m := &ttftModels{st: st}
	if st != nil {
		m.get = appendGetter(st)
	}
	return m
}

// ttftRecord is one host's sums.
type ttftRecord struct {
	gen                 uint32
	n, sw, st, sww, swt float64
}

func readRecord(b []byte, slot int) (r ttftRecord) {
	off := slot * ttftRecordBytes
	if slot < 0 || off+ttftRecordBytes > len(b) {
		return r
	}
	b = b[off:]
	r.gen = binary.LittleEndian.Uint32(b)
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b[4+8*i:])) }
	r.n, r.sw, r.st, r.sww, r.swt = f(0), f(1), f(2), f(3), f(4)
	return r
}

func writeRecord(b []byte, slot int, r ttftRecord) {
	b = b[slot*ttftRecordBytes:]
	binary.LittleEndian.PutUint32(b, r.gen)
	for i, v := range [5]float64{r.n, r.sw, r.st, r.sww, r.swt} {
		binary.LittleEndian.PutUint64(b[4+8*i:], math.Float64bits(v))
	}
}

// add takes one sample: work in tokens, ttft in milliseconds.
func (r *ttftRecord) add(work, ttft float64) {
	r.n = ttftDecay*r.n + 1
	r.sw = ttftDecay*r.sw + work
	r.st = ttftDecay*r.st + ttft
	r.sww = ttftDecay*r.sww + work*work
	r.swt = ttftDecay*r.swt + work*ttft
}

// model returns the host's base (ms) and milliseconds per token; ok is
// false until it has enough samples. The slope is fitted when the samples'
// work varies (coefficient of variation above 0.1) and comes out positive
// with a non-negative base; otherwise the model is a rate through the
// origin, mean TTFT over mean work.
func (r *ttftRecord) model() (base, perToken float64, ok bool) {
	if r.n < ttftMinWeight || r.sw <= 0 || r.st <= 0 {
		return 0, 0, false
	}
	mw, mt := r.sw/r.n, r.st/r.n
	perToken = mt / mw
	if v := r.sww/r.n - mw*mw; v > 0.01*mw*mw {
		b := (r.swt/r.n - mw*mt) / v
		if a := mt - b*mw; b > 0 && a >= 0 {
			base, perToken = a, b
		}
	}
	return base, perToken, true
}

// table returns the current records: the shared value (read fresh) or
// the local ones.
func (m *ttftModels) table() []byte {
	if m.st == nil {
		return m.local
	}
	var err error
	m.buf, _, err = m.get.GetAppend(m.buf[:0], ttftKey)
	if err != nil {
		return nil
	}
	return m.buf
}

// fill sets each host's TTFTBaseMs and TTFTMsPerToken: its own model when
// it has one, else the mean of the hosts that have (zero when none has,
// and the scorer then counts tokens).
func (m *ttftModels) fill(hosts []scorer.Host) {
	tab := m.table()
	var sumBase, sumPer float64
	learned := 0
	for i := range hosts {
		h := &hosts[i]
		h.TTFTBaseMs, h.TTFTMsPerToken = 0, 0
		r := readRecord(tab, h.Slot)
		if r.gen != h.Gen || h.Slot < 0 {
			continue
		}
		if base, per, ok := r.model(); ok {
			h.TTFTBaseMs, h.TTFTMsPerToken = base, per
			sumBase += base
			sumPer += per
			learned++
		}
	}
	if learned == 0 || learned == len(hosts) {
		return
	}
	base, per := sumBase/float64(learned), sumPer/float64(learned)
	for i := range hosts {
		if h := &hosts[i]; h.TTFTMsPerToken == 0 {
			h.TTFTBaseMs, h.TTFTMsPerToken = base, per
		}
	}
}

// learn adds a sample to ref's record: work tokens took ttftMs to the
// first token.
func (m *ttftModels) learn(ref index.HostRef, work, ttftMs float64) {
	if ref.Slot < 0 || ref.Slot >= ttftMaxSlots || !(work > 0) || !(ttftMs > 0) {
		return
	}
	if m.st == nil {
		m.local = addSample(m.local, ref, work, ttftMs)
		return
	}
	for range 4 {
		val, cas, err := m.get.GetAppend(m.buf[:0], ttftKey)
		if err != nil && !errors.Is(err, index.ErrNotFound) {
			m.Contended++
			return
		}
		m.buf = addSample(val, ref, work, ttftMs)
		err = m.st.Set(ttftKey, m.buf, cas)
		if err == nil {
			return
		}
		if !errors.Is(err, index.ErrCASMismatch) {
			break
		}
	}
	m.Contended++
}

// addSample adds the sample to ref's record in tab, growing tab to hold
// it, and returns tab.
func addSample(tab []byte, ref index.HostRef, work, ttftMs float64) []byte {
	if need := (ref.Slot + 1) * ttftRecordBytes; len(tab) < need {
		tab = append(tab, make([]byte, need-len(tab))...)
	}
	r := readRecord(tab, ref.Slot)
	if r.gen != ref.Gen {
		r = ttftRecord{gen: ref.Gen}
	}
	r.add(work, ttftMs)
	writeRecord(tab, ref.Slot, r)
	return tab
}

// TTFTModels sets each host's TTFTBaseMs and TTFTMsPerToken as the next
// decision would see them, and reports whether the dispatcher learns them at
// all (a profile with predicted_ttft), for tests, tools and explanations.
func (r *Dispatcher) TTFTModels(hosts []scorer.Host) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ttft == nil {
		return false
	}
	r.ttft.fill(hosts)
	return true
}
