package stage_test

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// keysOfPartition returns n keys of partition p (of 4), with their
// payloads added to payload.
func keysOfPartition(prefix string, p, n int, payload map[string][]byte) []string {
	var ks []string
	for i := 0; len(ks) < n; i++ {
		k := fmt.Sprintf("%s-%d", prefix, i)
		if partitionOf(k, 4) == p {
			payload[k] = []byte(k)
			ks = append(ks, k)
		}
	}
	return ks
}

// blockPartition makes r's worker of partition p wait in its first batch
// that publishes, until the returned unblock runs; entered is closed once
// it waits.
func blockPartition(r *running, p int) (entered <-chan struct{}, unblock func()) {
	in, gate := make(chan struct{}), make(chan struct{})
	var once, unonce sync.Once
	r.st.SetBeforePublishHook(func(part, _ int) {
		if part != p {
			return
		}
		once.Do(func() { close(in) })
		<-gate
	})
	return in, func() { unonce.Do(func() { close(gate) }) }
}

// TestScaleOutReleaseGivesBackHeld releases a partition for balance while
// its owner a holds many of its messages, delivered and not forwarded,
// one batch of them in flight, with input.ack_wait at 60s: the batch in
// flight is forwarded by a, the rest is given back (nak) at the release,
// and b, standing by, forwards every key once long before ack_wait could
// have redelivered anything.
func TestScaleOutReleaseGivesBackHeld(t *testing.T) {
	e := newScaleOutEnv(t)
	e.cfg.Input.AckWait = config.Duration(60 * time.Second)
	ea, eb := e.as("a"), e.as("b")
	payload := map[string][]byte{}
	const p = 1
	warm := keysOfPartition("warm", p, 20, payload)
	a := ea.start()
	e.publishKeys(warm, payload)
	e.scaleOutDrained(30 * time.Second)
	natstest.WaitFor(t, 30*time.Second, "a alone to own every partition", func() bool { return gauge(t, a.reg, "dedupe_partitions_owned") == 4 })
	b := eb.start()
	entered, unblock := blockPartition(a, p)
	defer unblock()
	held := keysOfPartition("held", p, 600, payload)
	e.publishKeys(held, payload)
	<-entered
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.st.ReleasePartition(p)
	}()
	// The release stops consuming and waits for the batch in flight: a
	// sleep on purpose, the batch is held a while after the release.
	time.Sleep(2 * time.Second)
	unblock()
	<-done
	e.scaleOutDrained(20 * time.Second)
	took := time.Since(start)
	e.checkOnce(e.scaleOutOutput(), payload)
	t.Logf("every key of the released partition forwarded once %v after the release (ack_wait 60s)", took.Round(time.Millisecond))
	if got := counter(t, a.reg, "dedupe_stale_pin_messages_total", nil); got < 1 {
		t.Errorf("a gave back %v messages at the release, want some (it held them)", got)
	}
	if got := counter(t, b.reg, "dedupe_partition_takeovers_total", map[string]string{"partition": "1"}); got != 1 {
		t.Errorf("b took over the released partition %v times, want 1", got)
	}
}

// TestScaleOutStopGivesBackHeld stops instance a while it holds many
// messages of a partition, one batch in flight, with input.ack_wait at
// 60s: a finishes the batch in flight, gives back the rest and unpins, so
// b forwards every key once long before ack_wait.
func TestScaleOutStopGivesBackHeld(t *testing.T) {
	e := newScaleOutEnv(t)
	e.cfg.Input.AckWait = config.Duration(60 * time.Second)
	ea, eb := e.as("a"), e.as("b")
	payload := map[string][]byte{}
	const p = 2
	a := ea.start()
	e.publishKeys(keysOfPartition("warm", p, 20, payload), payload)
	e.scaleOutDrained(30 * time.Second)
	// Alone in the group, a takes every partition before traffic.
	natstest.WaitFor(t, 30*time.Second, "a alone to own every partition", func() bool { return gauge(t, a.reg, "dedupe_partitions_owned") == 4 })
	b := eb.start()
	entered, unblock := blockPartition(a, p)
	defer unblock()
	held := keysOfPartition("held", p, 600, payload)
	e.publishKeys(held, payload)
	<-entered
	start := time.Now()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		a.stop(t)
	}()
	// The stop waits for the batch in flight, and this process (both
	// instances and the server) has nothing to do meanwhile but wait.
	cpu := processCPU(t)
	select {
	case <-stopped:
		t.Fatal("the stop returned while a batch was in flight")
	case <-time.After(time.Second):
	}
	used := processCPU(t) - cpu
	if used > 500*time.Millisecond {
		t.Errorf("the process used %v of CPU in the second the stop waited for the batch in flight, want it idle: something spins", used)
	}
	t.Logf("CPU used in the second the stop waited: %v", used)
	unblock()
	<-stopped
	e.scaleOutDrained(20 * time.Second)
	took := time.Since(start)
	e.checkOnce(e.scaleOutOutput(), payload)
	t.Logf("every key forwarded once %v after a's stop began (ack_wait 60s)", took.Round(time.Millisecond))
	if got := counter(t, b.reg, "dedupe_partition_takeovers_total", nil); got < 1 {
		t.Errorf("b took over %v partitions, want at least 1", got)
	}
}

// TestScaleOutBalanceSettles starts three instances of a group of 8
// partitions, apart by gap, while the input flows to every partition: the
// group settles at 3/3/2 partitions (the quotas add up to 8), and within
// two ack_waits of the last join (the count follows a join through the
// presence watch, not at the next refresh).
func TestScaleOutBalanceSettles(t *testing.T) {
	for _, gap := range []time.Duration{300 * time.Millisecond, 6 * time.Second} {
		t.Run(gap.String(), func(t *testing.T) {
			e := newScaleOutEnv(t)
			e.cfg.State.Partitions = 8
			ackWait := e.cfg.Input.AckWait.D()
			payload := map[string][]byte{}
			var sent []string
			round := 0
			flow := func() {
				var ks []string
				for i := range 40 {
					k := fmt.Sprintf("r%d-%d", round, i)
					payload[k] = []byte(k)
					ks = append(ks, k)
				}
				round++
				sent = append(sent, ks...)
				e.publishKeys(ks, payload)
			}
			var rs []*running
			for i, name := range []string{"a", "b", "c"} {
				if i > 0 {
					// On purpose: the input flows for gap between joins.
					for end := time.Now().Add(gap); time.Now().Before(end); {
						flow()
						time.Sleep(100 * time.Millisecond)
					}
				}
				rs = append(rs, e.as(name).start())
			}
			joined := time.Now()
			owned := func() []int {
				var n []int
				for _, r := range rs {
					n = append(n, int(gauge(t, r.reg, "dedupe_partitions_owned")))
				}
				return n
			}
			natstest.Poll(t, 90*time.Second, 100*time.Millisecond, "a, b, c to own 3/3/2 partitions after the last join", func() (bool, error) {
				flow()
				n := owned()
				return n[0] == 3 && n[1] == 3 && n[2] == 2, fmt.Errorf("a, b, c own %v", n)
			})
			settled := time.Since(joined)
			t.Logf("settled at 3/3/2, %v after the last join (ack_wait %v)", settled.Round(time.Millisecond), ackWait)
			if settled > 2*ackWait+4*time.Second {
				t.Errorf("settled %v after the last join, want within two ack_waits (%v) and a margin", settled, 2*ackWait)
			}
			e.scaleOutDrained(60 * time.Second)
			e.checkOnce(e.scaleOutOutput(), payload)
		})
	}
}

// TestScaleOutBacklogMetric: in a group, dedupe_consumer_pending_messages
// is the backlog of the partitions the instance owns. While a's worker of
// a partition is held in a batch, the partition's messages wait on its
// consumer and the gauge shows them; once it is let go and the input is
// drained, the gauge returns to 0.
func TestScaleOutBacklogMetric(t *testing.T) {
	e := newScaleOutEnv(t)
	payload := map[string][]byte{}
	const p = 3
	a := e.as("a").start()
	e.publishKeys(keysOfPartition("warm", p, 20, payload), payload)
	e.scaleOutDrained(30 * time.Second)
	entered, unblock := blockPartition(a, p)
	defer unblock()
	e.publishKeys(keysOfPartition("held", p, 600, payload), payload)
	<-entered
	backlog := func() float64 {
		return metrictest.Sum(t, a.reg, "dedupe_consumer_pending_messages", nil)
	}
	natstest.Poll(t, 30*time.Second, 200*time.Millisecond, "the held partition's backlog in dedupe_consumer_pending_messages", func() (bool, error) {
		n := backlog()
		return n >= 100, fmt.Errorf("the gauge shows %v messages, want at least 100 of the 600 held", n)
	})
	unblock()
	e.scaleOutDrained(30 * time.Second)
	e.checkOnce(e.scaleOutOutput(), payload)
	natstest.Poll(t, 30*time.Second, 200*time.Millisecond, "the backlog gauge back to 0", func() (bool, error) {
		n := backlog()
		return n == 0, fmt.Errorf("the gauge shows %v messages after the drain", n)
	})
}

// processCPU returns the CPU time this process has used (user and
// system).
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestScaleOutBalancedBeforeTraffic starts three instances of a group of 8
// partitions before any message: they own every partition, 3/3/2 (their
// quotas by name), before the first message, each taken with nothing to
// restore (path empty). Then the input flows: while the three stay, no
// partition is released or taken again, and each key is forwarded once.
// Settled, each member is pulled on by its owner and one successor, not
// by every instance.
func TestScaleOutBalancedBeforeTraffic(t *testing.T) {
	e := newScaleOutEnv(t)
	e.cfg.State.Partitions = 8
	var rs []*running
	for _, name := range []string{"a", "b", "c"} {
		rs = append(rs, e.as(name).start())
	}
	owned := func() []int {
		var n []int
		for _, r := range rs {
			n = append(n, int(gauge(t, r.reg, "dedupe_partitions_owned")))
		}
		return n
	}
	sum := func(name string, labels map[string]string) float64 {
		var s float64
		for _, r := range rs {
			s += counter(t, r.reg, name, labels)
		}
		return s
	}
	natstest.Poll(t, 60*time.Second, 100*time.Millisecond, "a, b, c to own 3/3/2 partitions before any message", func() (bool, error) {
		n := owned()
		return n[0] == 3 && n[1] == 3 && n[2] == 2 && sum("dedupe_partition_takeovers_total", nil) >= 8,
			fmt.Errorf("a, b, c own %v", n)
	})
	takeovers, releases := sum("dedupe_partition_takeovers_total", nil), sum("dedupe_partition_releases_total", nil)
	if empty := sum("dedupe_restore_path_total", map[string]string{"path": "empty"}); empty != takeovers {
		t.Errorf("%v of the %v takeovers before traffic restored nothing (path empty), want all", empty, takeovers)
	}
	t.Logf("before traffic: %v takeovers, %v releases (the joins)", takeovers, releases)

	payload := map[string][]byte{}
	for round := range 30 {
		var ks []string
		for i := range 40 {
			k := fmt.Sprintf("r%d-%d", round, i)
			payload[k] = []byte(k)
			ks = append(ks, k)
		}
		e.publishKeys(ks, payload)
		time.Sleep(100 * time.Millisecond)
	}
	e.scaleOutDrained(60 * time.Second)
	e.checkOnce(e.scaleOutOutput(), payload)
	if got := sum("dedupe_partition_releases_total", nil); got != releases {
		t.Errorf("the group released %v partitions for balance while its membership held, want 0", got-releases)
	}
	if got := sum("dedupe_partition_takeovers_total", nil); got != takeovers {
		t.Errorf("the group took partitions %v times while its membership held, want 0", got-takeovers)
	}
	if n := owned(); n[0] != 3 || n[1] != 3 || n[2] != 2 {
		t.Errorf("after the traffic a, b, c own %v, want 3/3/2", n)
	}
	// Settled, each instance pulls on what it owns and on the partitions
	// it succeeds (one successor each, scale_out.standbys 1): 16 members
	// consumed of the 8 x 3 an instance pulling on every partition would.
	natstest.Poll(t, 30*time.Second, 200*time.Millisecond, "the group to consume each member from its owner and one successor", func() (bool, error) {
		var n []int
		total := 0
		for _, r := range rs {
			n = append(n, int(gauge(t, r.reg, "dedupe_members_consumed")))
			total += n[len(n)-1]
		}
		return total == 16, fmt.Errorf("a, b, c consume %v members, %d in all", n, total)
	})
}
