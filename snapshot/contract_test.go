package snapshot

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"reflect"
	"testing"
)

// fullSnapshot sets every field of the snapshot contract (package
// snapshot) to a valid value other than its zero value.
func fullSnapshot() State {
	hashes := []uint64{1, 2}
	chain := base64.StdEncoding.EncodeToString(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, hashes[0]), hashes[1]))
	return State{
		Version: Version, TimestampMs: 1_700_000_000_000, Source: "metrics-0", Cursor: "c-12.3",
		Hosts: []Host{{
			Address: "10.0.0.1:8000", Role: RoleDecode, Model: "m", Adapters: []string{"a"},
			MaxAdapters: 4, AdapterSlotsUsed: 1, Healthy: true, Waiting: 2, Running: 3, KVUsage: 0.5,
			BlockSize: 16, NumGPUBlocks: 1000, CachedBlocks: 10, ClearedAtMs: 1_699_000_000_000, PreciseCacheState: true,
			ScrapedAtMs: 1_700_000_000_000, DataParallelSize: 2, Rank: 1,
		}},
		Gateways: []GatewayReport{{
			Gateway: "gw-a", TimestampMs: 1_700_000_000_001, Seq: 7,
			Routes: []Route{{Address: "10.0.0.1:8000", From: 1, Chain: chain, Hashes: hashes, PromptTokens: 40, CharsPerToken: 3.5}},
			Load:   []HostLoad{{Address: "10.0.0.1:8000", InFlight: 1, PrefillTokens: 30, DecodeTokens: 20}},
		}},
		Removals: []Removal{{Address: "10.0.0.1:8000", From: 1, Chain: chain, Hashes: hashes}},
	}
}

// zeroFields names the fields of v (a struct, slices of structs followed)
// left at their zero value.
func zeroFields(v reflect.Value, path string) []string {
	var out []string
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			out = append(out, zeroFields(v.Field(i), path+"."+v.Type().Field(i).Name)...)
		}
	case reflect.Slice:
		if v.Len() == 0 {
			return []string{path}
		}
		for i := range v.Len() {
			out = append(out, zeroFields(v.Index(i), path)...)
		}
	default:
		if v.IsZero() {
			out = append(out, path)
		}
	}
	return out
}

// The gateway's decoder (Decode) reads the contract this package defines,
// field for field: a snapshot with every field set, as the metrics service
// marshals it with encoding/json, decodes to the same values. A field added
// to State or its parts fails here until this test sets it and, when the
// gateway must read it, Decode does.
func TestDecodeReadsEveryFieldOfTheContract(t *testing.T) {
	want := fullSnapshot()
	if zero := zeroFields(reflect.ValueOf(want), "State"); len(zero) > 0 {
		t.Fatalf("fullSnapshot leaves %v unset: set them, and read them in Decode (snapshot/decode.go) when the gateway needs them", zero)
	}
	body, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(body)
	if err != nil {
		t.Fatalf("Decode refused the service's own encoding: %v\n%s", err, body)
	}
	// The gateway does not read Source (the service's logs), a report's Seq
	// (how the service drops a retried report) nor a route's CharsPerToken
	// (for the service's bridge): only these may be missing from what it
	// decodes.
	want.Source = ""
	for i := range want.Gateways {
		want.Gateways[i].Seq = 0
		for j := range want.Gateways[i].Routes {
			want.Gateways[i].Routes[j].CharsPerToken = 0
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded as\n%+v\nwant\n%+v", got, want)
	}
	if ts, ok := TimestampOf(body); !ok || ts != want.TimestampMs {
		t.Errorf("TimestampOf = %d, %v; want %d", ts, ok, want.TimestampMs)
	}
}
