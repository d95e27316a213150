package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// natsCluster is a cluster of nats-server processes with JetStream
// (natstest.Procs), each node restartable on its ports and store after a
// SIGKILL: unlike natstest.Cluster's in-process nodes, whose shutdown
// hands the node's leaderships over first, a killed process takes them
// down with it.
type natsCluster struct {
	*natstest.Procs
	tb testing.TB
}

// startNATSCluster starts an n-node cluster (node i is named "n<i>") that
// syncs every write, and waits until a replicated stream can be placed on
// every node; every node is stopped when the test ends.
func startNATSCluster(tb testing.TB, n int) *natsCluster {
	tb.Helper()
	return startNATSClusterWith(tb, n, true)
}

// startNATSClusterWith is startNATSCluster; without syncAlways the nodes
// keep nats-server's default sync interval, for a test that kills no node
// (as startNATSUnsynced).
func startNATSClusterWith(tb testing.TB, n int, syncAlways bool) *natsCluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := natstest.StartProcs(ctx, natstest.ProcsSpec{Bin: natsBin, Dir: tb.TempDir(), Nodes: n, SyncAlways: syncAlways})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if !c.Stop(20 * time.Second) {
			tb.Errorf("a nats-server node still ran 20s after SIGTERM; killed")
		}
	})
	return &natsCluster{Procs: c, tb: tb}
}

// stop stops node i with sig and waits for it to exit; it fails the test
// when the node is still running 30s later.
func (c *natsCluster) stop(i int, sig syscall.Signal) {
	c.tb.Helper()
	if !c.Nodes[i].Stop(sig, 30*time.Second) {
		c.tb.Fatalf("nats-server n%d still running 30s after %v; killed", i, sig)
	}
}

// start starts node i again and waits until JetStream answers on it.
func (c *natsCluster) start(i int) {
	c.tb.Helper()
	if err := c.Nodes[i].Start(context.Background(), 30*time.Second); err != nil {
		c.tb.Fatal(err)
	}
}

// leaderKillDup is the output stream's duplicate window in
// TestScaleOutLeaderKills: the shortest the stage accepts without
// output.allow_short_duplicate_window (input.ack_wait 2s plus
// output.restart_margin 500ms, rounded up), shorter than every outage, so
// that a batch retried across an outage is caught by the fence and the
// stage's landed check, never by the stream's window.
const leaderKillDup = 3 * time.Second

// leaderOf returns the cluster node (its index) that leads the output
// stream, or with consumer set the consumer of routedStream by that name,
// and whether every replica is current; -1 while there is no leader.
func leaderOf(js jetstream.JetStream, consumer string) (node int, current bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var ci *jetstream.ClusterInfo
	if consumer == "" {
		st, err := js.Stream(ctx, outputStream)
		if err != nil {
			return -1, false
		}
		info, err := st.Info(ctx)
		if err != nil {
			return -1, false
		}
		ci = info.Cluster
	} else {
		c, err := js.Consumer(ctx, routedStream, consumer)
		if err != nil {
			return -1, false
		}
		info, err := c.Info(ctx)
		if err != nil {
			return -1, false
		}
		ci = info.Cluster
	}
	if ci == nil || !strings.HasPrefix(ci.Leader, "n") {
		return -1, false
	}
	n, err := strconv.Atoi(strings.TrimPrefix(ci.Leader, "n"))
	if err != nil {
		return -1, false
	}
	current = len(ci.Replicas) == 2
	for _, r := range ci.Replicas {
		current = current && r.Current && !r.Offline
	}
	return n, current
}

// waitQuorum waits until the output stream and every partition consumer
// have a leader and every replica of each is current again.
func waitQuorum(tb testing.TB, js jetstream.JetStream, partitions int, timeout time.Duration) {
	tb.Helper()
	names := []string{""}
	for p := range partitions {
		names = append(names, "dedupe-p"+strconv.Itoa(p))
	}
	for _, name := range names {
		what := "the output stream"
		if name != "" {
			what = "consumer " + name
		}
		natstest.WaitFor(tb, timeout, what+" to have a leader and 3 current replicas", func() bool {
			n, current := leaderOf(js, name)
			return n >= 0 && current
		})
	}
}

// TestScaleOutLeaderKills SIGKILLs, four times at seeded random moments
// (DEDUPE_FAULTS_SEED replays them), the node leading the output stream or
// a partition's consumer while two instances work: each key is in the
// output once and the dead letters are the bad inputs once each. The bugs
// it found and their own tests are in docs/faults.md and docs/failures.md.
func TestScaleOutLeaderKills(t *testing.T) {
	t.Parallel()
	start := time.Now()
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, seed>>1))

	w := newWorkload(seed, "lk", 4096)
	cl := startNATSCluster(t, 3)
	stages := make([]*stage, 2)
	for i := range stages {
		c := scaleOutConfig(t, cl.URLs(), "i"+strconv.Itoa(i))
		c.DuplicateWindow = leaderKillDup
		c.RestartMargin = 500 * time.Millisecond
		stages[i] = newStage(t, c)
		stages[i].startReady()
	}
	js := publisherJS(t, cl.URLs())
	warmUp(t, js, stages, w)
	parts := stages[0].cfg.Partitions
	t.Logf("warm-up done after %v", time.Since(start).Round(time.Millisecond))

	const rounds = 4
	wait := publishBehind(t, js, w.mix(5000, 0.3, 0.02, 0), "run", 250)
	for round := 1; round <= rounds; round++ {
		time.Sleep(time.Duration(rng.IntN(1000)) * time.Millisecond)
		what := "the output stream"
		name := ""
		if rng.IntN(2) == 1 {
			name = "dedupe-p" + strconv.Itoa(rng.IntN(parts))
			what = "consumer " + name
		}
		var node int
		natstest.WaitFor(t, 30*time.Second, what+" to have a leader", func() bool {
			node, _ = leaderOf(js, name)
			return node >= 0
		})
		t.Logf("round %d (%v): SIGKILL node %d, the leader of %s", round, time.Since(start).Round(time.Millisecond), node, what)
		cl.stop(node, syscall.SIGKILL)
		time.Sleep(leaderKillDup + time.Second)
		t.Logf("round %d (%v): starting node %d again", round, time.Since(start).Round(time.Millisecond), node)
		cl.start(node)
		// How long a restarted node takes to catch up is the server's and
		// the machine's: 30s ran out once with three test lanes on two
		// cores. The stage's part is judged by the checks after the rounds.
		waitQuorum(t, js, parts, 90*time.Second)
		t.Logf("round %d (%v): every replica current again", round, time.Since(start).Round(time.Millisecond))
	}
	wait()
	t.Logf("published after %v", time.Since(start).Round(time.Millisecond))
	scaleOutDrained(t, js, parts, 60*time.Second)
	// Copies of the first keys after the window: the stage's store and the
	// partitions' restored state catch them, not the stream.
	waitWindowPassed(t, js, w.keys[:min(300, len(w.keys))], leaderKillDup)
	mustPublish(t, js, w.lateCopies(300), "late")
	scaleOutDrained(t, js, parts, 60*time.Second)
	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)
	if t.Failed() {
		logDoubled(t, js, stages)
	}
	for _, s := range stages {
		if !s.last().Running() {
			t.Errorf("instance %s exited during the node losses: %v\n%s", s.cfg.Extra, s.last().Err(), crashReport(s.last().Log()))
			continue
		}
		// What the outages did to the instance, for the log.
		var counts []string
		for _, m := range []string{"dedupe_publish_retries_total", "dedupe_commit_retries_total", "dedupe_fence_refusals_total", "dedupe_partition_takeovers_total"} {
			counts = append(counts, fmt.Sprintf("%s=%v", strings.TrimPrefix(m, "dedupe_"), s.metric(m)))
		}
		warns := map[string]int{}
		for _, l := range strings.Split(s.last().Log(), "\n") {
			if i := strings.Index(l, `"msg":"`); i >= 0 && (strings.Contains(l, `"level":"WARN"`) || strings.Contains(l, `"level":"ERROR"`)) {
				warns[strings.SplitN(l[i+7:], `"`, 2)[0]]++
			}
		}
		counts = append(counts, fmt.Sprintf("warnings=%v", warns))
		t.Logf("instance %s: %s", strings.TrimSpace(strings.TrimPrefix(strings.Split(s.cfg.Extra, "\n")[2], "  instance:")), strings.Join(counts, " "))
	}
	t.Logf("%d keys, %d dead letters checked; wall time %v", len(w.forward), len(w.dead), time.Since(start).Round(time.Millisecond))
}

// logDoubled logs, after a failed check, every output message of a key the
// output holds more than once (sequence, subject, headers) and each
// instance's warnings around them, to tell which batch wrote it twice.
func logDoubled(t *testing.T, js jetstream.JetStream, stages []*stage) {
	t.Helper()
	byKey := map[string][]natstest.Message{}
	for _, m := range natstest.ReadAll(t, js, outputStream) {
		if strings.Contains(m.Subject, ".fence.") {
			// Who held which partition from which sequence on.
			t.Logf("fence: seq %d subject %s %s", m.Seq, m.Subject, m.Data)
			continue
		}
		k := m.Header.Get(jetstream.MsgIDHeader)
		byKey[k] = append(byKey[k], m)
	}
	for k, ms := range byKey {
		if len(ms) < 2 || k == "" {
			continue
		}
		for _, m := range ms {
			t.Logf("output of %s: seq %d subject %s headers %v", k, m.Seq, m.Subject, m.Header)
		}
	}
	for i, s := range stages {
		n := 0
		for _, l := range strings.Split(s.last().Log(), "\n") {
			// The warnings, and every step of a partition's hand-over.
			story := strings.Contains(l, "partition taken") || strings.Contains(l, "restoring the partition") ||
				strings.Contains(l, "released") || strings.Contains(l, "tenure")
			if (story || strings.Contains(l, `"level":"WARN"`) || strings.Contains(l, `"level":"ERROR"`)) && !strings.Contains(l, "routed publishes") && n < 300 {
				n++
				t.Logf("i%d: %.400s", i, l)
			}
		}
	}
}
