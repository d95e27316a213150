package faults

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// streamPlacement returns the node (its index) that leads stream and how
// many replicas the stream has; -1 while it has no leader.
func streamPlacement(js jetstream.JetStream, stream string) (leader, replicas int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return -1, 0
	}
	info, err := st.Info(ctx)
	if err != nil || info.Cluster == nil {
		return -1, 0
	}
	n, err := strconv.Atoi(strings.TrimPrefix(info.Cluster.Leader, "n"))
	if err != nil || !strings.HasPrefix(info.Cluster.Leader, "n") {
		return -1, info.Config.Replicas
	}
	return n, info.Config.Replicas
}

// TestTotalsSurviveANodeKill runs a group of one instance with totals on a
// 3-node cluster of nats-server processes (R3 streams, totals to a KV
// bucket the stage creates) and SIGKILLs, mid-run, the node that leads the
// totals bucket; the node stays down to the end. The bucket has three
// replicas like the streams (totals.replicas 0 follows scale_out.replicas),
// so every total still ends equal to the number of keys of its group and
// minute; with one replica, as before, the node took every total with it.
// The output and the dead letters are exact too.
func TestTotalsSurviveANodeKill(t *testing.T) {
	t.Parallel()
	c := newClock(t)
	w := newWorkload(testSeed(t), "totnode", 4096)
	cl := startNATSCluster(t, 3)
	cfg := scaleOutConfig(t, cl.URLs(), "i0")
	cfg.Extra += totalsExtra
	s := newStage(t, cfg)
	s.startReady()
	js := publisherJS(t, cl.URLs())
	warmUp(t, js, []*stage{s}, w)

	kvStream := "KV_" + totalsKV
	var node, replicas int
	natstest.WaitFor(t, 30*time.Second, kvStream+" to have a leader", func() bool {
		node, replicas = streamPlacement(js, kvStream)
		return node >= 0
	})
	if replicas != 3 {
		t.Errorf("the totals bucket has %d replicas, want 3 like the stage's streams (scale_out.replicas)", replicas)
	}
	wait := publishBehind(t, js, w.mix(3000, 0.3, 0.02, 0), "run", 600)
	outputGrows(t, js, 500, "the instance at work")
	c.logf("SIGKILL node %d, the leader of %s (%d replicas); it stays down", node, kvStream, replicas)
	cl.stop(node, syscall.SIGKILL)
	wait()
	c.logf("inputs published")
	scaleOutDrained(t, js, cfg.Partitions, 90*time.Second)
	c.logf("drained; %s led by node %d now", kvStream, func() int { n, _ := streamPlacement(js, kvStream); return n }())
	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)
	keys := make([]string, 0, len(w.forward))
	for k := range w.forward {
		keys = append(keys, k)
	}
	checkTotals(t, js, totalsTruth(keys), 30*time.Second)
	if p := s.last(); !p.Running() {
		t.Errorf("the instance exited: %v\n%s", p.Err(), crashReport(p.Log()))
	}
	c.logf("%d keys, %d dead letters, %d totals checked; %.0f totals flush failures", len(w.forward), len(w.dead), len(totalsTruth(keys)),
		s.metric("dedupe_sink_writes_total", "result", "error"))
}
