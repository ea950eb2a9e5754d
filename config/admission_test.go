package config

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/admission"
)

func TestAdmissionConfig(t *testing.T) {
	c, err := Parse([]byte(`{}`))
	if err != nil || c.Admission.Enabled {
		t.Fatalf("admission is off without the key: %+v %v", c.Admission, err)
	}
	c, err = Parse([]byte(`{"admission":{"maxHeld":10,"tickMs":5,"retryAfterS":2,"defaultClass":"batch",
		"pathClasses":{"/v1/embeddings":"3"},"modelClasses":{"m":"interactive"},
		"deadlineMs":{"interactive":500},"maxWaiting":0,"maxKvUsage":0.5,"maxPendingPrefillTokens":100}}`))
	if err != nil {
		t.Fatal(err)
	}
	a := c.Admission
	want := admission.Defaults()
	want.Enabled, want.MaxHeld, want.TickMs, want.RetryAfterS, want.DefaultClass = true, 10, 5, 2, admission.Batch
	want.DeadlineMs[2] = 500
	want.Thresholds = admission.Thresholds{MaxKVUsage: 0.5, MaxPendingPrefillTokens: 100}
	if a.MaxHeld != want.MaxHeld || a.TickMs != want.TickMs || a.RetryAfterS != want.RetryAfterS || a.DefaultClass != want.DefaultClass ||
		a.DeadlineMs != want.DeadlineMs || a.Thresholds != want.Thresholds || a.PathClasses["/v1/embeddings"] != 3 || a.ModelClasses["m"] != admission.Interactive || !a.Enabled {
		t.Fatalf("parsed %+v", a)
	}
	if c, err := Parse([]byte(`{"admission":{"enabled":false}}`)); err != nil || c.Admission.Enabled {
		t.Fatalf("enabled:false: %+v %v", c.Admission, err)
	}
	for doc, wantErr := range map[string]string{
		`{"admission":true}`:                                                        "admission: must be an object",
		`{"admission":{"tickMs":0}}`:                                                "admission.tickMs: must be between 1 and 1000",
		`{"admission":{"defaultClass":"urgent"}}`:                                   "admission.defaultClass: priority \"urgent\"",
		`{"admission":{"modelClasses":{"m":12}}}`:                                   "admission.modelClasses.m: priority \"12\"",
		`{"admission":{"deadlineMs":{"urgent":5}}}`:                                 "admission.deadlineMs.urgent: unknown key",
		`{"admission":{"maxKvUsage":1.5}}`:                                          "admission.maxKvUsage: must be a number from 0",
		`{"admission":{"maxWaiting":0,"maxKvUsage":0,"maxPendingPrefillTokens":0}}`: "admission: thresholds: set at least one",
		`{"admission":{"maxHeld":-1}}`:                                              "admission.maxHeld: must be between 0",
		`{"admission":{"burst":1}}`:                                                 "admission.burst: unknown key",
	} {
		_, err := Parse([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: error %v, want %q", doc, err, wantErr)
		}
	}
}
