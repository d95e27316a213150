package faults

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// The tests of this file judge copies by the input's clock (docs/state.md,
// "The input's clock"): every copy the input stores within W of its key's
// first copy is a repeat, whenever the stage judges it.

// shortWindow is the stage configuration of a test of the input's clock:
// W = w (one path, no margin), AckWait 1s, an output duplicate window of
// 3s (ack_wait + restart_margin + 1s), so that a copy judged more than 3s
// after its first forward is caught by the stage alone, never by the
// output stream.
func shortWindow(tb testing.TB, natsURL string, w time.Duration) stageConfig {
	c := defaultStageConfig(tb, natsURL)
	c.AckWait = time.Second
	c.RestartMargin = time.Second
	c.DuplicateWindow = 3 * time.Second
	c.Extra = windowYAML(w, false)
	return c
}

// shortWindowStage is a stage, not started, with shortWindow(w) on a
// nats-server of its own, a publisher to that server, and a workload of
// seed whose keys begin with prefix.
func shortWindowStage(t *testing.T, w time.Duration, seed uint64, prefix string) (*stage, jetstream.JetStream, *workload) {
	t.Helper()
	srv := startNATSUnsynced(t)
	cfg := shortWindow(t, srv.URL(), w)
	return newStage(t, cfg), publisherJS(t, srv.URL()), newWorkload(seed, prefix, cfg.MaxMessageBytes)
}

// windowYAML is a window section: W = w, from one path and no margin,
// with window.refresh_on_repeat when refresh is set.
func windowYAML(w time.Duration, refresh bool) string {
	y := "window:\n  paths: [{name: test, max: " + w.String() + "}]\n  margin: 0s\n"
	if refresh {
		y += "  refresh_on_repeat: true\n"
	}
	return y
}

// forwardsByKey returns how many times the output stream holds a forward
// of each key: its Nats-Msg-Id, or the id a forward past W takes
// (<id>.after.<ns>, changelog.AfterID), counts for the key; the changelog's
// control records do not count.
func forwardsByKey(tb testing.TB, js jetstream.JetStream) map[string]int {
	tb.Helper()
	control := strings.TrimSuffix(changelog.ControlSubjects("deduped"), ">")
	out := map[string]int{}
	for _, m := range natstest.ReadAll(tb, js, outputStream) {
		if strings.HasPrefix(m.Subject, control) {
			continue
		}
		id := m.Header.Get(jetstream.MsgIDHeader)
		if i := strings.Index(id, ".after."); i >= 0 {
			id = id[:i]
		}
		out[id]++
	}
	return out
}

// forwardsByInputTime returns how many times each good key of the input
// stream must be forwarded, judged by the times the input stored its
// copies (no refresh on repeat): a copy stored W or more after the copy
// that opened its key's window opens a new one and is forwarded; every
// other is a repeat. dead holds the Plan-Ids of the inputs that are
// dead-lettered, not judged.
func forwardsByInputTime(tb testing.TB, js jetstream.JetStream, w time.Duration, dead map[int]string) map[string]int {
	tb.Helper()
	var copies []copyAt
	for _, m := range natstest.ReadAll(tb, js, inputStream) { // in stream order: by stored time
		if k := m.Header.Get(headerKey); k != "" && dead[planID(m.Header.Get(headerPlan))] == "" {
			copies = append(copies, copyAt{k, m.Time})
		}
	}
	return forwardsOf(copies, w)
}

// copyAt is a copy of key stored at a time.
type copyAt struct {
	key string
	at  time.Time
}

// forwardsOf returns how many times each key of copies (in the order
// they were stored) is forwarded with no refresh on repeat: a copy at W or
// more after the copy that opened its key's window opens a new one and is
// forwarded; every other is a repeat.
func forwardsOf(copies []copyAt, w time.Duration) map[string]int {
	opened := map[string]time.Time{}
	want := map[string]int{}
	for _, c := range copies {
		if start, ok := opened[c.key]; ok && c.at.Sub(start) < w {
			continue
		}
		opened[c.key] = c.at
		want[c.key]++
	}
	return want
}

// planID is a Plan-Id header's input id, or -1.
func planID(h string) int {
	id, err := strconv.Atoi(h)
	if err != nil {
		return -1
	}
	return id
}

// compareForwards fails the test with the first differences between the
// forwards per key got and want, what naming got.
func compareForwards(tb testing.TB, what string, got, want map[string]int) {
	tb.Helper()
	var diff []string
	for k, n := range want {
		if got[k] != n {
			diff = append(diff, k+": "+strconv.Itoa(got[k])+" want "+strconv.Itoa(n))
		}
	}
	for k, n := range got {
		if _, ok := want[k]; !ok {
			diff = append(diff, k+": "+strconv.Itoa(n)+" want 0")
		}
	}
	if len(diff) > 0 {
		slices.Sort(diff)
		tb.Errorf("%s: %d of %d keys forwarded a wrong number of times (forwards by key): %v", what, len(diff), len(want), diff[:min(len(diff), 10)])
	}
}

// TestDowntimeDoesNotAgeACopy is the downtime case of issue 49: keys are
// forwarded, the stage is stopped (SIGTERM), a copy of each is published
// a moment after its first, and the stage starts again W after the first
// copies, so later than W minus the gap after each copy, and after the
// output's duplicate window: every copy is a repeat, since the input
// stored it within W of its first. A stage that measured age on its own
// clock when it judged forwarded them again.
func TestDowntimeDoesNotAgeACopy(t *testing.T) {
	t.Parallel()
	const w = 4 * time.Second
	s, js, wl := shortWindowStage(t, w, 4901, "down")

	p := s.startReady()
	firsts := wl.mix(5, 0, 0, 0)
	first := time.Now()
	mustPublish(t, js, firsts, "first")
	waitDrained(t, js, 30*time.Second)
	p.signal(t, syscall.SIGTERM, 30*time.Second)

	var copies []event
	for _, e := range firsts {
		copies = append(copies, wl.copyOf(e.key))
	}
	mustPublish(t, js, copies, "copy")
	gap := time.Since(first)
	// A sleep on purpose: the stage stays down past its W after the first
	// copies, and past the output's duplicate window.
	time.Sleep(time.Until(first.Add(w + time.Second)))
	t.Logf("copies published %v after their first copies; the stage starts again %v after them (W %v)",
		gap.Round(time.Millisecond), time.Since(first).Round(time.Millisecond), w)

	s.startReady()
	waitDrained(t, js, 30*time.Second)
	compareForwards(t, "after the downtime", forwardsByKey(t, js), forwardsByInputTime(t, js, w, wl.dead))
	checkOutput(t, js, wl.forward)
	if n := s.metric("dedupe_messages_total", "outcome", "new"); n != 0 {
		t.Errorf("the run after the downtime judged %v copies new, want 0: each was stored %v after its first, within W = %v", n, gap.Round(time.Millisecond), w)
	}
	if n := s.metric("dedupe_messages_total", "outcome", "repeat"); n != float64(len(copies)) {
		t.Errorf("the run after the downtime judged %v copies repeats, want %d", n, len(copies))
	}
}

// planned is an input of a schedule: published at its offset from the
// schedule's start.
type planned struct {
	at time.Duration
	e  event
}

// gapPlan returns a seeded schedule of inputs over 3 x w: n keys, each
// first published at a random offset within the first w, of four kinds:
// once; a copy w - d after the first (a repeat); a copy w + d after it
// (forwarded again); and a chain: copies w - d, w + d and 2w after the
// first (a repeat, a forward that opens a new window, a repeat of that
// window). Bad inputs (a share pBad of the keys) come at random offsets.
// d is w/4: far more than the jitter of publishing at an offset, so that
// every run of the schedule stores the same gaps on the same side of W.
func gapPlan(wl *workload, rng *rand.Rand, w time.Duration, n int, pBad float64) []planned {
	d := w / 4
	var plan []planned
	for range n {
		if rng.Float64() < pBad {
			plan = append(plan, planned{time.Duration(rng.Int64N(int64(3 * w))), wl.bad()})
		}
		a := time.Duration(rng.Int64N(int64(w)))
		e := wl.fresh()
		plan = append(plan, planned{a, e})
		var gaps []time.Duration
		switch rng.IntN(4) {
		case 1:
			gaps = []time.Duration{w - d}
		case 2:
			gaps = []time.Duration{w + d}
		case 3:
			gaps = []time.Duration{w - d, w + d, 2 * w}
		}
		for _, g := range gaps {
			plan = append(plan, planned{a + g, wl.copyOf(e.key)})
		}
	}
	slices.SortStableFunc(plan, func(x, y planned) int { return int(x.at - y.at) })
	return plan
}

// plannedForwards is what plan must forward per key by its offsets (which
// gapPlan keeps clear of W by far more than publishing's jitter).
func plannedForwards(plan []planned, w time.Duration) map[string]int {
	var copies []copyAt
	for _, p := range plan {
		if p.e.bad == "" {
			copies = append(copies, copyAt{p.e.key, time.Time{}.Add(p.at)})
		}
	}
	return forwardsOf(copies, w)
}

// publishPlan publishes plan's inputs, each at its offset from now (those
// due together in one go), and fails the test if one is not stored.
func publishPlan(tb testing.TB, js jetstream.JetStream, plan []planned, round string) {
	tb.Helper()
	if err := publishPlanErr(js, plan, round); err != nil {
		tb.Fatal(err)
	}
}

// publishPlanErr is publishPlan for a goroutine other than the test's.
// It does not wait for an input's acknowledgement before it publishes the
// next (waiting stretched the gaps on a loaded machine); it waits for all
// of them at the end.
func publishPlanErr(js jetstream.JetStream, plan []planned, round string) error {
	start := time.Now()
	futures := make([]jetstream.PubAckFuture, 0, len(plan))
	for _, p := range plan {
		time.Sleep(time.Until(start.Add(p.at))) // on purpose: the schedule's gaps
		f, err := js.PublishMsgAsync(p.e.msg(round))
		if err != nil {
			return fmt.Errorf("publishing input %d: %w", p.e.id, err)
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("input %d not stored: %w", plan[i].e.id, err)
		}
	}
	return nil
}

// TestBacklogJudgedByInputTime publishes 3 x W of input while the stage is
// stopped: keys with copies at gaps just under and just over W, chains of
// copies across two windows, bad inputs. The stage then drains the
// backlog in a second or two: every copy stored within W of the copy that
// opened its key's window is a repeat, every later one is forwarded (with
// an id of its own), each bad input is dead-lettered once. A stage that
// judged the backlog by its own clock would take all of it as one window.
func TestBacklogJudgedByInputTime(t *testing.T) {
	t.Parallel()
	const w = 3 * time.Second
	s, js, wl := shortWindowStage(t, w, 4902, "backlog")
	rng := rand.New(rand.NewPCG(4902, 2))

	p := s.startReady() // creates the streams
	p.signal(t, syscall.SIGTERM, 30*time.Second)
	plan := gapPlan(wl, rng, w, 300, 0.05)
	publishPlan(t, js, plan, "backlog")

	s.startReady()
	waitDrained(t, js, 60*time.Second)
	want := forwardsByInputTime(t, js, w, wl.dead)
	compareForwards(t, "the schedule's forwards by input time", want, plannedForwards(plan, w))
	compareForwards(t, "the backlog drained", forwardsByKey(t, js), want)
	total, again := 0, 0
	for _, n := range want {
		total += n
		again += n - 1
	}
	if n := s.metric("dedupe_messages_total", "outcome", "new"); n != float64(total) {
		t.Errorf("the stage judged %v copies new, want %d (%d keys, %d forwarded again past W)", n, total, len(want), again)
	}
	if again == 0 {
		t.Fatal("the schedule forwards no key again: it tests nothing past W")
	}
	checkDeadLetters(t, js, wl.dead)
	t.Logf("%d inputs over %v; %d keys, %d forwards past W", len(plan), plan[len(plan)-1].at.Round(time.Millisecond), len(want), again)
}

// TestSameInputSameForwards runs one seeded schedule (gapPlan: keys,
// copies just under and just over W after their first, chains across two
// windows, bad inputs) through a fresh single instance that drains it as
// a backlog, a fresh group of three on a 3-node cluster that judges it as
// it comes, and a group of three whose members are killed (SIGKILL) and
// started again while it comes: each forwards the same keys, each as many
// times as the schedule's input times say, and dead-letters each bad
// input once.
func TestSameInputSameForwards(t *testing.T) {
	t.Parallel()
	const w = 3 * time.Second
	pw := newWorkload(4905, "det", 4096)
	plan := gapPlan(pw, rand.New(rand.NewPCG(4905, 3)), w, 200, 0.05)
	want := plannedForwards(plan, w)
	runs := []struct {
		name string
		run  func(t *testing.T) jetstream.JetStream
	}{
		{"one instance, a backlog", func(t *testing.T) jetstream.JetStream {
			srv := startNATSUnsynced(t)
			s := newStage(t, shortWindow(t, srv.URL(), w))
			js := publisherJS(t, srv.URL())
			s.startReady().signal(t, syscall.SIGTERM, 30*time.Second) // creates the streams
			publishPlan(t, js, plan, "det")
			s.startReady()
			waitDrained(t, js, 60*time.Second)
			return js
		}},
		{"a group of three", func(t *testing.T) jetstream.JetStream {
			stages, js := detGroup(t, 4906, w)
			publishPlan(t, js, plan, "det")
			scaleOutDrained(t, js, stages[0].cfg.Partitions, takeoverWait)
			return js
		}},
		{"a group of three with kills", func(t *testing.T) jetstream.JetStream {
			stages, js := detGroup(t, 4907, w)
			done := make(chan error, 1)
			go func() { done <- publishPlanErr(js, plan, "det") }()
			for _, i := range []int{1, 2} {
				time.Sleep(w) // on purpose: a kill in each W of the schedule
				t.Logf("SIGKILL i%d", i)
				stages[i].last().kill(t)
				stages[i].startReady()
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			scaleOutDrained(t, js, stages[0].cfg.Partitions, takeoverWait)
			return js
		}},
	}
	got := make([]map[string]int, len(runs))
	t.Run("runs", func(t *testing.T) {
		for i, r := range runs {
			t.Run(r.name, func(t *testing.T) {
				t.Parallel()
				js := r.run(t)
				got[i] = onlyPrefix(forwardsByKey(t, js), pw.prefix+"-")
				compareForwards(t, r.name+": by the input times it stored", onlyPrefix(forwardsByInputTime(t, js, w, pw.dead), pw.prefix+"-"), want)
				compareForwards(t, r.name, got[i], want)
				checkDeadLetters(t, js, pw.dead)
			})
		}
	})
	for i := 1; i < len(runs); i++ {
		if got[0] != nil && got[i] != nil {
			compareForwards(t, runs[i].name+" against "+runs[0].name, got[i], got[0])
		}
	}
	again := 0
	for _, n := range want {
		again += n - 1
	}
	t.Logf("%d inputs over %v: %d keys, %d forwards past W, %d bad inputs", len(plan), plan[len(plan)-1].at.Round(time.Millisecond), len(want), again, len(pw.dead))
}

// onlyPrefix returns the entries of m whose key begins with prefix.
func onlyPrefix(m map[string]int, prefix string) map[string]int {
	out := map[string]int{}
	for k, n := range m {
		if strings.HasPrefix(k, prefix) {
			out[k] = n
		}
	}
	return out
}

// detGroup is a group of three with W = w on a 3-node cluster of
// nats-server processes (the cluster in this test process is slowed by
// the race detector more than the schedule's gaps allow), warmed up with
// keys of its own.
func detGroup(t *testing.T, seed uint64, w time.Duration) ([]*stage, jetstream.JetStream) {
	t.Helper()
	cl := startNATSClusterWith(t, 3, false)
	return scaleOutGroupAt(t, cl.URLs(), 3, newWorkload(seed, "warm", 4096), func(c *stageConfig) { c.Extra += windowYAML(w, false) })
}
