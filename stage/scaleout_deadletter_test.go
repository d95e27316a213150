package stage_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/route"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
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
	if routed, why := e.cfg.ScaleOutPartitioning().Routed(); !routed {
		t.Fatalf("header key: not routed (%s)", why)
	}
	e.as("a").start()
	// The input without a key is dead-lettered by the route step and never
	// routed, so input and routed sequences differ.
	e.publish([]event{{key: "", payload: []byte("no key")}, {key: "order-1", payload: []byte(`{"id":"order-1","at":1}`)}})
	// Routed first, then judged: the members are drained before the route
	// step has routed anything too, and the route step's batches in flight
	// may land out of order, so the next copy could be judged first.
	natstest.WaitDrained(t, e.js, e.cfg.Input.Stream, "dedupe-route", 30*time.Second)
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
			if m.Header.Get(deadletter.HeaderReason) == "fingerprint_mismatch" {
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
		deadletter.HeaderReason:           "fingerprint_mismatch",
		deadletter.HeaderOriginalStream:   e.cfg.Input.Stream,
		deadletter.HeaderOriginalSequence: seq,
		deadletter.HeaderOriginalSubject:  "events.orders",
		jetstream.MsgIDHeader:             "dlq:" + e.cfg.Input.Stream + ":" + seq,
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

// TestScaleOutUnreadableRoutedMessagesAreDeadLettered: what the route step
// did not write into the routed stream, and a bundle of a form this
// version does not read (written by a newer instance of the group), are
// each dead-lettered once, whole, as not_routed, and acked: the member
// is not stuck on them, and nothing is forwarded from them.
func TestScaleOutUnreadableRoutedMessagesAreDeadLettered(t *testing.T) {
	e := newEnv(t)
	e.cfg.ScaleOut.Enabled = true
	e.cfg.ScaleOut.Replicas = 1
	e.as("a").start()
	e.publish([]event{{key: "order-1", payload: []byte("first")}})
	e.scaleOutDrained(60 * time.Second)
	subject := route.Subject(0, e.cfg.ScaleOut.RoutedSubject, "events.orders")
	foreign := &nats.Msg{Subject: subject, Header: nats.Header{}, Data: []byte("not a copy")}
	foreign.Header.Set(jetstream.MsgIDHeader, "someone-else-1")
	newer := &nats.Msg{Subject: subject, Header: nats.Header{}, Data: []byte{2, 1, 0}}
	newer.Header.Set(jetstream.MsgIDHeader, "route-bundle:future-1")
	newer.Header.Set(route.HeaderBundle, "2")
	natstest.PublishAll(t, e.js, []*nats.Msg{foreign, newer})
	e.scaleOutDrained(60 * time.Second)

	var dls []natstest.Message
	natstest.Until(30*time.Second, 50*time.Millisecond, func() bool {
		dls = dls[:0]
		for _, m := range e.deadLetters() {
			if m.Header.Get(deadletter.HeaderReason) == string(deadletter.ReasonNotRouted) {
				dls = append(dls, m)
			}
		}
		return len(dls) >= 2
	})
	if len(dls) != 2 {
		t.Fatalf("%d not_routed dead letters, want the foreign message's and the newer bundle's", len(dls))
	}
	for _, dl := range dls {
		t.Logf("dead letter: %s", dl.Header.Get(deadletter.HeaderDetail))
	}
	if n := len(e.routedOutput()); n != 1 {
		t.Errorf("the output holds %d messages, want order-1's only", n)
	}
}
