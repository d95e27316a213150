package faults

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// Log lines (JSON, log.format: json) the tests look for.
const (
	logRebuilding  = `"msg":"state: filter snapshot unusable, rebuilding the filter from the store"`
	logFilterReady = `"msg":"state: filter ready"`
	logJudging     = `"msg":"judging messages"`
	logClaimMissed = `"msg":"claim found a key the lookup did not"`
)

// testSeed is the seed of the tests' random choices: DEDUPE_FAULTS_SEED when
// set, else a fixed one, so that a failure can be replayed.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(20260601)
	if v := os.Getenv("DEDUPE_FAULTS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("DEDUPE_FAULTS_SEED=%q: %v", v, err)
		}
		seed = s
	}
	t.Logf("seed %d (set DEDUPE_FAULTS_SEED to choose another)", seed)
	return seed
}

// TestKill9AtRandomMoments kills the stage with SIGKILL at least 20 times at
// seeded random moments, a third of them during the filter rebuild at
// start, while inputs with repeats, late copies and bad inputs arrive: every
// key is in the output once and the dead letters are exactly the bad
// inputs. docs/faults.md gives the workload and what else is checked.
func TestKill9AtRandomMoments(t *testing.T) {
	t.Parallel()
	const (
		preloadKeys = 400_000
		mainEvents  = 16_000
		mainRate    = 500 // inputs per second: ~32s of publishing
		minKills    = 24
		lateKills   = 3
	)
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 2))
	srv := startNATS(t)
	cfg := defaultStageConfig(t, srv.URL())
	cfg.ExpectedKeys = 600_000
	cfg.SnapshotInterval = 2 * time.Second // some restarts load a snapshot and top it up
	w := newWorkload(seed, "kill", cfg.MaxMessageBytes)
	preload(t, cfg, w, preloadKeys)
	js := publisherJS(t, srv.URL())
	s := newStage(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	type published struct {
		acks map[int]pubAck
		err  error
	}
	events := w.mix(mainEvents, 0.25, 0.01, 0.02)
	pubDone := make(chan published, 1)
	go func() {
		a, err := publish(ctx, js, events, "main", mainRate, 150*time.Second)
		pubDone <- published{a, err}
	}()

	var (
		kills, rebuildKills, flowKills int
		republished                    float64 // re-publishes the output dropped: kills between publish and commit
		flowKillsSinceDrain            int     // kills while forwarding since a run last drained the input
		main                           *published
	)
	// checkRepublished adds a run's re-publishes the output reported as
	// duplicates, and checks them against what the kills could cause: each
	// is a key published and not committed when an earlier run (since the
	// last one that drained) was killed, at most a batch per partition each.
	checkRepublished := func(dup float64) {
		t.Helper()
		if bound := float64(flowKillsSinceDrain * cfg.Partitions * cfg.BatchSize); dup > bound {
			t.Errorf("run %d: the output reported %v re-published keys; the %d kills while forwarding since the input last drained can leave at most %v between publish and commit",
				len(s.runs), dup, flowKillsSinceDrain, bound)
		}
		republished += dup
	}
	// flowKill runs the stage until it has forwarded a random number of
	// messages (or a random time passed), then kills it.
	flowKill := func() {
		if rng.IntN(3) == 0 {
			removeSnapshots(t, cfg)
		}
		p := s.startReady()
		base := streamMsgs(js, outputStream)
		want := base + 20 + uint64(rng.IntN(1500))
		natstest.Until(time.Duration(300+rng.IntN(2000))*time.Millisecond, 5*time.Millisecond, func() bool {
			return streamMsgs(js, outputStream) >= want
		})
		checkRepublished(s.metric("dedupe_republish_duplicates_total"))
		flowKillsSinceDrain++
		if streamMsgs(js, outputStream) > base {
			flowKills++
		}
		p.kill(t)
		kills++
	}

	for round := 0; round < 80; round++ {
		if main == nil {
			select {
			case r := <-pubDone:
				if r.err != nil {
					t.Fatal(r.err)
				}
				main = &r
			default:
			}
		}
		if kills >= minKills && main != nil {
			break
		}
		if round%3 != 0 {
			flowKill()
			continue
		}
		// Kill during the rebuild of the filters.
		removeSnapshots(t, cfg)
		p := s.start()
		if !p.waitLog(logRebuilding, 30*time.Second) {
			t.Fatalf("run %d never said it was rebuilding its filters:\n%s", len(s.runs), proctest.Tail(p.Log(), 3000))
		}
		time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond) // on purpose: a random point of the rebuild
		p.kill(t)
		kills++
		log := p.Log()
		if strings.Count(log, logFilterReady) < cfg.Partitions && !strings.Contains(log, logJudging) {
			rebuildKills++
		}
	}
	if main == nil {
		t.Fatalf("inputs still being published after %d kills", kills)
	}

	// aloneRun runs the stage until it has drained the input and checks its
	// own decisions, which the output's duplicate window cannot hide: it
	// judged every delivery once, and each key it decided new is either a
	// new output message or a re-publish the output reported (at most a
	// batch per partition, in flight at the previous kill).
	aloneRun := func() {
		t.Helper()
		out0, ci0 := settledMsgs(js, outputStream), consumerInfo(t, js)
		p := s.startReady()
		waitDrained(t, js, 90*time.Second)
		deliveries := consumerInfo(t, js).Delivered.Consumer - ci0.Delivered.Consumer
		newCount := s.metric("dedupe_messages_total", "outcome", "new")
		judged := newCount + s.metric("dedupe_messages_total", "outcome", "repeat") + s.metric("dedupe_messages_total", "outcome", "dead_letter") +
			s.metric("dedupe_unpartitioned_dead_letters_total")
		dup := s.metric("dedupe_republish_duplicates_total")
		checkRepublished(dup)
		flowKillsSinceDrain = 0
		added := streamMsgs(js, outputStream) - out0
		if judged != float64(deliveries) || deliveries < uint64(ci0.NumAckPending)+ci0.NumPending {
			t.Errorf("run %d judged %v messages of %d deliveries; %d were waiting", len(s.runs), judged, deliveries, uint64(ci0.NumAckPending)+ci0.NumPending)
		}
		if newCount != float64(added)+dup {
			t.Errorf("run %d decided %v keys new; the output gained %d and reported %v re-publishes", len(s.runs), newCount, added, dup)
		}
		p.kill(t)
	}

	// All of it judged by a stage that is left alone.
	aloneRun()

	// Late copies of keys first published longer ago than the output's
	// duplicate window, changed payloads, more of everything; three more kills.
	var firsts []event // first copies, in order of publication
	for _, e := range events {
		if e.bad == "" && w.firstID[e.key] == e.id {
			firsts = append(firsts, e)
		}
	}
	const nOld = 1000
	// A sleep on purpose: the first nOld keys must age past the window.
	time.Sleep(time.Until(main.acks[firsts[nOld].id].at.Add(cfg.DuplicateWindow + time.Second)))
	var old []string
	for _, e := range firsts {
		if time.Since(main.acks[e.id].at) > cfg.DuplicateWindow+time.Second {
			old = append(old, e.key)
		}
	}
	var late []event
	for range 1500 {
		late = append(late, w.copyOf(old[rng.IntN(len(old))]))
	}
	for range 100 {
		late = append(late, w.mismatch(old[rng.IntN(len(old))]))
	}
	late = append(late, w.mix(2000, 0.2, 0.02, 0.05)...)
	rng.Shuffle(len(late), func(i, j int) { late[i], late[j] = late[j], late[i] })
	go func() {
		a, err := publish(ctx, js, late, "late", 1000, 60*time.Second)
		pubDone <- published{a, err}
	}()
	for range lateKills {
		flowKill()
	}
	if r := <-pubDone; r.err != nil {
		t.Fatal(r.err)
	}
	aloneRun()

	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)
	for i, r := range s.runs {
		if strings.Contains(r.Log(), logClaimMissed) {
			t.Errorf("run %d logged %s", i+1, logClaimMissed)
		}
	}
	restored := restoredIn(s.runs)
	t.Logf("%d kills: %d during the filter rebuild, %d while forwarding; %d runs; %d forwards read back at start, %d re-publishes dropped by the output window; %d keys forwarded, %d dead letters, %d preloaded keys",
		kills, rebuildKills, flowKills, len(s.runs), restored, int(republished), len(w.forward), len(w.dead), w.npreloaded)
	if republished == 0 && restored == 0 {
		t.Error("no kill landed between a publish and its commit: no start read back a forward its store lacked, and the output dropped no re-publish")
	}
	if kills < 20 || rebuildKills < 3 || flowKills < 10 {
		t.Errorf("the kills did not land where they should: %d in all (want >= 20), %d during the rebuild (want >= 3), %d while forwarding (want >= 10)",
			kills, rebuildKills, flowKills)
	}
}
