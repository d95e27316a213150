package stage_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/natstest"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// TestScaleOutRoutedDeadLetterNamesTheInput dead-letters a message the
// route step routed (a copy whose payload differs from the first): the
// dead letter names the input stream, sequence and subject, where the
// message stays, not the routed work-queue copy, which is deleted once
// acked; and its id is the one the route step would give the same input.
func TestScaleOutRoutedDeadLetterNamesTheInput(t *testing.T) {
	e := newEnv(t)
	e.cfg.ScaleOut.Enabled = true
	e.cfg.ScaleOut.Replicas = 1
	e.cfg.Pipeline.OnFingerprintMismatch = config.FingerprintDeadLetter
	if routed, why := e.cfg.ScaleOutRouted(); !routed {
		t.Fatalf("header key: not routed (%s)", why)
	}
	e.as("a").start()
	// The input without a key is dead-lettered by the route step and never
	// routed, so input and routed sequences differ.
	e.publish([]event{{key: "", payload: []byte("no key")}, {key: "order-1", payload: []byte(`{"id":"order-1","at":1}`)}})
	e.scaleOutDrained(60 * time.Second)

	m := &nats.Msg{Subject: "events.orders", Header: nats.Header{}, Data: []byte(`{"id":"order-1","at":2}`)}
	m.Header.Set("Event-Id", "order-1")
	ack, err := e.js.PublishMsg(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	natstest.WaitDrained(t, e.js, e.cfg.Input.Stream, "dedupe-route", 30*time.Second)
	e.scaleOutDrained(60 * time.Second)

	var dls []natstest.Message
	natstest.Until(30*time.Second, 50*time.Millisecond, func() bool {
		for _, m := range natstest.ReadAll(t, e.js, e.cfg.DeadLetter.Stream) {
			if m.Header.Get(stage.HeaderReason) == "fingerprint_mismatch" {
				dls = append(dls, m)
			}
		}
		return len(dls) > 0
	})
	if len(dls) != 1 {
		t.Fatalf("%d fingerprint_mismatch dead letters, want the mismatching copy's", len(dls))
	}
	dl := dls[0]
	seq := strconv.FormatUint(ack.Sequence, 10)
	for h, want := range map[string]string{
		stage.HeaderReason:           "fingerprint_mismatch",
		stage.HeaderOriginalStream:   e.cfg.Input.Stream,
		stage.HeaderOriginalSequence: seq,
		stage.HeaderOriginalSubject:  "events.orders",
		jetstream.MsgIDHeader:        "dlq:" + e.cfg.Input.Stream + ":" + seq,
	} {
		if got := dl.Header.Get(h); got != want {
			t.Errorf("dead letter %s = %q, want %q (routed stream %s)", h, got, want, e.cfg.ScaleOut.RoutedStream)
		}
	}
	// The input named is there to read.
	got, err := e.js.Stream(context.Background(), e.cfg.Input.Stream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := got.GetMsg(context.Background(), ack.Sequence)
	if err != nil {
		t.Fatalf("input %s sequence %d, named by the dead letter: %v", e.cfg.Input.Stream, ack.Sequence, err)
	}
	if string(raw.Data) != string(m.Data) {
		t.Errorf("input at the dead letter's sequence holds %q, want %q", raw.Data, m.Data)
	}
}
