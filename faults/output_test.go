package faults

import (
	"context"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// outputConfig is the output stream as the stage would create it, with a
// message limit that refuses new messages once reached (0: no limit).
func outputConfig(cfg stageConfig, maxMsgs int64) jetstream.StreamConfig {
	sc := jetstream.StreamConfig{
		Name:       outputStream,
		Subjects:   []string{"deduped.>", "_dedupe.deduped.>"},
		Storage:    jetstream.FileStorage,
		Duplicates: cfg.DuplicateWindow,
		MaxMsgs:    -1,
	}
	if maxMsgs > 0 {
		sc.MaxMsgs, sc.Discard = maxMsgs, jetstream.DiscardNew
	}
	return sc
}

// checkNothingAckedUnforwarded asserts that no input whose key is missing
// from the output is acknowledged: each such input lies above the consumer's
// ack floor, and the consumer has at least as many messages awaiting an ack
// as there are delivered ones among them.
func checkNothingAckedUnforwarded(t *testing.T, js jetstream.JetStream, events []event, acks map[int]pubAck) {
	t.Helper()
	out := map[string]bool{}
	for _, m := range natstest.ReadAll(t, js, outputStream) {
		out[m.Header.Get(jetstream.MsgIDHeader)] = true
	}
	ci := consumerInfo(t, js)
	unforwarded, delivered, belowFloor := 0, 0, 0
	for _, e := range events {
		if e.bad != "" || out[e.key] {
			continue
		}
		unforwarded++
		seq := acks[e.id].seq
		if seq <= ci.AckFloor.Stream {
			if belowFloor++; belowFloor <= 5 {
				t.Errorf("input %d (key %s, sequence %d) is not forwarded but below the ack floor %d", e.id, e.key, seq, ci.AckFloor.Stream)
			}
		}
		if seq <= ci.Delivered.Stream {
			delivered++
		}
	}
	if unforwarded == 0 {
		t.Fatal("every input was forwarded: the output never refused anything")
	}
	if ci.NumAckPending < delivered {
		t.Errorf("%d delivered inputs are not forwarded, but only %d messages await an ack", delivered, ci.NumAckPending)
	}
	t.Logf("while refused: %d inputs not forwarded (%d delivered), ack floor %d, %d awaiting an ack, %d not yet delivered",
		unforwarded, delivered, ci.AckFloor.Stream, ci.NumAckPending, ci.NumPending)
}

// TestOutputRefusesPublishes makes the output stream refuse the stage's
// publishes: first with a message limit and discard-new policy, later
// lifted by a stream update; then by deleting the stream, later recreated.
// While refused, the stage retries with backoff, /healthz answers 503
// naming the publish, and no input whose key is not in the output is
// acknowledged (the consumer's ack floor and pending count say so); the
// refusal lasts several AckWaits without the consumer redelivering the
// batches in flight. Once accepted again, /healthz recovers and every key
// is in the output exactly once.
func TestOutputRefusesPublishes(t *testing.T) {
	t.Parallel()
	seed := testSeed(t)
	srv := startNATSUnsynced(t)
	cfg := defaultStageConfig(t, srv.URL())
	nc, _ := natstest.Connect(t, srv.URL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const limit = 500
	if _, err := js.CreateStream(ctx, outputConfig(cfg, limit)); err != nil {
		t.Fatal(err)
	}
	s := newStage(t, cfg)
	p := s.startReady()
	w := newWorkload(seed, "refused", cfg.MaxMessageBytes)

	t.Run("limit reached", func(t *testing.T) {
		events := w.mix(3000, 0.25, 0.02, 0)
		acks := mustPublish(t, js, events, "limit")
		natstest.WaitFor(t, 30*time.Second, "/healthz to answer 503", func() bool {
			code, _ := s.get("/healthz")
			return code == http.StatusServiceUnavailable
		})
		if _, body := s.get("/healthz"); !strings.Contains(body, "publish") {
			t.Errorf("/healthz does not name the failing publish: %s", body)
		} else {
			t.Logf("/healthz: 503 %s", strings.TrimSpace(body))
		}
		if code, _ := s.get("/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("/readyz answers %d while publishes fail, want 503", code)
		}
		if n := streamMsgs(js, outputStream); n != limit {
			t.Fatalf("output holds %d messages, want the limit %d", n, limit)
		}
		floor := consumerInfo(t, js).AckFloor.Stream
		// Nothing may be acked for three ack_waits: the floor is watched
		// throughout, and checked below.
		natstest.Until(3*cfg.AckWait, 100*time.Millisecond, func() bool {
			return consumerInfo(t, js).AckFloor.Stream != floor
		})
		checkNothingAckedUnforwarded(t, js, events, acks)
		if ci := consumerInfo(t, js); ci.AckFloor.Stream != floor {
			t.Errorf("ack floor moved from %d to %d while the output refused everything", floor, ci.AckFloor.Stream)
		}
		if ci := consumerInfo(t, js); ci.NumRedelivered > 0 {
			t.Logf("%d messages were redelivered while refused", ci.NumRedelivered)
		}

		if _, err := js.UpdateStream(ctx, outputConfig(cfg, 0)); err != nil {
			t.Fatal(err)
		}
		waitDrained(t, js, 60*time.Second)
		natstest.WaitFor(t, 15*time.Second, "/healthz to answer 200", func() bool {
			code, _ := s.get("/healthz")
			return code == http.StatusOK
		})
		if !strings.Contains(p.Log(), `"msg":"output publishes recovered"`) {
			t.Error("the log does not say the publishes recovered")
		}
		checkOutput(t, js, w.forward)
		checkDeadLetters(t, js, w.dead)
	})

	t.Run("stream deleted", func(t *testing.T) {
		before := len(w.forward)
		if err := js.DeleteStream(ctx, outputStream); err != nil {
			t.Fatal(err)
		}
		events := w.mix(2000, 0.25, 0.02, 0)
		acks := mustPublish(t, js, events, "deleted")
		natstest.WaitFor(t, 30*time.Second, "/healthz to answer 503", func() bool {
			code, _ := s.get("/healthz")
			return code == http.StatusServiceUnavailable
		})
		// No first copy of a good input may be acked for three ack_waits:
		// the floor is watched throughout, and checked below.
		firstSeq := uint64(math.MaxUint64)
		for _, e := range events {
			if e.bad == "" && w.firstID[e.key] == e.id {
				firstSeq = min(firstSeq, acks[e.id].seq)
			}
		}
		natstest.Until(3*cfg.AckWait, 100*time.Millisecond, func() bool {
			return consumerInfo(t, js).AckFloor.Stream >= firstSeq
		})
		ci := consumerInfo(t, js)
		for _, e := range events {
			if e.bad == "" && acks[e.id].seq <= ci.AckFloor.Stream && w.firstID[e.key] == e.id {
				t.Errorf("input %d (key %s) acknowledged while the output stream does not exist", e.id, e.key)
				break
			}
		}
		if _, err := js.CreateStream(ctx, outputConfig(cfg, 0)); err != nil {
			t.Fatal(err)
		}
		waitDrained(t, js, 60*time.Second)
		natstest.WaitFor(t, 15*time.Second, "/healthz to answer 200", func() bool {
			code, _ := s.get("/healthz")
			return code == http.StatusOK
		})
		// The new stream holds exactly the keys that first came after the
		// deletion.
		fresh := map[string][]byte{}
		for _, k := range w.keys[before:] {
			fresh[k] = w.forward[k]
		}
		checkOutput(t, js, fresh)
		checkDeadLetters(t, js, w.dead)
	})
	t.Logf("%.0f publish retries", s.metric("dedupe_publish_retries_total"))
}
