package workload

import (
	"strings"

	"github.com/kvroute/kvroute/internal/sim"
)

// vocabulary for pseudo-text: common English words, so the bytes look like
// prompt text (spaces, mixed word lengths) without being anyone's text.
var vocabulary = strings.Fields(`the of and to in is that for it as was with be by on not he this are or
his from at which but have an they you were her she there been one all we their has would when if so
no will more can what out up into other about time them some could then only do like over such our
these two may first any now new most also after where must model system data cache token request
engine router prefix block value memory queue batch layer state answer question document context
result number order reason table field method service update review policy summary report section`)

// splitmix64 is a tiny, fast, well-mixed generator: the same seed always
// gives the same text.
type splitmix64 uint64

func (s *splitmix64) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// appendText appends exactly n bytes of pseudo-text determined by seed.
func appendText(b []byte, seed uint64, n int) []byte {
	if n <= 0 {
		return b
	}
	rng := splitmix64(seed)
	start := len(b)
	for len(b)-start < n {
		w := vocabulary[rng.next()%uint64(len(vocabulary))]
		b = append(b, w...)
		b = append(b, ' ')
	}
	return b[:start+n]
}

// PseudoText returns n bytes of deterministic pseudo-text for seed.
func PseudoText(seed uint64, n int) string {
	return string(appendText(make([]byte, 0, n+16), seed, n))
}

// PseudoTokens returns deterministic pseudo-text of the given token count.
func PseudoTokens(seed uint64, tokens int) string {
	return PseudoText(seed, tokens*sim.CharsPerToken)
}

// MooncakeBlockTokens is the block size of Mooncake traces' hash ids.
const MooncakeBlockTokens = 512

// seedSpace keeps trace block seeds apart from generator seeds.
const traceSeedSpace = 0x6d6f6f6e63616b65 // "mooncake"

// ExpandHashIDs turns a Mooncake prompt into text: each hash id becomes the
// same 512-token (2,048-byte) block of pseudo-text wherever it appears, and
// the last block is cut so the prompt is exactly tokens long.
func ExpandHashIDs(ids []int64, tokens int) string {
	n := tokens * sim.CharsPerToken
	b := make([]byte, 0, n+16)
	block := MooncakeBlockTokens * sim.CharsPerToken
	for _, id := range ids {
		take := min(block, n-len(b))
		if take <= 0 {
			break
		}
		b = appendText(b, traceSeedSpace^uint64(id)*0x9e3779b97f4a7c15, take)
	}
	return string(b)
}
