package deadletter_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// delivered publishes data with header h to a new stream IN and returns it
// as its consumer delivers it, with a dead-letter stream DLQ beside.
func delivered(t *testing.T, h nats.Header, data []byte) (jetstream.JetStream, jetstream.Msg) {
	t.Helper()
	s := natstest.RunServer(t, t.TempDir())
	_, js := natstest.Connect(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"events.>"}})
	if err != nil {
		t.Fatalf("create IN: %v", err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DLQ", Subjects: []string{"dlq.>"}}); err != nil {
		t.Fatalf("create DLQ: %v", err)
	}
	natstest.PublishAll(t, js, []*nats.Msg{{Subject: "events.a", Header: h, Data: data}})
	c, err := in.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	msg, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("fetch the input: %v", err)
	}
	return js, msg
}

// inputOf is the deadletter.Input of a delivered message.
func inputOf(t *testing.T, msg jetstream.Msg) deadletter.Input {
	t.Helper()
	md, err := msg.Metadata()
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	return deadletter.Input{Reason: deadletter.ReasonNoKey, Detail: "no id", Header: msg.Headers(), Data: msg.Data(),
		Subject: msg.Subject(), Stream: md.Stream, Sequence: md.Sequence.Stream}
}

// A dead letter stored again (its input redelivered) is stored once.
func TestStoreOncePerInput(t *testing.T) {
	js, msg := delivered(t, nats.Header{"X-Trace": {"t1"}}, []byte(`{"other":1}`))
	o := deadletter.StoreOptions{Component: "dead_letter", MaxPayload: 1 << 20, AckWait: 30 * time.Second}
	for range 2 {
		m := deadletter.Build(inputOf(t, msg), "dlq.no_key", o.MaxPayload, deadletter.OmittedTooLarge)
		if err := deadletter.Store(context.Background(), js, m, msg, o); err != nil {
			t.Fatalf("Store: %v", err)
		}
	}
	got := natstest.ReadAll(t, js, "DLQ")
	if len(got) != 1 {
		t.Fatalf("DLQ holds %d dead letters of one input, want 1", len(got))
	}
	if got[0].Header.Get(jetstream.MsgIDHeader) != "dlq:IN:1" || got[0].Header.Get("X-Trace") != "t1" || string(got[0].Data) != `{"other":1}` {
		t.Errorf("stored dead letter is not the one built: %v %q", got[0].Header, got[0].Data)
	}
}

// A dead letter over the limits is refused for good before any publish; its
// Shrink form is stored.
func TestStoreRefusesWhatDoesNotFit(t *testing.T) {
	const maxPayload = 8192
	h := nats.Header{}
	for _, k := range []string{"X-A", "X-B", "X-C", "X-D", "X-E"} {
		h.Set(k, strings.Repeat("v", 2000))
	}
	js, msg := delivered(t, h, []byte("x"))
	in := inputOf(t, msg)
	o := deadletter.StoreOptions{Component: "dead_letter", MaxPayload: maxPayload, AckWait: 30 * time.Second}
	err := deadletter.Store(context.Background(), js, deadletter.Build(in, "dlq.no_key", maxPayload, deadletter.OmittedTooLarge), msg, o)
	if !retry.IsPermanent(err) || !errors.Is(err, forward.ErrTooLarge) {
		t.Fatalf("Store of a dead letter over max_payload = %v, want a permanent ErrTooLarge", err)
	}
	if n := len(natstest.ReadAll(t, js, "DLQ")); n != 0 {
		t.Fatalf("DLQ holds %d dead letters after a refusal, want 0", n)
	}
	if err := deadletter.Store(context.Background(), js, deadletter.Shrink(in, "dlq.no_key"), msg, o); err != nil {
		t.Fatalf("Store of the shrunk dead letter: %v", err)
	}
	got := natstest.ReadAll(t, js, "DLQ")
	if len(got) != 1 || got[0].Header.Get(deadletter.HeaderReason) != "no_key" || got[0].Header.Get(deadletter.HeaderHeadersTruncated) == "" {
		t.Errorf("DLQ holds %d dead letters, want the shrunk one", len(got))
	}
}
