package server

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
	"github.com/kvroute/kvroute/snapshot"
)

// maxBody bounds request bodies (a 128k-token prompt is ~512 KB of text).
const maxBody = 32 << 20

// defaultMaxTokens applies when a request sets no max_tokens. vLLM's
// completions default is 16; for chat it would generate up to the context
// limit, which a simulator has no reason to do.
const defaultMaxTokens = 16

// apiError is vLLM's error body: {"error": {"message", "type", "param", "code"}}.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func writeError(w http.ResponseWriter, status int, param, format string, args ...any) {
	typ := "BadRequestError"
	switch status {
	case http.StatusNotFound:
		typ = "NotFoundError"
	case http.StatusMethodNotAllowed:
		typ = "MethodNotAllowed"
	case http.StatusServiceUnavailable:
		typ = "ServiceUnavailableError"
	case http.StatusInternalServerError:
		typ = "InternalServerError"
	}
	var p *string
	if param != "" {
		p = &param
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(apiError{apiErrorBody{Message: fmt.Sprintf(format, args...), Type: typ, Param: p, Code: status}})
}

// commonFields are the request fields both endpoints share.
type commonFields struct {
	Model               *string         `json:"model"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	KVTransferParams    json.RawMessage `json:"kv_transfer_params"`
	BootstrapHost       *string         `json:"bootstrap_host"`
	BootstrapPort       *int            `json:"bootstrap_port"`
	BootstrapRoom       *uint64         `json:"bootstrap_room"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type completionRequest struct {
	commonFields
	Prompt json.RawMessage `json:"prompt"`
}

type chatRequest struct {
	commonFields
	Messages []chatMessageIn `json:"messages"`
}

type chatMessageIn struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// kvTransferParams is vLLM's NixlConnector hand-off, both directions.
type kvTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteBlockIDs  []int   `json:"remote_block_ids"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	TPSize          int     `json:"tp_size,omitempty"`
}

// job is a validated request, endpoint-independent.
type job struct {
	chat         bool
	model        string
	text         string // for hashing only; never logged
	promptTokens int
	maxTokens    int
	stream       bool
	includeUsage bool
	// Disaggregation.
	remoteDecode  bool // prefill side of NixlConnector: return kv_transfer_params
	kvTransferred bool // decode side: prompt KV comes from a peer
	bootstrap     *bootstrapRef
}

type bootstrapRef struct {
	host string
	port int
	room uint64
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "", "Method Not Allowed: use POST")
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "", "could not read the request body: %v", err)
		return nil, false
	}
	return body, true
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req completionRequest
	if err := decodeStrict(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "", "%v", err)
		return
	}
	j := &job{}
	if !s.common(w, &req.commonFields, j) {
		return
	}
	text, tokens, err := promptText(req.Prompt)
	if err != nil {
		writeError(w, http.StatusBadRequest, "prompt", "%v", err)
		return
	}
	j.text, j.promptTokens = text, tokens
	s.serve(w, r, j)
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req chatRequest
	if err := decodeStrict(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "", "%v", err)
		return
	}
	j := &job{chat: true}
	if !s.common(w, &req.commonFields, j) {
		return
	}
	if len(req.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "messages", "messages must be a non-empty list of {role, content} objects")
		return
	}
	msgs := make([]sim.ChatMessage, len(req.Messages))
	for i, m := range req.Messages {
		if m.Role == "" {
			writeError(w, http.StatusBadRequest, "messages", "messages[%d].role is required", i)
			return
		}
		c, err := contentText(m.Content)
		if err != nil {
			writeError(w, http.StatusBadRequest, "messages", "messages[%d].content: %v", i, err)
			return
		}
		msgs[i] = sim.ChatMessage{Role: m.Role, Content: c}
	}
	j.text = sim.RenderChat(msgs)
	j.promptTokens = sim.CountTokens(j.text)
	s.serve(w, r, j)
}

func decodeStrict(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return fmt.Errorf("the request body is empty; send a JSON object")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("invalid JSON body: %v", err)
	}
	return nil
}

// common validates the fields both endpoints share.
func (s *Server) common(w http.ResponseWriter, c *commonFields, j *job) bool {
	j.model = s.opt.Model
	if c.Model != nil && *c.Model != s.opt.Model {
		writeError(w, http.StatusNotFound, "model", "The model `%s` does not exist.", *c.Model)
		return false
	}
	if c.N != nil && *c.N != 1 {
		writeError(w, http.StatusBadRequest, "n", "n must be 1 on the simulator, got %d", *c.N)
		return false
	}
	j.maxTokens = defaultMaxTokens
	for _, mt := range []*int{c.MaxTokens, c.MaxCompletionTokens} {
		if mt == nil {
			continue
		}
		if *mt < 1 {
			writeError(w, http.StatusBadRequest, "max_tokens", "max_tokens must be at least 1, got %d.", *mt)
			return false
		}
		j.maxTokens = *mt
	}
	j.stream = c.Stream
	if c.StreamOptions != nil {
		if !c.Stream {
			writeError(w, http.StatusBadRequest, "stream_options", "Stream options can only be defined when `stream=True`.")
			return false
		}
		j.includeUsage = c.StreamOptions.IncludeUsage
	}
	if len(c.KVTransferParams) > 0 && string(c.KVTransferParams) != "null" {
		var kv kvTransferParams
		if err := json.Unmarshal(c.KVTransferParams, &kv); err != nil {
			writeError(w, http.StatusBadRequest, "kv_transfer_params", "kv_transfer_params: %v", err)
			return false
		}
		if kv.DoRemoteDecode && kv.DoRemotePrefill {
			writeError(w, http.StatusBadRequest, "kv_transfer_params", "kv_transfer_params cannot ask for both do_remote_decode and do_remote_prefill")
			return false
		}
		j.remoteDecode = kv.DoRemoteDecode
		if kv.DoRemotePrefill {
			if kv.RemoteEngineID == nil || kv.RemoteHost == nil {
				writeError(w, http.StatusBadRequest, "kv_transfer_params", "do_remote_prefill needs remote_engine_id and remote_host from the prefill response's kv_transfer_params")
				return false
			}
			j.kvTransferred = true
		}
	}
	if c.BootstrapRoom != nil || c.BootstrapHost != nil || c.BootstrapPort != nil {
		if c.BootstrapRoom == nil || c.BootstrapHost == nil || c.BootstrapPort == nil {
			writeError(w, http.StatusBadRequest, "bootstrap_room", "bootstrap_host, bootstrap_port and bootstrap_room go together")
			return false
		}
		if s.Role == snapshot.RoleBoth {
			writeError(w, http.StatusBadRequest, "bootstrap_room", "this server runs with role both; bootstrap pairing needs a prefill and a decode server")
			return false
		}
		j.bootstrap = &bootstrapRef{host: *c.BootstrapHost, port: *c.BootstrapPort, room: *c.BootstrapRoom}
	}
	return true
}

// promptText accepts a completion prompt as a string, a one-element list of
// strings, a list of token ids or a one-element list of those. Token ids are
// hashed as 4 bytes each, one token per id.
func promptText(raw json.RawMessage) (string, int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", 0, fmt.Errorf("prompt is required")
	}
	var str string
	if err := json.Unmarshal(raw, &str); err == nil {
		if str == "" {
			return "", 0, fmt.Errorf("prompt must not be empty")
		}
		return str, sim.CountTokens(str), nil
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		if len(strs) != 1 || strs[0] == "" {
			return "", 0, fmt.Errorf("the simulator serves exactly one non-empty prompt per request, got %d", len(strs))
		}
		return strs[0], sim.CountTokens(strs[0]), nil
	}
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err != nil {
		var nested [][]int64
		if err2 := json.Unmarshal(raw, &nested); err2 != nil || len(nested) != 1 {
			return "", 0, fmt.Errorf("prompt must be a string, a list of one string, or token ids")
		}
		ids = nested[0]
	}
	if len(ids) == 0 {
		return "", 0, fmt.Errorf("prompt must not be empty")
	}
	b := make([]byte, 4*len(ids))
	for i, id := range ids {
		if id < 0 || id > 1<<31 {
			return "", 0, fmt.Errorf("token id %d at position %d is out of vocabulary", id, i)
		}
		binary.LittleEndian.PutUint32(b[4*i:], uint32(id))
	}
	return string(b), len(ids), nil
}

// contentText flattens a chat message content: a string or a list of parts
// of which the text parts count.
func contentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil // assistant messages with only tool calls
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("must be a string or a list of content parts")
	}
	var b strings.Builder
	for i, p := range parts {
		if p.Type == "" {
			return "", fmt.Errorf("part %d has no type", i)
		}
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}

// Response shapes (OpenAI's, with vLLM's extra fields).

type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, j *job) {
	if j.promptTokens+j.maxTokens > s.opt.MaxModelLen {
		writeError(w, http.StatusBadRequest, "", "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			s.opt.MaxModelLen, j.promptTokens+j.maxTokens, j.promptTokens, j.maxTokens)
		return
	}
	ctx := r.Context()
	// Decode side of a disaggregated request: wait for the prefill peer
	// (SGLang bootstrap) and for the KV transfer.
	if j.bootstrap != nil && s.Role == snapshot.RoleDecode {
		if err := s.waitBootstrap(ctx, j.bootstrap); err != nil {
			writeError(w, http.StatusServiceUnavailable, "bootstrap_room", "%v", err)
			return
		}
		j.kvTransferred = true
	}
	if j.kvTransferred {
		bytes := float64(j.promptTokens) * s.prof.KVBytesPerToken()
		transfer := time.Duration(bytes / s.opt.KVTransferBandwidth * float64(time.Second) * s.opt.TimeScale)
		if transfer > 0 {
			select {
			case <-time.After(transfer):
			case <-ctx.Done():
				return
			}
		}
	}
	var room *room
	if j.bootstrap != nil && s.Role == snapshot.RolePrefill {
		room = s.rooms.get(j.bootstrap.room)
	}

	er := &sim.Request{
		ID:            s.seq.Add(1),
		PromptTokens:  j.promptTokens,
		BlockHashes:   sim.BlockChain(j.text, s.prof.BlockSize),
		MaxTokens:     j.maxTokens,
		KVTransferred: j.kvTransferred,
	}
	j.text = ""
	ch, err := s.engine.submit(er)
	if err != nil {
		writeError(w, http.StatusBadRequest, "", "%v: the prompt plus max_tokens exceed the engine's KV capacity of %d tokens", err, s.prof.NumGPUBlocks()*s.prof.BlockSize)
		return
	}
	idPrefix := "cmpl"
	if j.chat {
		idPrefix = "chatcmpl"
	}
	id := fmt.Sprintf("%s-%d", idPrefix, er.ID)
	created := time.Now().Unix()
	h := w.Header()
	h.Set("x-sim-replica", s.Addr)
	h.Set("x-sim-role", s.Role)
	if f := r.Header.Get("endpoint-load-metrics-format"); f != "" {
		if v := s.orcaHeader(f); v != "" {
			h.Set("endpoint-load-metrics", v)
		}
	}

	var kvOut *kvTransferParams
	if j.remoteDecode {
		host, port := splitHostPort(s.Addr)
		ids := make([]int, (j.promptTokens+s.prof.BlockSize-1)/s.prof.BlockSize)
		for i := range ids {
			ids[i] = int(er.ID%1000)*1000 + i
		}
		eid := s.engineID
		kvOut = &kvTransferParams{DoRemotePrefill: true, RemoteEngineID: &eid, RemoteBlockIDs: ids, RemoteHost: &host, RemotePort: &port, TPSize: 1}
	}

	if !j.stream {
		last, ok := wait(ctx, ch)
		if !ok {
			s.engine.abort(er)
			return
		}
		room.finish(er.PromptTokens)
		u := s.usage(er, last.generated)
		h.Set("Content-Type", "application/json")
		text := genText(er.ID, 0, last.generated)
		var resp any
		if j.chat {
			resp = map[string]any{
				"id": id, "object": "chat.completion", "created": created, "model": j.model,
				"choices": []any{map[string]any{
					"index": 0, "message": map[string]any{"role": "assistant", "content": text, "tool_calls": []any{}},
					"logprobs": nil, "finish_reason": "length", "stop_reason": nil,
				}},
				"usage": u, "prompt_logprobs": nil, "kv_transfer_params": kvOut,
			}
		} else {
			resp = map[string]any{
				"id": id, "object": "text_completion", "created": created, "model": j.model,
				"choices": []any{map[string]any{
					"index": 0, "text": text, "logprobs": nil, "finish_reason": "length", "stop_reason": nil, "prompt_logprobs": nil,
				}},
				"usage": u, "kv_transfer_params": kvOut,
			}
		}
		json.NewEncoder(w).Encode(resp)
		return
	}

	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	send := func(v any) bool {
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	object := "text_completion"
	if j.chat {
		object = "chat.completion.chunk"
	}
	chunk := func(text string, finish any, first bool) map[string]any {
		choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish, "stop_reason": nil}
		if j.chat {
			delta := map[string]any{"content": text}
			if first {
				delta["role"] = "assistant"
			}
			choice["delta"] = delta
		} else {
			choice["text"] = text
		}
		return map[string]any{"id": id, "object": object, "created": created, "model": j.model, "choices": []any{choice}}
	}
	sent := 0
	for {
		var p progress
		select {
		case p = <-ch:
		case <-ctx.Done():
			s.engine.abort(er)
			return
		}
		if sent == 0 && p.generated > 0 {
			room.finish(er.PromptTokens)
		}
		for ; sent < p.generated; sent++ {
			var finish any
			if p.done && sent == p.generated-1 {
				finish = "length"
			}
			c := chunk(genText(er.ID, sent, sent+1), finish, sent == 0)
			if finish != nil && kvOut != nil {
				c["kv_transfer_params"] = kvOut
			}
			if !send(c) {
				s.engine.abort(er)
				return
			}
		}
		if p.done {
			break
		}
	}
	if j.includeUsage {
		send(map[string]any{"id": id, "object": object, "created": created, "model": j.model, "choices": []any{}, "usage": s.usage(er, sent)})
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

func (s *Server) usage(er *sim.Request, generated int) usage {
	return usage{
		PromptTokens: er.PromptTokens, CompletionTokens: generated, TotalTokens: er.PromptTokens + generated,
		PromptTokensDetails: &promptDetails{CachedTokens: er.CachedTokens},
	}
}

// wait blocks until the request is done or the client is gone.
func wait(ctx interface{ Done() <-chan struct{} }, ch <-chan progress) (progress, bool) {
	for {
		select {
		case p := <-ch:
			if p.done {
				return p, true
			}
		case <-ctx.Done():
			return progress{}, false
		}
	}
}

// genText is the pseudo-text of output tokens [from, to) of a request: one
// word per token, deterministic per request id.
func genText(id uint64, from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		b.WriteString(" ")
		b.WriteString(strings.Fields(workload.PseudoText(id*1_000_003+uint64(i), 16))[0])
	}
	return b.String()
}

func splitHostPort(addr string) (string, int) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return addr, 0
	}
	p, _ := strconv.Atoi(addr[i+1:])
	return addr[:i], p
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"object": "list",
		"data": []any{map[string]any{
			"id": s.opt.Model, "object": "model", "created": time.Now().Unix(), "owned_by": "vllm",
			"root": s.opt.Model, "parent": nil, "max_model_len": s.opt.MaxModelLen,
		}},
	})
}
