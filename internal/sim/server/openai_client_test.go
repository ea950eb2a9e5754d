package server

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// The official OpenAI Go client talks to a simulated engine: non-streamed
// and streamed, completions and chat. What it decodes is what any OpenAI
// client would see, including usage.prompt_tokens_details.cached_tokens.
func TestOfficialOpenAIClient(t *testing.T) {
	f := startFleet(t, Options{})
	client := openai.NewClient(
		option.WithBaseURL("http://"+f.Addrs()[0]+"/v1/"),
		option.WithAPIKey("sim"),
		option.WithMaxRetries(0),
	)
	ctx := context.Background()
	prompt := longPrompt(9, 640) // 40 full blocks

	c, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model:     "llama-3-8b",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens: openai.Int(4),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Choices) != 1 || len(strings.Fields(c.Choices[0].Text)) != 4 || c.Choices[0].FinishReason != "length" {
		t.Fatalf("completion choices %+v", c.Choices)
	}
	if c.Usage.PromptTokens != 640 || c.Usage.CompletionTokens != 4 || c.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("completion usage %+v", c.Usage)
	}

	stream := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:         "llama-3-8b",
		Prompt:        openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens:     openai.Int(3),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var text strings.Builder
	var cached int64 = -1
	for stream.Next() {
		ch := stream.Current()
		for _, choice := range ch.Choices {
			text.WriteString(choice.Text)
		}
		if ch.Usage.TotalTokens > 0 {
			cached = ch.Usage.PromptTokensDetails.CachedTokens
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(strings.Fields(text.String())) != 3 || cached != 624 {
		t.Fatalf("streamed completion: text %q, cached %d (want 3 tokens and 624 cached: 39 blocks, the last recomputed)", text.String(), cached)
	}

	msgs := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage(longPrompt(10, 400)),
		openai.UserMessage("what is in the cache?"),
	}
	cc, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "llama-3-8b", Messages: msgs, MaxCompletionTokens: openai.Int(2)})
	if err != nil {
		t.Fatal(err)
	}
	if len(cc.Choices) != 1 || cc.Choices[0].Message.Content == "" || cc.Usage.CompletionTokens != 2 {
		t.Fatalf("chat completion %+v", cc)
	}

	cs := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: "llama-3-8b", Messages: msgs, MaxTokens: openai.Int(5),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var acc openai.ChatCompletionAccumulator
	for cs.Next() {
		acc.AddChunk(cs.Current())
	}
	if err := cs.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 1 || len(strings.Fields(acc.Choices[0].Message.Content)) != 5 || acc.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("streamed chat accumulated to %+v", acc.ChatCompletion)
	}

	// A bad request surfaces as the client's typed API error with vLLM's body.
	_, err = client.Completions.New(ctx, openai.CompletionNewParams{Model: "llama-3-8b", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, MaxTokens: openai.Int(0)})
	var apiErr *openai.Error
	if err == nil || !errorsAs(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Message, "max_tokens") {
		t.Fatalf("max_tokens 0: error %v", err)
	}
}

func errorsAs(err error, target **openai.Error) bool { return errors.As(err, target) }
