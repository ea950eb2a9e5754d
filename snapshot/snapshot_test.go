package snapshot

import (
	"strings"
	"testing"
)

func TestCheckRole(t *testing.T) {
	for in, want := range map[string]string{"": RoleBoth, RoleBoth: RoleBoth, RolePrefill: RolePrefill, RoleDecode: RoleDecode} {
		if got, err := CheckRole(in); got != want || err != nil {
			t.Errorf("CheckRole(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	_, err := CheckRole("leader")
	if err == nil || !strings.Contains(err.Error(), `"leader" is not a role`) || !strings.Contains(err.Error(), `"prefill", "decode" or "both"`) {
		t.Errorf("CheckRole(leader) error = %v, want one naming the value and the roles", err)
	}
}
