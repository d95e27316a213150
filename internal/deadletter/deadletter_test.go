package deadletter_test

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// input is a dead-lettered input of stream IN, sequence 42, with a header
// of its own and the Nats-* ones a delivered message carries.
func input(data []byte) deadletter.Input {
	return deadletter.Input{
		Reason: deadletter.ReasonNoKey,
		Detail: `json "id" absent`,
		Header: nats.Header{
			"X-Trace":              {"t1", "t2"},
			jetstream.MsgIDHeader:  {"publisher-id"},
			"Nats-Expected-Stream": {"IN"},
		},
		Data:     data,
		Subject:  "events.a",
		Stream:   "IN",
		Sequence: 42,
	}
}

// The dead letters on the wire are read by operators' tools: their header
// names and id format must not change.
func TestWireNames(t *testing.T) {
	for got, want := range map[string]string{
		deadletter.HeaderReason:           "Dedupe-Reason",
		deadletter.HeaderDetail:           "Dedupe-Detail",
		deadletter.HeaderOriginalSubject:  "Dedupe-Original-Subject",
		deadletter.HeaderOriginalStream:   "Dedupe-Original-Stream",
		deadletter.HeaderOriginalSequence: "Dedupe-Original-Sequence",
		deadletter.HeaderPayloadOmitted:   "Dedupe-Payload-Omitted",
		deadletter.HeaderHeadersTruncated: "Dedupe-Headers-Truncated",
		deadletter.HeaderOriginalMsgID:    "Dedupe-Original-Msg-Id",
		deadletter.MsgID("IN", 42):        "dlq:IN:42",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}

func TestMsgIDIsOnePerInput(t *testing.T) {
	ids := map[string]bool{}
	for _, s := range []string{"IN", "IN2", "I:N"} {
		for _, seq := range []uint64{1, 2, 12, 21, 1 << 63} {
			id := deadletter.MsgID(s, seq)
			if id != deadletter.MsgID(s, seq) {
				t.Errorf("MsgID(%q, %d) is not stable", s, seq)
			}
			if ids[id] {
				t.Errorf("MsgID(%q, %d) = %q, already the id of another input", s, seq, id)
			}
			ids[id] = true
		}
	}
}

func TestBuild(t *testing.T) {
	in := input([]byte(`{"other":1}`))
	m := deadletter.Build(in, "dlq.no_key", 1<<20, deadletter.OmittedTooLarge)
	want := map[string]string{
		deadletter.HeaderReason:           "no_key",
		deadletter.HeaderDetail:           in.Detail,
		deadletter.HeaderOriginalSubject:  "events.a",
		deadletter.HeaderOriginalStream:   "IN",
		deadletter.HeaderOriginalSequence: "42",
		jetstream.MsgIDHeader:             "dlq:IN:42",
		deadletter.HeaderOriginalMsgID:    "publisher-id",
		"X-Trace":                         "t1",
	}
	for k, v := range want {
		if got := m.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if got := m.Header.Values("X-Trace"); len(got) != 2 {
		t.Errorf("X-Trace = %q, want both of the input's values", got)
	}
	if m.Header.Get("Nats-Expected-Stream") != "" || m.Header.Get(deadletter.HeaderPayloadOmitted) != "" {
		t.Errorf("dead letter carries the input's publish directive or omits a payload that fits: %v", m.Header)
	}
	if m.Subject != "dlq.no_key" || string(m.Data) != `{"other":1}` {
		t.Errorf("dead letter on %q with payload %q, want dlq.no_key and the input's", m.Subject, m.Data)
	}
	if len(in.Header) != 3 || in.Header.Get(jetstream.MsgIDHeader) != "publisher-id" {
		t.Errorf("Build changed the input's headers: %v", in.Header)
	}
}

func TestBuildLeavesOutWhatDoesNotFit(t *testing.T) {
	const maxPayload = 4096
	for _, tc := range []struct {
		name       string
		size       int
		maxPayload int64
		omitted    bool
	}{
		{"fits", 1000, maxPayload, false},
		{"too large", maxPayload, maxPayload, true},
		{"left out", 10, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := deadletter.Build(input(make([]byte, tc.size)), "dlq.no_key", tc.maxPayload, deadletter.OmittedRoute)
			if err := forward.CheckSize(m, maxPayload); err != nil {
				t.Errorf("dead letter does not fit: %v", err)
			}
			note := m.Header.Get(deadletter.HeaderPayloadOmitted)
			if got := note != "" || m.Data == nil; got != tc.omitted {
				t.Fatalf("payload omitted: %v (%q, %d bytes kept), want %v", got, note, len(m.Data), tc.omitted)
			}
			if want := strconv.Itoa(tc.size) + " bytes: " + deadletter.OmittedRoute; tc.omitted && note != want {
				t.Errorf("%s = %q, want %q", deadletter.HeaderPayloadOmitted, note, want)
			}
		})
	}
}

func TestBuildWithoutOrigin(t *testing.T) {
	in := input(nil)
	in.Stream, in.Sequence = "", 0
	m := deadletter.Build(in, "dlq.no_key", 1<<20, deadletter.OmittedTooLarge)
	for _, k := range []string{deadletter.HeaderOriginalStream, deadletter.HeaderOriginalSequence, jetstream.MsgIDHeader} {
		if v := m.Header.Get(k); v != "" {
			t.Errorf("an input of unknown stream has %s %q", k, v)
		}
	}
	if m.Header.Get(deadletter.HeaderOriginalSubject) != "events.a" {
		t.Errorf("dead letter lost the input's subject: %v", m.Header)
	}
}

// A dead letter refused for its size is shrunk: the shrunk one fits the
// limits and still says why and where the input is.
func TestShrinkFitsAndSaysWhy(t *testing.T) {
	const maxPayload = 1 << 16
	in := input(make([]byte, 3*maxPayload))
	in.Detail = strings.Repeat("d", 5000)
	for i := range 300 {
		in.Header.Set(fmt.Sprintf("X-H%03d", i), strings.Repeat("v", 1000))
	}
	in.Header.Set("X-"+strings.Repeat("n", 300), "long name")
	if err := forward.CheckSize(deadletter.Build(in, "dlq.no_key", maxPayload, deadletter.OmittedTooLarge), maxPayload); err == nil {
		t.Fatal("the test's dead letter fits without shrinking")
	}
	m := deadletter.Shrink(in, "dlq.no_key")
	if err := forward.CheckSize(m, maxPayload); err != nil {
		t.Fatalf("shrunk dead letter does not fit: %v", err)
	}
	if size := forward.HeaderSize(m.Header); size > deadletter.ShrunkHeaderBudget+2048 {
		t.Errorf("shrunk dead letter has %d bytes of headers, want about %d at most", size, deadletter.ShrunkHeaderBudget)
	}
	for k, v := range map[string]string{
		deadletter.HeaderReason:           "no_key",
		deadletter.HeaderOriginalSubject:  "events.a",
		deadletter.HeaderOriginalStream:   "IN",
		deadletter.HeaderOriginalSequence: "42",
		jetstream.MsgIDHeader:             "dlq:IN:42",
		deadletter.HeaderPayloadOmitted:   strconv.Itoa(3*maxPayload) + " bytes: " + deadletter.OmittedRefused,
	} {
		if got := m.Header.Get(k); got != v {
			t.Errorf("shrunk: header %s = %q, want %q", k, got, v)
		}
	}
	if d := m.Header.Get(deadletter.HeaderDetail); len(d) != deadletter.ShrunkValueMax || !strings.HasSuffix(d, "...") {
		t.Errorf("shrunk detail is %d bytes (%q...), want cut to %d", len(d), d[:10], deadletter.ShrunkValueMax)
	}
	if m.Data != nil || m.Subject != "dlq.no_key" {
		t.Errorf("shrunk dead letter on %q keeps %d bytes of payload", m.Subject, len(m.Data))
	}
	// The input's headers are kept in name order, first values only, cut.
	if v := m.Header.Values("X-Trace"); len(v) != 0 {
		t.Errorf("X-Trace (after the X-H* in name order) kept: %q", v)
	}
	if v := m.Header.Values("X-H000"); len(v) != 1 || len(v[0]) != deadletter.ShrunkValueMax {
		t.Errorf("X-H000 = %d values, want the first one cut to %d bytes", len(v), deadletter.ShrunkValueMax)
	}
	if m.Header.Get("Nats-Expected-Stream") != "" {
		t.Error("shrunk dead letter carries the input's publish directive")
	}
	kept := 0
	for k := range m.Header {
		if strings.HasPrefix(k, "X-H") {
			kept++
		}
	}
	want := fmt.Sprintf("kept %d of 302 headers, first value only, values cut to %d bytes, %d bytes in all", kept, deadletter.ShrunkValueMax, deadletter.ShrunkHeaderBudget)
	if got := m.Header.Get(deadletter.HeaderHeadersTruncated); got != want || kept == 0 {
		t.Errorf("%s = %q, want %q", deadletter.HeaderHeadersTruncated, got, want)
	}
}

func TestDescribe(t *testing.T) {
	api := &jetstream.APIError{Code: 400, ErrorCode: 10054, Description: "message size exceeds maximum allowed"}
	if got, want := deadletter.Describe(fmt.Errorf("publish: %w", api)), "code=400 err_code=10054 description=message size exceeds maximum allowed"; got != want {
		t.Errorf("Describe(API error) = %q, want %q", got, want)
	}
	if got := deadletter.Describe(errors.New("nats: timeout")); got != "nats: timeout" {
		t.Errorf("Describe(other error) = %q, want its text", got)
	}
}

func TestFallbackLevel(t *testing.T) {
	dup := &jetstream.APIError{Code: 400, ErrorCode: retry.CodeBatchDuplicateMsgID}
	if got := deadletter.FallbackLevel(fmt.Errorf("batch: %w", dup)); got != slog.LevelInfo {
		t.Errorf("a duplicate id in the batch logs at %v, want info", got)
	}
	if got := deadletter.FallbackLevel(&jetstream.APIError{Code: 503, ErrorCode: 10077}); got != slog.LevelWarn {
		t.Errorf("any other refusal logs at %v, want warn", got)
	}
}

func TestKeyReason(t *testing.T) {
	ke := &keys.Error{Reason: keys.ReasonBadPayload, Detail: "invalid JSON"}
	if r, d := deadletter.KeyReason(fmt.Errorf("key: %w", ke), deadletter.ReasonNoPartitionKey); r != deadletter.ReasonBadPayload || d != "invalid JSON" {
		t.Errorf("KeyReason(keys.Error) = %q, %q, want its reason and detail", r, d)
	}
	if r, d := deadletter.KeyReason(errors.New("boom"), deadletter.ReasonNoPartitionKey); r != deadletter.ReasonNoPartitionKey || d != "boom" {
		t.Errorf("KeyReason(other) = %q, %q, want the fallback and the error's text", r, d)
	}
}
