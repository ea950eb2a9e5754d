package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// Whatever a client posts, an engine answers 200 with a completion or a
// vLLM-style error (400, 404, 503), never panics and never hangs.
func FuzzRequestBody(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hello","max_tokens":2}`,
		`{"prompt":["a"],"max_tokens":1,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":[1,2,3],"max_tokens":1}`,
		`{"prompt":[[5,6]],"max_tokens":1}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
		`{"prompt":"x","kv_transfer_params":{"do_remote_decode":true}}`,
		`{"prompt":"x","bootstrap_host":"127.0.0.1","bootstrap_port":1,"bootstrap_room":3}`,
		`{"prompt":"x","max_tokens":-1}`, `{"model":5}`, `[]`, `null`, `{"prompt":[-1]}`,
	} {
		f.Add(s)
	}
	srv, err := Start(Options{TimeScale: 0, TimeScaleSet: true, MaxModelLen: 4096, KVBlocks: 300})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { srv.Close() })
	s := srv.Servers[0]
	h := s.routes()
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodPost, path, bytes.NewBufferString(body))
			h.ServeHTTP(rec, req)
			switch rec.Code {
			case 200:
			case 400, 404, 503:
				var e apiError
				if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Message == "" || e.Error.Code != rec.Code {
					t.Fatalf("%s %q: status %d with body %q", path, body, rec.Code, rec.Body.String())
				}
			default:
				t.Fatalf("%s %q: status %d", path, body, rec.Code)
			}
		}
	})
}
