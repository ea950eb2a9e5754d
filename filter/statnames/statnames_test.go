package statnames

import (
	"regexp"
	"testing"
)

// TestTagRegexExtractsTagged: Envoy's rule (the first group is removed,
// the second is the value) applied with TagRegex to a Tagged name gives the
// value and the plain name, for values a configuration could hold.
func TestTagRegexExtractsTagged(t *testing.T) {
	for _, c := range []struct{ value, want string }{
		{"chat", "chat"}, {"kv_cache_aware", "kv_cache_aware"}, {"a-b", "a-b"},
		{"my.profile", "my_profile"}, {"x;.;y", "x___y"}, {"", "_"},
	} {
		for _, tag := range Tags {
			name := Namespace + Tagged(Router+"profile.", tag, c.value, "requests")
			m := regexp.MustCompile(TagRegex(tag)).FindStringSubmatchIndex(name)
			if m == nil {
				t.Fatalf("%s: %s does not match %s", tag, TagRegex(tag), name)
			}
			if got := name[m[4]:m[5]]; got != c.want {
				t.Errorf("%s=%q: value %q, want %q", tag, c.value, got, c.want)
			}
			if rest := name[:m[2]] + name[m[3]:]; rest != Namespace+Router+"profile.requests" {
				t.Errorf("%s=%q: extracted name %q", tag, c.value, rest)
			}
		}
	}
}
