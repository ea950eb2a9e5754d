package dispatch

import (
	"reflect"
	"testing"
)

// TestStatsAddSumsEveryCounter sets each counter of one Stats to a distinct
// value and adds it twice to a zero Stats: a counter Add forgets (a new field
// left out of it) stays 0 and names itself.
func TestStatsAddSumsEveryCounter(t *testing.T) {
	var o Stats
	v := reflect.ValueOf(&o).Elem()
	for i := range v.NumField() {
		v.Field(i).SetUint(uint64(i + 1))
	}
	var sum Stats
	sum.Add(o)
	sum.Add(o)
	got := reflect.ValueOf(sum)
	for i := range got.NumField() {
		if want := uint64(2 * (i + 1)); got.Field(i).Uint() != want {
			t.Errorf("Stats.Add: %s = %d, want %d", got.Type().Field(i).Name, got.Field(i).Uint(), want)
		}
	}
}
