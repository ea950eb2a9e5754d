package snapshot

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestDecodeSnapshot(t *testing.T) {
	st, err := Decode([]byte(`{"version":1,"timestampMs":5,"source":"svc","hosts":[{"address":"10.0.0.1:8000","role":"prefill","model":"m","adapters":["a"],"healthy":false,"waiting":3,"running":2,"kvUsage":0.5,"blockSize":16,"numGpuBlocks":1000}]}`))
	if err != nil {
		t.Fatal(err)
	}
	h := st.Hosts[0]
	if st.TimestampMs != 5 || h.Role != "prefill" || h.Healthy || h.Waiting != 3 || h.Running != 2 || h.KVUsage != 0.5 || h.NumGPUBlocks != 1000 || len(h.Adapters) != 1 {
		t.Errorf("decoded %+v", st)
	}
	for body, want := range map[string]string{
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"},{"address":"a:1"}]}`:                                                          "appears twice",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","kvUsage":2}]}`:                                                                "hosts[0].kvUsage",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","waiting":-1}]}`:                                                               "hosts[0].waiting",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","role":"leader"}]}`:                                                            "hosts[0].role",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","healthy":"yes"}]}`:                                                            "hosts[0].healthy",
		`{"version":1,"timestampMs":-5,"hosts":[{"address":"a:1"}]}`:                                                                           "timestampMs",
		`{"version":1,"timestampMs":5,"hosts":{}}`:                                                                                             "hosts: must be an array",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","adapters":[1]}]}`:                                                             "hosts[0].adapters",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a"}]}`:                                                                              "hosts[0].address",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"gateways":{}}`:                                                              "gateways: must be an array",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"gateways":[{"gateway":""}]}`:                                                "gateways[0].gateway",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"gateways":[{"gateway":"g","routes":[{"address":"a:1","chain":"AQID"}]}]}`:   "gateways[0].routes[0]",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"gateways":[{"gateway":"g","load":[{"address":"a:1","inFlight":-1}]}]}`:      "gateways[0].load[0]",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":{}}`:                                                              "removals: must be an array",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a:1","from":0,"chain":"AQID"}]}`:                     "removals[0]",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a:1","from":2,"chain":"AQAAAAAAAAACAAAAAAAAAA=="}]}`: "removals[0]",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a:1","chain":"AQAAAAAAAAACAAAAAAAAAA=="}]}`:          "removals[0]",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a","from":0,"chain":"AQAAAAAAAAA="}]}`:               "removals[0]",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a:1","from":-1,"chain":"AQAAAAAAAAA="}]}`:            "removals[0]",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a:1","from":0.5,"chain":"AQAAAAAAAAA="}]}`:           "removals[0]",
		`{"version":2,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a:1","from":0,"chain":"AQAAAAAAAAA="}]}`:             "version",
		`not json`: "not valid JSON",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","dataParallelSize":2,"rank":2}]}`:                                                 "hosts[0].rank: 2 is not a rank of the endpoint's 2 data-parallel ranks (0 to 1",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","rank":1}]}`:                                                                      "hosts[0].rank: 1 is not a rank of the endpoint's 1",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","dataParallelSize":0}]}`:                                                          "hosts[0].dataParallelSize",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","dataParallelSize":2,"rank":-1}]}`:                                                "hosts[0].rank",
		`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","dataParallelSize":2,"rank":1},{"address":"a:1","dataParallelSize":2,"rank":1}]}`: "appears twice",
	} {
		if _, err := Decode([]byte(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", body, err, want)
		}
	}
}

// Each rank of a data-parallel endpoint is a host entry of its own.
func TestDecodeSnapshotRanks(t *testing.T) {
	// Another gateway's routes name a rank as host:port|rank.
	if _, err := Decode([]byte(`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"gateways":[{"gateway":"g","timestampMs":5,"routes":[{"address":"a:1|1","from":0,"chain":"AQAAAAAAAAA="}]}]}`)); err != nil {
		t.Errorf("a route to a rank: %v", err)
	}
	if _, err := Decode([]byte(`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"gateways":[{"gateway":"g","timestampMs":5,"routes":[{"address":"a:1|x","from":0,"chain":"AQAAAAAAAAA="}]}]}`)); err == nil {
		t.Errorf("a route to rank x accepted")
	}
	st, err := Decode([]byte(`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","dataParallelSize":2,"rank":0,"waiting":4},{"address":"a:1","dataParallelSize":2,"rank":1,"waiting":0}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Hosts) != 2 || st.Hosts[1].Rank != 1 || st.Hosts[1].DataParallelSize != 2 || st.Hosts[0].Waiting != 4 {
		t.Errorf("decoded %+v", st.Hosts)
	}
}

// A valid removal decodes as sent; a snapshot without one has none.
func TestDecodeRemovals(t *testing.T) {
	st, err := Decode([]byte(`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":[{"address":"a:1","from":1,"chain":"AQAAAAAAAAACAAAAAAAAAA=="}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Removals) != 1 || !reflect.DeepEqual(st.Removals[0], Removal{Address: "a:1", From: 1, Chain: "AQAAAAAAAAACAAAAAAAAAA==", Hashes: []uint64{1, 2}}) {
		t.Fatalf("removals %+v", st.Removals)
	}
	if st, err := Decode([]byte(`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"removals":null}`)); err != nil || st.Removals != nil {
		t.Fatalf("null removals: %+v %v", st.Removals, err)
	}
}

// Decode hands each chain on decoded (Hashes), so the gateway that applies
// a push decodes nothing again. The chains share one array: each chain's
// hashes are capped at their length, so an append to one never writes
// into the next.
func TestDecodeHandsOnDecodedChains(t *testing.T) {
	st, err := Decode([]byte(`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],` +
		`"gateways":[{"gateway":"g","timestampMs":5,"routes":[{"address":"a:1","chain":"AQAAAAAAAAACAAAAAAAAAAMAAAAAAAAA"},{"address":"a:1","from":4,"chain":"BQAAAAAAAAA="},{"address":"a:1","chain":""}]}],` +
		`"removals":[{"address":"a:1","from":0,"chain":"BAAAAAAAAAA="}]}`))
	if err != nil {
		t.Fatal(err)
	}
	rs := st.Gateways[0].Routes
	for i, want := range [][]uint64{{1, 2, 3}, {5}, {}} {
		if !slices.Equal(rs[i].Hashes, want) {
			t.Errorf("routes[%d].Hashes = %v, want %v", i, rs[i].Hashes, want)
		}
	}
	if rm := st.Removals[0].Hashes; !slices.Equal(rm, []uint64{4}) {
		t.Errorf("removals[0].Hashes = %v, want [4]", rm)
	}
	for i, r := range rs {
		if cap(r.Hashes) != len(r.Hashes) {
			t.Errorf("routes[%d].Hashes has room past its hashes (len %d, cap %d): an append would write into the next chain's", i, len(r.Hashes), cap(r.Hashes))
		}
	}
}

func FuzzDecodeSnapshot(f *testing.F) {
	f.Add([]byte(`{"version":1,"timestampMs":1,"hosts":[{"address":"10.0.0.1:8000","healthy":true,"waiting":0,"running":1,"kvUsage":0.2},{"address":"10.0.0.2:8000","healthy":true,"waiting":0,"running":1,"kvUsage":0.2}]}`))
	f.Add([]byte(`{"version":1,"timestampMs":1,"hosts":[{"address":"[::1]:1","kvUsage":1}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		st, err := Decode(body)
		if err != nil {
			return
		}
		if len(st.Hosts) == 0 || st.TimestampMs <= 0 {
			t.Fatalf("accepted %+v", st)
		}
		for _, h := range st.Hosts {
			if CheckAddress(h.Address) != nil || h.KVUsage < 0 || h.KVUsage > 1 {
				t.Fatalf("accepted host %+v", h)
			}
		}
	})
}

// Decode's error names the field apart from the problem, and its text is
// the push's 400 message as the state endpoint has always written it.
func TestDecodeErrorNamesThePath(t *testing.T) {
	for _, c := range []struct{ body, path, text string }{
		{``, "", "empty body: POST a kvroute state snapshot (JSON)"},
		{`[1]`, "", "the body must be a JSON object"},
		{`{"version":1,"timestampMs":5,"hosts":[]}`, "hosts", "hosts: must not be empty (a push replaces the candidate set; an empty one would leave nothing to route to)"},
		{`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"},{"address":"b"}]}`, "hosts[1].address", `hosts[1].address: "b" is not host:port (missing port)`},
		{`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1","numGpuBlocks":1.5}]}`, "hosts[0].numGpuBlocks", "hosts[0].numGpuBlocks: must be a whole number >= 0"},
		{`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"gateways":[{"gateway":"g"},{"gateway":"h","load":[{"address":"a:1"},{"inFlight":1}]}]}`, "gateways[1].load[0]", "gateways[1].load[0]: needs an address and whole counts >= 0"},
		{`{"version":1,"timestampMs":5,"hosts":[{"address":"a:1"}],"cursor":"a b"}`, "cursor", "cursor: must be a string of at most 64 characters of [0-9A-Za-z._-]"},
	} {
		_, err := Decode([]byte(c.body))
		var e *Error
		if !errors.As(err, &e) || e.Path != c.path || err.Error() != c.text {
			t.Errorf("Decode(%s): %#v (%v), want path %q and text %q", c.body, err, err, c.path, c.text)
		}
	}
}
