package stage_test

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// TestForwardedAndDeadLetteredHeaders checks the headers the stage writes:
// a forwarded copy carries the input's headers, without Nats-Expected-*,
// with the key as Nats-Msg-Id (replacing the input's own); a message the
// output refuses after the stage built its copy is dead-lettered with the
// input's headers, not the copy's.
func TestForwardedAndDeadLetteredHeaders(t *testing.T) {
	e := newEnv(t)
	r := e.start()
	// The input takes Nats-TTL; the output stream refuses it, after the
	// stage has built the copy.
	updateStream(t, e, e.cfg.Input.Stream, func(sc *jetstream.StreamConfig) { sc.AllowMsgTTL = true })

	input := func(k string) nats.Header {
		return nats.Header{
			"Event-Id":             {k},
			"Trace":                {"t-" + k},
			"Multi":                {"a", "b"},
			"Nats-Msg-Id":          {"client-" + k},
			"Nats-Expected-Stream": {e.cfg.Input.Stream},
		}
	}
	good := &nats.Msg{Subject: "events.orders", Header: input("good-1"), Data: []byte("good")}
	refused := &nats.Msg{Subject: "events.orders", Header: input("bad-1"), Data: []byte("bad")}
	refused.Header.Set("Nats-TTL", "1h")
	natstest.PublishAll(t, e.js, []*nats.Msg{good, refused})
	e.drained(30 * time.Second)
	r.stop(t)

	out := e.outputByKey()
	if len(out["good-1"]) != 1 || len(out) != 1 {
		t.Fatalf("output by Nats-Msg-Id: %v, want good-1 once", out)
	}
	got := out["good-1"][0].Header
	want := nats.Header{
		"Event-Id":    {"good-1"},
		"Trace":       {"t-good-1"},
		"Multi":       {"a", "b"},
		"Nats-Msg-Id": {"good-1"},
		// The record a restore reads back (changelog.AnnotateFirstSeen):
		// the input time of the copy; its fingerprint is its body's.
		changelog.HeaderFirstSeen: {got.Get(changelog.HeaderFirstSeen)},
	}
	if rec, err := changelog.DecodeForward(got, out["good-1"][0].Data); err != nil || rec.FirstSeen.IsZero() || rec.Fingerprint != changelog.Fingerprint([]byte("good")) {
		t.Errorf("forwarded headers %v carry no record: %+v, %v", got, rec, err)
	}
	if !headersEqual(got, want) {
		t.Errorf("forwarded headers %v, want %v", got, want)
	}

	dead := natstest.ReadAll(t, e.js, e.cfg.DeadLetter.Stream)
	if len(dead) != 1 || dead[0].Header.Get(deadletter.HeaderReason) != string(deadletter.ReasonOutputRejected) {
		t.Fatalf("dead letters %v, want one %s", dead, deadletter.ReasonOutputRejected)
	}
	// The dead letter keeps the input's headers except Nats-*, and adds the
	// stage's Dedupe-* ones and its own Nats-Msg-Id.
	kept := nats.Header{}
	for k, v := range dead[0].Header {
		if !strings.HasPrefix(k, "Dedupe-") && !strings.HasPrefix(k, "Nats-") {
			kept[k] = v
		}
	}
	wantKept := nats.Header{"Event-Id": {"bad-1"}, "Trace": {"t-bad-1"}, "Multi": {"a", "b"}}
	if !headersEqual(kept, wantKept) {
		t.Errorf("dead letter keeps input headers %v, want %v", kept, wantKept)
	}
	if id := dead[0].Header.Get(jetstream.MsgIDHeader); !strings.HasPrefix(id, "dlq:") {
		t.Errorf("dead letter Nats-Msg-Id %q, want the dead letter's own dlq:stream:sequence", id)
	}
}

// headersEqual reports whether a and b hold the same names with the same
// values in the same order.
func headersEqual(a, b nats.Header) bool {
	return maps.EqualFunc(a, b, slices.Equal[[]string])
}

// TestInputsOfAnAtomicBatchAreForwarded: inputs a producer published in an
// atomic batch are stored with the batch's headers (Nats-Batch-Id,
// Nats-Batch-Sequence, Nats-Batch-Commit). The forwarded copies leave them
// out, whichever way the output is published: a copy that carried them
// would make the output stream take it for a piece of a batch it never
// saw, refuse it (10176, "atomic publish batch is incomplete") and turn a
// good input into a dead letter, or store pieces of several batches as
// one.
func TestInputsOfAnAtomicBatchAreForwarded(t *testing.T) {
	for _, publish := range []string{config.PublishAsync, config.PublishAtomic} {
		t.Run("publish="+publish, func(t *testing.T) {
			e := newEnv(t)
			e.cfg.Output.Publish = publish
			r := e.start()
			updateStream(t, e, e.cfg.Input.Stream, func(sc *jetstream.StreamConfig) { sc.AllowAtomicPublish = true })
			const n = 5
			var batch []*nats.Msg
			for i := range n {
				batch = append(batch, keyed("batched-"+strconv.Itoa(i), []byte("b")))
			}
			if _, err := jetstreamext.PublishMsgBatch(context.Background(), e.js, batch); err != nil {
				t.Fatalf("publish the inputs as an atomic batch: %v", err)
			}
			e.drained(30 * time.Second)
			r.stop(t)

			if dead := natstest.ReadAll(t, e.js, e.cfg.DeadLetter.Stream); len(dead) != 0 {
				t.Errorf("%d inputs dead-lettered, want none; the first: %s %q", len(dead),
					dead[0].Header.Get(deadletter.HeaderReason), dead[0].Header.Get(deadletter.HeaderDetail))
			}
			out := e.outputByKey()
			for i := range n {
				k := "batched-" + strconv.Itoa(i)
				if len(out[k]) != 1 {
					t.Errorf("key %s forwarded %d times, want once", k, len(out[k]))
					continue
				}
				if publish == config.PublishAsync && out[k][0].Header.Get(jetstreamext.BatchIDHeader) != "" {
					t.Errorf("key %s forwarded one by one with the input's batch headers: %v", k, out[k][0].Header)
				}
			}
		})
	}
}
