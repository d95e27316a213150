package deadletter_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// settled records what a Publisher settled and what it reported fenced.
type settled struct {
	mu         sync.Mutex
	done       map[string]bool // input payload -> unstorable
	fenced     int             // letters in groups refused for a fence
	fencedErrs []error
}

// publisherEnv is a server with an input stream IN (events.>) holding
// inputs, a dead-letter stream DLQ (dlq.>, atomic publish allowed,
// max_msg_size maxMsgSize) and a sealed stream SEALED (sealed.>), and the
// inputs as delivered, by payload.
func publisherEnv(t *testing.T, maxMsgSize int32, inputs ...*nats.Msg) (*nats.Conn, jetstream.JetStream, map[string]jetstream.Msg) {
	t.Helper()
	s := natstest.RunServer(t, t.TempDir())
	nc, js := natstest.Connect(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"events.>"}})
	if err != nil {
		t.Fatalf("create IN: %v", err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DLQ", Subjects: []string{"dlq.>"}, MaxMsgSize: maxMsgSize, AllowAtomicPublish: true}); err != nil {
		t.Fatalf("create DLQ: %v", err)
	}
	sc := jetstream.StreamConfig{Name: "SEALED", Subjects: []string{"sealed.>"}}
	if _, err := js.CreateStream(ctx, sc); err != nil {
		t.Fatalf("create SEALED: %v", err)
	}
	sc.Sealed = true
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatalf("seal SEALED: %v", err)
	}
	natstest.PublishAll(t, js, inputs)
	c, err := in.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	batch, err := c.Fetch(len(inputs), jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatalf("fetch the inputs: %v", err)
	}
	got := map[string]jetstream.Msg{}
	for m := range batch.Messages() {
		got[string(m.Data())] = m
	}
	if len(got) != len(inputs) {
		t.Fatalf("fetched %d inputs, want %d", len(got), len(inputs))
	}
	return nc, js, got
}

// publisher returns a Publisher into the streams of publisherEnv that
// records what it settles in st: dead letters of reason "sealed" go to
// the sealed stream.
func publisher(nc *nats.Conn, js jetstream.JetStream, st *settled) *deadletter.Publisher {
	st.done = map[string]bool{}
	return &deadletter.Publisher{
		JS: js, Conn: nc, Component: "dead_letter", AckWait: 30 * time.Second, Atomic: true,
		Subject: func(reason string) string {
			if reason == "sealed" {
				return "sealed." + reason
			}
			return "dlq." + reason
		},
		Note: deadletter.OmittedTooLarge,
		Done: func(l deadletter.Letter, unstorable bool) {
			st.mu.Lock()
			defer st.mu.Unlock()
			st.done[string(l.Msg.Data())] = unstorable
			_ = l.Msg.Ack()
		},
		Fenced: func(_ deadletter.Letter, n int, err error) {
			st.mu.Lock()
			defer st.mu.Unlock()
			st.fenced += n
			st.fencedErrs = append(st.fencedErrs, err)
		},
	}
}

// TestPublisherSettlesEachLetter publishes, in one call, a letter that
// fits, one the dead-letter stream refuses for its size and one whose
// stream is sealed: the first is stored whole, the second in its Shrink
// form, the third is unstorable; each is settled once, with what became
// of it.
func TestPublisherSettlesEachLetter(t *testing.T) {
	big := "big:" + strings.Repeat("x", 2048)
	nc, js, in := publisherEnv(t, 1024,
		&nats.Msg{Subject: "events.a", Data: []byte("small")},
		&nats.Msg{Subject: "events.b", Data: []byte(big)},
		&nats.Msg{Subject: "events.c", Data: []byte("to-sealed")})
	var st settled
	pub := publisher(nc, js, &st)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub.Publish(ctx, []deadletter.Letter{
		{Msg: in["small"], Reason: deadletter.ReasonNoKey, Detail: "no id"},
		{Msg: in[big], Reason: deadletter.ReasonOversized, Detail: "too big"},
		{Msg: in["to-sealed"], Reason: "sealed", Detail: "nowhere to go"},
	})

	want := map[string]bool{"small": false, big: false, "to-sealed": true}
	for data, unstorable := range want {
		got, ok := st.done[data]
		if !ok || got != unstorable {
			t.Errorf("input %.10q: settled %v, unstorable %v; want settled, unstorable %v", data, ok, got, unstorable)
		}
	}
	dls := natstest.ReadAll(t, js, "DLQ")
	if len(dls) != 2 {
		t.Fatalf("DLQ holds %d dead letters, want 2 (the small one whole, the big one shrunk)", len(dls))
	}
	for _, m := range dls {
		switch m.Header.Get(deadletter.HeaderReason) {
		case string(deadletter.ReasonNoKey):
			if string(m.Data) != "small" || m.Header.Get(jetstream.MsgIDHeader) != "dlq:IN:1" {
				t.Errorf("the small input's dead letter: payload %q, id %q; want it whole with id dlq:IN:1", m.Data, m.Header.Get(jetstream.MsgIDHeader))
			}
		case string(deadletter.ReasonOversized):
			if len(m.Data) != 0 || m.Header.Get(deadletter.HeaderHeadersTruncated) == "" || m.Header.Get(deadletter.HeaderOriginalSequence) != "2" {
				t.Errorf("the big input's dead letter is not its Shrink form: %d bytes, headers %v", len(m.Data), m.Header)
			}
		default:
			t.Errorf("unexpected dead letter %v", m.Header)
		}
	}
}

// TestPublisherLeavesAFencedGroup publishes two letters, one expecting a
// fence that has moved: that one goes to Fenced and stays unsettled, the
// other is stored and settled.
func TestPublisherLeavesAFencedGroup(t *testing.T) {
	nc, js, in := publisherEnv(t, 0,
		&nats.Msg{Subject: "events.a", Data: []byte("free")},
		&nats.Msg{Subject: "events.b", Data: []byte("fenced")})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The fence subject's last message is at some sequence; the letter
	// expects one before it.
	ack, err := js.Publish(ctx, "dlq.fence.0", []byte("owner"))
	if err != nil {
		t.Fatal(err)
	}
	stale := &forward.Fence{Subject: "dlq.fence.0", Seq: ack.Sequence + 7}
	var st settled
	pub := publisher(nc, js, &st)
	pub.Publish(ctx, []deadletter.Letter{
		{Msg: in["free"], Reason: deadletter.ReasonNoKey, Detail: "no id"},
		{Msg: in["fenced"], Reason: deadletter.ReasonNoKey, Detail: "no id", Fence: stale, P: 0, Pin: "pin-a"},
	})
	if _, ok := st.done["free"]; !ok {
		t.Error("the letter without a fence was not settled")
	}
	if _, ok := st.done["fenced"]; ok {
		t.Error("the letter expecting a moved fence was settled; want it left for the partition's owner")
	}
	if st.fenced != 1 || len(st.fencedErrs) != 1 || !errors.Is(st.fencedErrs[0], retry.ErrFenced) {
		t.Errorf("Fenced heard %d letters, errors %v; want 1, a fence error", st.fenced, st.fencedErrs)
	}
	var ids []string
	for _, m := range natstest.ReadAll(t, js, "DLQ") {
		if m.Subject != "dlq.fence.0" {
			ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
		}
	}
	if len(ids) != 1 || ids[0] != "dlq:IN:1" {
		t.Errorf("DLQ holds dead letters %q, want only the free input's, dlq:IN:1", ids)
	}
}
