package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/snapshot"
)

// SGLang's disaggregation pairs a prefill and a decode server per request:
// the router sends the same request to both with bootstrap_host and
// bootstrap_port naming the prefill server's bootstrap endpoint and a
// random bootstrap_room; the decode server waits for the prefill of that
// room, receives the KV cache and generates. In the simulator the bootstrap
// endpoint is the prefill server's own HTTP port (bootstrap_port = its
// port), at bootstrapPath + room; a GET there blocks until the room's
// prefill is done.
const bootstrapPath = "/kvroute-sim/bootstrap/"

// bootstrapWait bounds how long a decode server waits for its prefill.
const bootstrapWait = 60 * time.Second

type room struct {
	once    sync.Once
	done    chan struct{}
	tokens  int
	created time.Time
}

// finish marks the room's prefill done. Safe on a nil room.
func (r *room) finish(tokens int) {
	if r == nil {
		return
	}
	r.once.Do(func() {
		r.tokens = tokens
		close(r.done)
	})
}

type rooms struct {
	mu sync.Mutex
	m  map[uint64]*room
}

// get returns the room, creating it: the decode side may ask before the
// prefill side has even received its request.
func (rs *rooms) get(id uint64) *room {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if r, ok := rs.m[id]; ok {
		return r
	}
	if len(rs.m) > 4096 {
		for k, r := range rs.m {
			if time.Since(r.created) > 2*bootstrapWait {
				delete(rs.m, k)
			}
		}
	}
	r := &room{done: make(chan struct{}), created: time.Now()}
	rs.m[id] = r
	return r
}

func (s *Server) handleBootstrap(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseUint(strings.TrimPrefix(r.URL.Path, bootstrapPath), 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bootstrap_room", "bootstrap room must be an unsigned integer")
		return
	}
	if s.Role != snapshot.RolePrefill {
		writeError(w, http.StatusBadRequest, "bootstrap_room", "this server (role %s) is not a prefill server", s.Role)
		return
	}
	rm := s.rooms.get(id)
	t := time.NewTimer(bootstrapWait)
	defer t.Stop()
	select {
	case <-rm.done:
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"room": id, "prompt_tokens": rm.tokens})
	case <-t.C:
		writeError(w, http.StatusNotFound, "bootstrap_room", "no prefill finished for bootstrap room %d within %v", id, bootstrapWait)
	case <-r.Context().Done():
	}
}

// waitBootstrap blocks until the prefill server named by b finished the
// room's prefill.
func (s *Server) waitBootstrap(ctx context.Context, b *bootstrapRef) error {
	url := fmt.Sprintf("http://%s%s%d", net.JoinHostPort(b.host, strconv.Itoa(b.port)), bootstrapPath, b.room)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("bootstrap server %s:%d unreachable: %v", b.host, b.port, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("prefill for bootstrap room %d not available from %s:%d (status %d)", b.room, b.host, b.port, resp.StatusCode)
	}
	return nil
}
