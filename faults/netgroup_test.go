package faults

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/netfault"
)

// clientProxies starts a proxy to each node of cl and returns them with
// their URLs, comma-separated: a stage given those URLs reaches the
// cluster only through the proxies (the cluster must not advertise its
// nodes' own addresses: netfault.Routes.Edit, or noClientAdvertise).
func clientProxies(t *testing.T, cl *natstest.Cluster) ([]*netfault.Proxy, string) {
	t.Helper()
	var ps []*netfault.Proxy
	var urls []string
	for i := range cl.Size() {
		u, err := url.Parse(cl.URL(i))
		if err != nil {
			t.Fatal(err)
		}
		p := netfault.Start(t, u.Host)
		ps = append(ps, p)
		urls = append(urls, p.URL())
	}
	return ps, strings.Join(urls, ",")
}

// noClientAdvertise is a natstest.StartClusterWith edit that keeps the
// nodes from telling clients each other's addresses, so that a client
// behind proxies cannot reconnect around them.
func noClientAdvertise(_ int, o *server.Options) { o.Cluster.NoAdvertise = true }

// instanceName is the scale-out instance name of s (scaleOutConfig).
func (s *stage) instanceName() string {
	_, after, _ := strings.Cut(s.cfg.Extra, "instance: ")
	name, _, _ := strings.Cut(after, "\n")
	return name
}

// groupReport is what an instance says about itself: its health, its
// partitions and what its group did, for the log.
func (s *stage) groupReport() string {
	if p := s.last(); p == nil || !p.Running() {
		return s.instanceName() + " not running"
	}
	r := s.readSignals()
	return fmt.Sprintf("%s: %v; partitions owned %v, takeovers %v, fence refusals %v, publish retries %v",
		s.instanceName(), r, s.metric("dedupe_partitions_owned"), s.metric("dedupe_partition_takeovers_total"),
		s.metric("dedupe_fence_refusals_total"), s.metric("dedupe_publish_retries_total"))
}

// warnings counts the distinct warning and error messages of log, from
// byte offset from on.
func warnings(log string, from int) map[string]int {
	out := map[string]int{}
	for _, l := range strings.Split(log[min(from, len(log)):], "\n") {
		if !strings.Contains(l, `"level":"WARN"`) && !strings.Contains(l, `"level":"ERROR"`) {
			continue
		}
		if i := strings.Index(l, `"msg":"`); i >= 0 {
			out[strings.SplitN(l[i+7:], `"`, 2)[0]]++
		}
	}
	return out
}

// TestGroupOwnerCutOff cuts an instance of a two-instance group off the
// cluster while its process runs on (every link to every node held both
// ways: unlike a SIGSTOP, its timers and goroutines keep going) in the
// middle of a burst, until the other instance has taken every partition,
// which takes longer than the pin's TTL; then the links return. The
// instance that was cut has batches judged before the cut: their publishes,
// held by the cut and delivered when it ends, and any it retries, are
// refused by the fences the new owner took (its
// dedupe_fence_refusals_total grows). It gets its share of the partitions
// back without a restart, and every key is in the output once and every
// bad input dead-lettered once.
func TestGroupOwnerCutOff(t *testing.T) {
	t.Parallel()
	c := newClock(t)
	w := newWorkload(testSeed(t), "cutoff", 4096)
	cl := natstest.StartClusterWith(t, 3, noClientAdvertise)
	proxies, proxied := clientProxies(t, cl)
	var stages []*stage
	for _, in := range []struct{ url, name string }{{proxied, "a"}, {cl.URLs(), "b"}} {
		cfg := scaleOutConfig(t, in.url, in.name)
		// The shortest duplicate window the stage accepts (as in
		// TestScaleOutLeaderKills), so that the cut outlasts it soon and
		// what a sends after it is refused by a fence, not by the window.
		cfg.DuplicateWindow, cfg.RestartMargin = leaderKillDup, 500*time.Millisecond
		stages = append(stages, newStage(t, cfg))
		stages[len(stages)-1].startReady()
	}
	a, b := stages[0], stages[1]
	js := publisherJS(t, cl.URLs())
	warmUp(t, js, stages, w)
	parts := a.cfg.Partitions

	wait := publishBehind(t, js, w.mix(4000, 0.3, 0.02, 0), "burst", 2000)
	outputGrows(t, js, 400, "the group forwarding the burst")
	pid := a.last().Pid()
	c.logf("cut: every link of instance a (pid %d) held, a owning %v partitions", pid, a.metric("dedupe_partitions_owned"))
	for _, p := range proxies {
		p.Cut()
	}
	natstest.WaitFor(t, takeoverWait, "b to take every partition while a is cut off", func() bool {
		return b.owned() == parts
	})
	c.logf("b owns all %d partitions; a says %s", parts, a.groupReport())
	wait()
	scaleOutDrained(t, js, parts, 60*time.Second)
	// A sleep on purpose: the cut outlasts the output's duplicate window
	// after b forwarded what a held.
	time.Sleep(leaderKillDup + time.Second)
	c.logf("the burst is published and b has judged all of it")
	for _, p := range proxies {
		p.Restore()
	}
	c.logf("the links of a are back")
	natstest.WaitFor(t, 30*time.Second, "a write of a to be refused by a fence", func() bool {
		return a.metric("dedupe_fence_refusals_total") > 0
	})
	waitSpread(t, js, w, stages, takeoverWait)
	scaleOutDrained(t, js, parts, 60*time.Second)
	c.logf("a has its share back: %s; %s", a.groupReport(), b.groupReport())
	if p := a.last(); p.Pid() != pid || len(a.runs) != 1 || !p.Running() {
		t.Errorf("instance a was restarted or exited: %v", p.Err())
	}
	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)
	c.logf("a's warnings from the cut on: %v", warnings(a.last().Log(), 0))
}

// TestNodeCutFromPeers cuts one node of a 3-node cluster from its peers
// (its routes, through proxies, held both ways) for 20 s while two
// instances of a group work: b is connected to that node alone, a to the
// other two. The node keeps serving its clients, but has no quorum: b can
// reach no stream leader, its pins expire and a takes its partitions; when
// the routes return, b gets its share back. Every key is in the output once
// and every bad input dead-lettered once; what each instance reports and
// logs while the node is cut is written to the test's log.
func TestNodeCutFromPeers(t *testing.T) {
	t.Parallel()
	c := newClock(t)
	w := newWorkload(testSeed(t), "nodecut", 4096)
	routes := netfault.NewRoutes(t)
	cl := natstest.StartClusterWith(t, 3, routes.Edit)
	const cut, node = 20 * time.Second, 2
	stages := []*stage{
		newStage(t, scaleOutConfig(t, cl.URL(0)+","+cl.URL(1), "a")),
		newStage(t, scaleOutConfig(t, cl.URL(node), "b")),
	}
	for _, s := range stages {
		s.startReady()
	}
	a, b := stages[0], stages[1]
	js := publisherJS(t, cl.URL(0)+","+cl.URL(1))
	warmUp(t, js, stages, w)
	parts := a.cfg.Partitions

	wait := publishBehind(t, js, w.mix(6000, 0.3, 0.02, 0), "run", 250)
	outputGrows(t, js, 300, "the group at work")
	logFrom := []int{len(a.last().Log()), len(b.last().Log())}
	c.logf("node %d cut from its peers (%d route proxies held) for %v; b is connected to it alone", node, routes.Isolate(node), cut)
	for end := time.Now().Add(cut); time.Now().Before(end); time.Sleep(5 * time.Second) {
		c.logf("during the cut: %s", a.groupReport())
		c.logf("during the cut: %s", b.groupReport())
	}
	routes.Heal(node)
	c.logf("node %d's routes are back", node)
	for i, s := range stages {
		c.logf("%s logged during the cut: %v", s.instanceName(), warnings(s.last().Log(), logFrom[i]))
	}
	wait()
	scaleOutDrained(t, js, parts, 90*time.Second)
	waitSpread(t, js, w, stages, takeoverWait)
	c.logf("after: %s; %s", a.groupReport(), b.groupReport())
	for _, s := range stages {
		if p := s.last(); len(s.runs) != 1 || !p.Running() {
			t.Errorf("instance %s exited: %v", s.instanceName(), p.Err())
		}
	}
	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)
	c.logf("%d keys, %d dead letters checked", len(w.forward), len(w.dead))
}
