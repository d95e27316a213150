package faults

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// logAtomicRefused is the log line of a run whose atomic batch the output
// refused because an id of it was already in the duplicate window: the
// batch a killed run published and did not commit, published again.
const logAtomicRefused = `"msg":"output refused an atomic batch; publishing its messages one at a time"`

// TestKillBetweenAtomicPublishAndCommit runs the stage with output.publish
// atomic (the output stream it creates allows atomic publish) and kills it
// with SIGKILL while it forwards, again and again, until a kill has landed
// between an atomic batch's commit ack and the commit of its claims: the
// next run reads the batch back from the output at start (after the
// store's watermark) and takes its copies as repeats; or, for a batch the
// server stored only after that read, it publishes a batch holding keys
// the output already has, the server refuses it whole (10201), and the
// batch goes one message at a time. The kills are timed at random, so the
// loop is bounded (at most 25 kills); it fails if none landed there. At
// the end every key is in the output exactly once and the dead letters are
// exactly the bad inputs.
func TestKillBetweenAtomicPublishAndCommit(t *testing.T) {
	t.Parallel()
	const (
		events   = 6_000
		rate     = 1_000 // inputs per second: ~6s of publishing, a dozen kills
		maxKills = 25
	)
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 12))
	srv := startNATSUnsynced(t)
	cfg := defaultStageConfig(t, srv.URL())
	cfg.Publish = "atomic"
	w := newWorkload(seed, "atomic", cfg.MaxMessageBytes)
	js := publisherJS(t, srv.URL())
	s := newStage(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	pubErr := make(chan error, 1)
	go func() {
		_, err := publish(ctx, js, w.mix(events, 0.2, 0.01, 0), "main", rate, 120*time.Second)
		pubErr <- err
	}()

	// refusedIn counts the runs that published again, as one message at
	// a time, a batch the output refused for an id it held.
	refusedIn := func() int {
		n := 0
		for _, r := range s.runs {
			for line := range strings.SplitSeq(r.Log(), "\n") {
				if strings.Contains(line, logAtomicRefused) && strings.Contains(line, "err_code=10201") {
					n++
					break
				}
			}
		}
		return n
	}
	kills := 0
	published := false
	landed := func() bool { return refusedIn() > 0 || restoredIn(s.runs) > 0 }
	for kills < maxKills && !(published && landed()) {
		p := s.startReady()
		base := streamMsgs(js, outputStream)
		want := base + 20 + uint64(rng.IntN(800))
		natstest.Until(time.Duration(200+rng.IntN(1500))*time.Millisecond, 5*time.Millisecond, func() bool {
			return streamMsgs(js, outputStream) >= want
		})
		p.kill(t)
		kills++
		if !published {
			select {
			case err := <-pubErr:
				if err != nil {
					t.Fatal(err)
				}
				published = true
			default:
			}
		}
	}
	if !published {
		if err := <-pubErr; err != nil {
			t.Fatal(err)
		}
	}

	p := s.startReady()
	waitDrained(t, js, 90*time.Second)
	republished := s.metric("dedupe_republish_duplicates_total")
	p.kill(t)

	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)
	for i, r := range s.runs {
		if !strings.Contains(r.Log(), `"msg":"output published as atomic batches"`) {
			t.Errorf("run %d did not publish atomic batches", i+1)
		}
		if strings.Contains(r.Log(), logClaimMissed) {
			t.Errorf("run %d logged %s", i+1, logClaimMissed)
		}
	}
	n, restored := refusedIn(), restoredIn(s.runs)
	t.Logf("%d kills, %d runs; %d forwards read back at start; %d runs re-published a refused atomic batch one message at a time; last run: %v re-publishes dropped by the output window; %d keys forwarded, %d dead letters",
		kills, len(s.runs), restored, n, republished, len(w.forward), len(w.dead))
	if n == 0 && restored == 0 {
		t.Errorf("no kill in %d landed between an atomic batch's commit ack and the commit of its claims", kills)
	}
}
