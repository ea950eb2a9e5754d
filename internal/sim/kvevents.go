package sim

import "github.com/kvroute/kvroute/internal/metricsvc/kvevents"

// EncodeKVEvents adds evs, an engine step's prefix-cache changes
// (TakeKVEvents), to enc's next EventBatch, as vLLM's publisher writes
// them: every stored run with its parent and block size, every eviction.
func EncodeKVEvents(enc *kvevents.Encoder, evs []KVEvent) {
	for _, ev := range evs {
		switch ev.Kind {
		case KVStored:
			enc.Stored(kvevents.StoredEvent{Hashes: ev.Hashes, Parent: ev.Parent, HasParent: ev.HasParent,
				BlockSize: ev.BlockSize, Tokens: ev.BlockSize * len(ev.Hashes)})
		case KVRemoved:
			enc.Removed(ev.Hashes)
		}
	}
}
