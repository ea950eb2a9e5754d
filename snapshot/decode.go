package snapshot

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"

	"github.com/tidwall/gjson"
)

// The gateway's reader of the contract: Decode validates a snapshot over
// gjson (no reflection-based decoder in the Wasm module) and returns what
// the gateway applies. It keeps no state: the caller (the state endpoint,
// the pull) owns the State it returns.

// Error is what Decode refuses: Path names the field ("hosts[2].kvUsage",
// "gateways[0].routes[3]"; empty for the body as a whole) and Msg what is
// wrong with it. Its text, "path: msg", is the 400 a push gets and what a
// pull logs.
//
// It has config.Error's shape and text but is a type of its own: config
// imports this package (the role names, the address syntax), so this one
// cannot import config; and the two speak to different people (an
// operator's plugin configuration, where every problem is listed, and a
// service's push, refused at its first).
type Error struct {
	Path string
	Msg  string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// fail is an *Error at path.
func fail(path, format string, args ...any) *Error {
	return &Error{Path: path, Msg: fmt.Sprintf(format, args...)}
}

// Decode validates an encoded snapshot, as a gateway's state endpoint
// receives it (a push) or its pull reads it, and returns it with Version
// checked and every chain decoded into its Hashes; Source, a report's Seq
// and a route's CharsPerToken, which no gateway reads, are left out. The
// error is an *Error, whose text is the push's 400 message.
func Decode(body []byte) (State, error) {
	var st State
	if len(body) == 0 {
		return st, &Error{Msg: "empty body: POST a kvroute state snapshot (JSON)"}
	}
	if !gjson.ValidBytes(body) {
		return st, &Error{Msg: "the body is not valid JSON"}
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return st, &Error{Msg: "the body must be a JSON object"}
	}
	if v := root.Get("version"); v.Type != gjson.Number || v.Int() != Version {
		return st, fail("version", "must be %d (this gateway reads snapshot format %d)", Version, Version)
	}
	ts, ok := unixMs(root.Get("timestampMs"))
	if !ok || ts <= 0 {
		return st, &Error{Path: "timestampMs", Msg: "must be a positive whole Unix time in milliseconds"}
	}
	st.Version, st.TimestampMs = Version, ts
	hosts := root.Get("hosts")
	if !hosts.IsArray() {
		return st, &Error{Path: "hosts", Msg: "must be an array"}
	}
	seen := map[string]bool{}
	var err error
	var chains chainDecoder
	i := 0
	hosts.ForEach(func(_, h gjson.Result) bool {
		var host Host
		host, err = decodeHost(h, i)
		loc := Location(host.Address, host.Rank, host.DataParallelSize)
		if err == nil && seen[loc] {
			err = hostAt(i).fail(".address", "%q appears twice", loc)
		}
		if err != nil {
			return false
		}
		seen[loc] = true
		st.Hosts = append(st.Hosts, host)
		i++
		return true
	})
	if err != nil {
		return State{}, err
	}
	if len(st.Hosts) == 0 {
		return State{}, &Error{Path: "hosts", Msg: "must not be empty (a push replaces the candidate set; an empty one would leave nothing to route to)"}
	}
	if g := root.Get("gateways"); g.Exists() && g.Type != gjson.Null {
		if st.Gateways, err = decodeGateways(g, &chains); err != nil {
			return State{}, err
		}
	}
	if c := root.Get("cursor"); c.Exists() {
		if !validCursor(c) {
			return State{}, &Error{Path: "cursor", Msg: "must be a string of at most 64 characters of [0-9A-Za-z._-]"}
		}
		st.Cursor = c.Str
	}
	if r := root.Get("removals"); r.Exists() && r.Type != gjson.Null {
		if st.Removals, err = decodeRemovals(r, &chains); err != nil {
			return State{}, err
		}
	}
	return st, nil
}

// validCursor accepts a pull cursor (State.Cursor): it goes into
// the next pull's query string as it is.
func validCursor(c gjson.Result) bool {
	if c.Type != gjson.String || len(c.Str) > 64 {
		return false
	}
	for i := 0; i < len(c.Str); i++ {
		switch b := c.Str[i]; {
		case b >= '0' && b <= '9', b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b == '.', b == '_', b == '-':
		default:
			return false
		}
	}
	return true
}

// maxRemovalBlocks bounds one removal's chain (a prompt of a few million
// characters under the default block layout).
const maxRemovalBlocks = 1 << 16

// decodeRemovals validates a push's removals (Removal): a host
// location (host:port, or host:port|rank for a data-parallel rank), a
// base64 chain of 8-byte hashes and a from inside it.
func decodeRemovals(r gjson.Result, chains *chainDecoder) ([]Removal, error) {
	if !r.IsArray() {
		return nil, &Error{Path: "removals", Msg: "must be an array"}
	}
	var out []Removal
	var err error
	r.ForEach(func(_, x gjson.Result) bool {
		addr, chain := x.Get("address"), x.Get("chain")
		from, ok := WholeNumber(x.Get("from"))
		var hashes []uint64
		blocks := -1
		if chain.Type == gjson.String {
			if h, ok := chains.decode(chain.Str); ok {
				hashes, blocks = h, len(h)
			}
		}
		if !x.IsObject() || addr.Type != gjson.String || checkLocation(addr.Str) != nil ||
			blocks <= 0 || blocks > maxRemovalBlocks || !ok || from < 0 || from >= int64(blocks) {
			err = fail("removals["+strconv.Itoa(len(out))+"]", "needs a host:port address, a base64 chain of 1 to %d 8-byte hashes and a from inside it", maxRemovalBlocks)
			return false
		}
		out = append(out, Removal{Address: addr.Str, From: int(from), Chain: chain.Str, Hashes: hashes})
		return true
	})
	return out, err
}

// chainDecoder decodes the chains of one snapshot, once: Decode checks a
// chain by decoding it and hands the hashes on (Route.Hashes,
// Removal.Hashes) to the gateway that applies them. The base64 goes
// through one scratch buffer and the hashes into arrays the chains share,
// each twice the last, so a push of many routes costs a few allocations,
// not two or three per chain.
type chainDecoder struct {
	raw    []byte
	hashes []uint64
}

// decode returns the hashes of a base64 (std, padded) chain of 8-byte
// little-endian hashes, ok false when s is not one. The padded length
// alone does not say: 16 bytes encode to 24 characters, which DecodedLen
// puts at 18. The slice returned is capped at its length, so a later
// chain's hashes never land in it.
func (d *chainDecoder) decode(s string) (hashes []uint64, ok bool) {
	raw, err := base64.StdEncoding.AppendDecode(d.raw[:0], []byte(s))
	d.raw = raw
	if err != nil || len(raw)%8 != 0 {
		return nil, false
	}
	if n := len(raw) / 8; cap(d.hashes)-len(d.hashes) < n {
		// A new array, twice the last: the chains in the full one keep
		// it, and nothing is copied.
		d.hashes = make([]uint64, 0, max(n, 2*cap(d.hashes), 256))
	}
	start := len(d.hashes)
	for j := 0; j < len(raw); j += 8 {
		d.hashes = append(d.hashes, binary.LittleEndian.Uint64(raw[j:]))
	}
	return d.hashes[start:len(d.hashes):len(d.hashes)], true
}

// decodeGateways validates a push's gateway reports (GatewayReport).
func decodeGateways(g gjson.Result, chains *chainDecoder) ([]GatewayReport, error) {
	if !g.IsArray() {
		return nil, &Error{Path: "gateways", Msg: "must be an array"}
	}
	var out []GatewayReport
	var err error
	g.ForEach(func(_, r gjson.Result) bool {
		at := "gateways[" + strconv.Itoa(len(out)) + "]"
		var rep GatewayReport
		id := r.Get("gateway")
		if id.Type != gjson.String || id.Str == "" || len(id.Str) > 64 {
			err = fail(at+".gateway", "must be an id of 1 to 64 characters")
			return false
		}
		rep.Gateway = id.Str
		rep.TimestampMs, _ = unixMs(r.Get("timestampMs"))
		r.Get("routes").ForEach(func(_, rt gjson.Result) bool {
			addr, chain, from := rt.Get("address"), rt.Get("chain"), rt.Get("from")
			n, ok := WholeNumber(from)
			if !from.Exists() {
				n, ok = 0, true
			}
			var hashes []uint64
			chainOK := false
			if chain.Type == gjson.String {
				hashes, chainOK = chains.decode(chain.Str)
			}
			if addr.Type != gjson.String || checkLocation(addr.Str) != nil || !chainOK || !ok || n < 0 || n > 1<<20 {
				err = fail(at+".routes["+strconv.Itoa(len(rep.Routes))+"]", "needs a host:port address, a from >= 0 and a base64 chain of 8-byte hashes")
				return false
			}
			pt, _ := WholeNumber(rt.Get("promptTokens"))
			rep.Routes = append(rep.Routes, Route{Address: addr.Str, From: int(n), Chain: chain.Str, Hashes: hashes, PromptTokens: int(max(min(pt, 1<<30), 0))})
			return true
		})
		if err != nil {
			return false
		}
		if l := r.Get("load"); l.Exists() {
			rep.Load = []HostLoad{}
			l.ForEach(func(_, x gjson.Result) bool {
				addr := x.Get("address")
				in, ok1 := WholeNumber(x.Get("inFlight"))
				pf, ok2 := WholeNumber(x.Get("prefillTokens"))
				dc, ok3 := WholeNumber(x.Get("decodeTokens"))
				if addr.Type != gjson.String || !ok1 || !ok2 || !ok3 || in < 0 || pf < 0 || dc < 0 || in > 1<<31 {
					err = fail(at+".load["+strconv.Itoa(len(rep.Load))+"]", "needs an address and whole counts >= 0")
					return false
				}
				rep.Load = append(rep.Load, HostLoad{Address: addr.Str, InFlight: int(in), PrefillTokens: pf, DecodeTokens: dc})
				return true
			})
		}
		out = append(out, rep)
		return err == nil
	})
	return out, err
}

func decodeHost(h gjson.Result, i int) (Host, error) {
	at := hostAt(i)
	var host Host
	if !h.IsObject() {
		return host, at.fail("", "must be an object")
	}
	var m objectMembers
	m.read(h)
	addr := m.get("address")
	if addr.Type != gjson.String {
		return host, at.fail(".address", "must be a host:port string")
	}
	if err := CheckAddress(addr.Str); err != nil {
		return host, at.fail(".address", "%v", err)
	}
	host.Address = addr.Str
	role, err := CheckRole(m.get("role").Str)
	if err != nil {
		return host, at.fail(".role", "%v", err)
	}
	host.Role = role
	if m := m.get("model"); m.Exists() {
		if m.Type != gjson.String {
			return host, at.fail(".model", "must be a string")
		}
		host.Model = m.Str
	}
	if a := m.get("adapters"); a.Exists() && a.Type != gjson.Null {
		if !a.IsArray() {
			return host, at.fail(".adapters", "must be an array of strings")
		}
		for _, x := range a.Array() {
			if x.Type != gjson.String {
				return host, at.fail(".adapters", "must be an array of strings")
			}
			host.Adapters = append(host.Adapters, x.Str)
		}
	}
	healthy := m.get("healthy")
	if healthy.Exists() && healthy.Type != gjson.True && healthy.Type != gjson.False {
		return host, at.fail(".healthy", "must be a boolean")
	}
	host.Healthy = !healthy.Exists() || healthy.Bool()
	if v := m.get("preciseCacheState"); v.Exists() {
		if v.Type != gjson.True && v.Type != gjson.False {
			return host, at.fail(".preciseCacheState", "must be a boolean")
		}
		host.PreciseCacheState = v.Type == gjson.True
	}
	ints := []struct {
		name string
		dst  *int
	}{{"waiting", &host.Waiting}, {"running", &host.Running}, {"blockSize", &host.BlockSize}, {"numGpuBlocks", &host.NumGPUBlocks}, {"cachedBlocks", &host.CachedBlocks},
		{"maxAdapters", &host.MaxAdapters}, {"adapterSlotsUsed", &host.AdapterSlotsUsed}}
	for _, f := range ints {
		v := m.get(f.name)
		if !v.Exists() {
			continue
		}
		n, ok := WholeNumber(v)
		if !ok || n < 0 || n > 1<<40 {
			return host, at.fail("."+f.name, "must be a whole number >= 0")
		}
		*f.dst = int(n)
	}
	if err := decodeRank(&m, &host, at); err != nil {
		return host, err
	}
	if v := m.get("kvUsage"); v.Exists() {
		if v.Type != gjson.Number || v.Num < 0 || v.Num > 1 {
			return host, at.fail(".kvUsage", "must be a number from 0 to 1")
		}
		host.KVUsage = v.Num
	}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"clearedAtMs", &host.ClearedAtMs}, {"scrapedAtMs", &host.ScrapedAtMs}} {
		if v := m.get(f.name); v.Exists() {
			ms, ok := unixMs(v)
			if !ok || ms < 0 {
				return host, at.fail("."+f.name, "must be a whole Unix time in milliseconds")
			}
			*f.dst = ms
		}
	}
	return host, nil
}

// checkLocation accepts a cache location as gateways report it: host:port,
// or host:port|rank for a data-parallel endpoint's rank (Location). A rank
// has at most two digits (MaxDataParallelSize): a '|' further back is part
// of the address, which then fails.
func checkLocation(s string) error {
	addr, rank := s, ""
	for i := len(s) - 1; i >= 0 && i >= len(s)-3; i-- {
		if s[i] == '|' {
			addr, rank = s[:i], s[i+1:]
			break
		}
	}
	for i := 0; i < len(rank); i++ {
		if rank[i] < '0' || rank[i] > '9' {
			return fmt.Errorf("%q: the rank after | must be a number", s)
		}
	}
	return CheckAddress(addr)
}

// decodeRank reads a host's dataParallelSize and rank: a rank names one of
// the endpoint's ranks, so it needs a size above 1 and lies below it.
func decodeRank(m *objectMembers, host *Host, at hostAt) error {
	if v := m.get("dataParallelSize"); v.Exists() {
		n, ok := WholeNumber(v)
		if !ok || n < 1 || n > MaxDataParallelSize {
			return at.fail(".dataParallelSize", "must be a whole number from 1 to %d", MaxDataParallelSize)
		}
		host.DataParallelSize = int(n)
	}
	v := m.get("rank")
	if !v.Exists() {
		return nil
	}
	n, ok := WholeNumber(v)
	if !ok || n < 0 || n >= int64(max(host.DataParallelSize, 1)) {
		return at.fail(".rank", "%s is not a rank of the endpoint's %d data-parallel ranks (0 to %d; set dataParallelSize)",
			v.Raw, max(host.DataParallelSize, 1), max(host.DataParallelSize, 1)-1)
	}
	host.Rank = int(n)
	return nil
}

// hostAt names hosts[i] in an error, formatted only when there is one.
type hostAt int

func (i hostAt) String() string { return "hosts[" + strconv.Itoa(int(i)) + "]" }

// fail is an *Error at hosts[i] and field (".address"; "" for the host
// itself): the path is built in one place, not at each refusal.
func (i hostAt) fail(field, format string, args ...any) *Error {
	return fail(i.String()+field, format, args...)
}

// objectMembers holds an object's members as read in one pass: a push carries
// about ten fields per host, and gjson's Get scans the object again for
// each, which made decoding a 1,000-host push several times slower.
type objectMembers struct {
	obj   gjson.Result
	n     int
	over  bool // more members than fit: get falls back to Get
	names [16]string
	vals  [16]gjson.Result
}

func (m *objectMembers) read(obj gjson.Result) {
	m.obj = obj
	obj.ForEach(func(k, v gjson.Result) bool {
		if m.n == len(m.names) {
			m.over = true
			return false
		}
		m.names[m.n], m.vals[m.n] = k.Str, v
		m.n++
		return true
	})
}

// get is Get on the object: the first member named name.
func (m *objectMembers) get(name string) gjson.Result {
	for i := 0; i < m.n; i++ {
		if m.names[i] == name {
			return m.vals[i]
		}
	}
	if m.over {
		return m.obj.Get(name)
	}
	return gjson.Result{}
}

// maxUnixMs bounds the timestamps a push may carry: 2^53 ms (year
// 287,396), the largest integer a JSON number holds exactly. Without a
// bound, 1e400 would read as the largest int64 and never go stale.
const maxUnixMs = 1 << 53

// unixMs reads a Unix time in milliseconds: a JSON number that is whole
// and at most maxUnixMs (1.5 and 1e400 are refused, 1e12 is not).
func unixMs(v gjson.Result) (int64, bool) {
	// Bounded first (NaN fails the test too): a float beyond int64
	// converts to an implementation-defined integer.
	if v.Type != gjson.Number || !(math.Abs(v.Num) <= maxUnixMs) {
		return 0, false
	}
	return WholeNumber(v)
}

// TimestampOf reads the timestampMs of an encoded snapshot that Decode
// accepted, without decoding the rest: the gateway compares a push with the
// state in force by it.
func TimestampOf(body []byte) (int64, bool) {
	return unixMs(gjson.GetBytes(body, "timestampMs"))
}
