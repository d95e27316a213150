package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// groupStartRounds is how many fresh clusters TestScaleOutGroupStart starts
// a group on, unless DEDUPE_FAULTS_GROUPSTART_ROUNDS says another count.
const groupStartRounds = 10

// groupStartBound is how long after the last instance of a group is ready
// every partition with waiting input must have an owner, and how long
// after its release for balance a partition must have its next one: in
// the median round. A round is the cluster's first minute, whose leader
// elections may leave a request unanswered for a while; one slow round is
// the cluster's, a slow median the group's.
const groupStartBound = 2 * time.Second

// groupStartWatch is how long after the last instance of a group is
// ready TestScaleOutGroupStart watches the group at most: past the bound,
// and past the releases for balance a start of three instances makes.
const groupStartWatch = 4 * time.Second

// groupStartReady is how long after their start the instances of a group
// started together must be ready.
const groupStartReady = 4 * time.Second

// groupStartOrphan is how long after its release for balance a partition
// not taken by the end of the watch is waited for: a take within it
// counts toward the median round's bound like any slow one (a partition
// whose input stalls for a while, as when the cluster's elections stall
// the route step's pulls, is taken only once a message comes); none
// within it is a partition left without an owner.
const groupStartOrphan = 15 * time.Second

// TestScaleOutGroupStart starts three instances of a group at the same
// moment on a fresh 3-node cluster (R3 streams, the buckets and streams
// created by the instances at once) with input waiting in every
// partition, round after round (groupStartRounds): every instance is ready within
// groupStartReady, every partition is taken within groupStartWatch of the
// last instance being ready, and again within groupStartOrphan of a
// release for balance, in the median round within groupStartBound, and no
// instance exits.
// It logs the time from the start to the first forwarded message of each
// round, and their median and maximum.
func TestScaleOutGroupStart(t *testing.T) {
	rounds := groupStartRounds
	if v := os.Getenv("DEDUPE_FAULTS_GROUPSTART_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("DEDUPE_FAULTS_GROUPSTART_ROUNDS=%q: want a count of at least 1", v)
		}
		rounds = n
	}
	t.Logf("%d rounds (%d by default; DEDUPE_FAULTS_GROUPSTART_ROUNDS sets another count)", rounds, groupStartRounds)
	var firsts, slowest []time.Duration
	for round := range rounds {
		t.Run("round"+strconv.Itoa(round), func(t *testing.T) {
			first, slow := groupStartRound(t, round)
			firsts, slowest = append(firsts, first), append(slowest, slow)
		})
		if t.Failed() && testing.Short() {
			break
		}
	}
	if len(firsts) == 0 {
		return
	}
	slices.Sort(slowest)
	if median := slowest[len(slowest)/2]; median > groupStartBound {
		t.Errorf("the slowest take of the median round came %v after the last ready or its release, want within %v (each round's slowest: %v)",
			median.Round(time.Millisecond), groupStartBound, slowest)
	}
	slices.Sort(firsts)
	t.Logf("start to first forward over %d rounds: median %v, max %v (all %v)", len(firsts),
		firsts[len(firsts)/2].Round(time.Millisecond), firsts[len(firsts)-1].Round(time.Millisecond), firsts)
}

// groupStartRound runs one round of TestScaleOutGroupStart and returns the
// time from the instances' start to the first message in the output, and
// the round's slowest take: of a partition after the last instance was
// ready, or after its release for balance.
func groupStartRound(t *testing.T, round int) (time.Duration, time.Duration) {
	cl := startNATSCluster(t, 3)
	js := publisherJS(t, cl.URLs())
	cl0 := scaleOutConfig(t, cl.URLs(), "i0")
	// The input waits before the group starts: a stream created the way
	// an operator would, and a few keys of every partition in it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: inputStream, Subjects: []string{"events.>"}, Replicas: 3}); err != nil {
		t.Fatalf("input stream: %v", err)
	}
	w := newWorkload(uint64(700+round), "start"+strconv.Itoa(round), 4096)
	mustPublish(t, js, w.mix(200, 0.3, 0, 0), "in")

	stages := make([]*stage, 3)
	for i := range stages {
		c := cl0
		if i > 0 {
			c = scaleOutConfig(t, cl.URLs(), "i"+strconv.Itoa(i))
		}
		stages[i] = newStage(t, c)
	}
	start := time.Now()
	for _, s := range stages {
		s.start()
	}
	// Input keeps arriving, a copy of a forwarded key (which changes
	// nothing of the output) every 50 ms, so that a partition released
	// for balance has input waiting for its next owner.
	stop := make(chan struct{})
	var trickle sync.WaitGroup
	var trickleErr error
	trickle.Go(func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			if _, err := publish(context.Background(), js, []event{w.repeat()}, "trickle", 0, 10*time.Second); err != nil {
				trickleErr = err
				return
			}
		}
	})
	var trickleStopped sync.Once
	stopTrickle := func() {
		trickleStopped.Do(func() {
			close(stop)
			trickle.Wait()
			if trickleErr != nil {
				t.Errorf("input trickle: %v", trickleErr)
			}
		})
	}
	defer stopTrickle()
	ready := make([]time.Time, len(stages))
	var wg sync.WaitGroup
	for i, s := range stages {
		wg.Go(func() {
			natstest.Until(60*time.Second, 5*time.Millisecond, func() bool {
				if !s.last().Running() {
					return true
				}
				code, _ := s.get("/readyz")
				return code == http.StatusOK
			})
			ready[i] = time.Now()
		})
	}
	wg.Wait()
	for i, s := range stages {
		if !s.last().Running() {
			t.Fatalf("instance i%d exited at start (%v) after %v:\n%s", i, s.last().Err(), ready[i].Sub(start), crashReport(s.last().Log()))
		}
	}
	last := slices.MaxFunc(ready, func(a, b time.Time) int { return a.Compare(b) })
	// Every partition has waiting input: each must be taken within the
	// bound, and a partition released for balance within the bound of
	// its release. The group is watched until its balance has settled,
	// or groupStartWatch after the last ready.
	partitions := cl0.Partitions
	var events []takeEvent
	natstest.Until(time.Until(last.Add(groupStartWatch)), 20*time.Millisecond, func() bool {
		events = takeEvents(stages)
		return settled(events, partitions, len(stages))
	})
	end := time.Now()
	taken := map[int]time.Time{}
	for _, e := range events {
		if _, ok := taken[e.partition]; !ok && e.taken {
			taken[e.partition] = e.at
		}
	}
	var late []string
	var slowest time.Duration
	for i := range ready {
		// One instance alone is ready in about a second; a start that
		// waits on a request the cluster left unanswered takes 5 to 10 s
		// (the client's request timeouts).
		if d := ready[i].Sub(start); d > groupStartReady {
			late = append(late, fmt.Sprintf("instance i%d ready %v after the start, want within %v", i, d.Round(time.Millisecond), groupStartReady))
		}
	}
	for p := range partitions {
		at, ok := taken[p]
		switch {
		case !ok:
			late = append(late, fmt.Sprintf("partition %d not taken %v after the last instance was ready", p, end.Sub(last).Round(time.Millisecond)))
		default:
			slowest = max(slowest, at.Sub(last))
			if d := at.Sub(last); d > groupStartBound {
				t.Logf("partition %d taken %v after the last instance was ready (the bound, %v, applies to the median round)", p, d.Round(time.Millisecond), groupStartBound)
			}
		}
	}
	var moves []string
	for i, e := range events {
		if e.taken {
			continue
		}
		next, ok := nextOwner(events, i)
		if !ok && end.Sub(e.at) > groupStartBound {
			// Not taken by the end of the watch: waited for a while
			// longer (groupStartOrphan), the wait counted.
			natstest.Until(time.Until(e.at.Add(groupStartOrphan)), 50*time.Millisecond, func() bool {
				all := takeEvents(stages)
				j := slices.IndexFunc(all, func(n takeEvent) bool {
					return !n.taken && n.partition == e.partition && n.instance == e.instance && n.at.Equal(e.at)
				})
				if j >= 0 {
					next, ok = nextOwner(all, j)
				}
				return ok
			})
			if !ok {
				late = append(late, fmt.Sprintf("partition %d not taken %v after %s released it for balance", e.partition, time.Since(e.at).Round(time.Millisecond), e.instance))
				continue
			}
			t.Logf("partition %d taken %v after %s released it for balance, after the watch (the bound applies to the median round)",
				e.partition, next.at.Sub(e.at).Round(time.Millisecond), e.instance)
		}
		if ok {
			d := max(next.at.Sub(e.at), 0)
			moves = append(moves, fmt.Sprintf("p%d %v", e.partition, d.Round(time.Millisecond)))
			slowest = max(slowest, d)
		}
	}
	var first time.Duration
	natstest.Poll(t, 30*time.Second, 20*time.Millisecond, "the first forwarded message", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, outputStream)
		if err != nil {
			return false, err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return false, err
		}
		if info.State.Msgs == 0 {
			return false, nil
		}
		first = info.State.FirstTime.Sub(start)
		return true, nil
	})
	var readyAfter []string
	for i := range ready {
		readyAfter = append(readyAfter, ready[i].Sub(start).Round(time.Millisecond).String())
	}
	var takenAfter []string
	for p := range partitions {
		if at, ok := taken[p]; ok {
			takenAfter = append(takenAfter, at.Sub(last).Round(time.Millisecond).String())
		} else {
			takenAfter = append(takenAfter, "never")
		}
	}
	t.Logf("round %d: ready %v after the start; partitions first taken %v after the last ready; taken again after a release for balance: %v; first forward %v after the start",
		round, readyAfter, takenAfter, moves, first.Round(time.Millisecond))
	for _, l := range late {
		t.Error(l)
	}
	for i, s := range stages {
		if !s.last().Running() {
			t.Errorf("instance i%d exited: %v\n%s", i, s.last().Err(), crashReport(s.last().Log()))
		}
	}
	stopTrickle()
	// The instances, then the nodes, stop together: the round's wall time.
	var stopped sync.WaitGroup
	for _, s := range stages {
		stopped.Go(func() { _ = s.last().Cmd.Process.Signal(syscall.SIGTERM); <-s.last().Exited() })
	}
	stopped.Wait()
	for i := range cl.Nodes {
		stopped.Go(func() { cl.stop(i, syscall.SIGTERM) })
	}
	stopped.Wait()
	return first, slowest
}

// nextOwner returns the take that follows the release events[i]: the
// first take of the partition by another instance after the releaser
// took it (its take can be logged before the release is, which is logged
// once the release has finished).
func nextOwner(events []takeEvent, i int) (takeEvent, bool) {
	e := events[i]
	from := slices.IndexFunc(events[:i], func(n takeEvent) bool {
		return n.taken && n.partition == e.partition && n.instance == e.instance
	})
	next := slices.IndexFunc(events[from+1:], func(n takeEvent) bool {
		return n.taken && n.partition == e.partition && n.instance != e.instance
	})
	if next < 0 {
		return takeEvent{}, false
	}
	return events[from+1+next], true
}

// settled reports whether events say that every one of n partitions is
// owned and that instances (named i0, i1, ... in the order of their
// names) own their quota each: docs/scale-out.md §4.2, the first n mod k
// ⌊n/k⌋+1, the others ⌊n/k⌋. Balance releases nothing more then.
func settled(events []takeEvent, n, instances int) bool {
	owner := map[int]string{}
	for _, e := range events {
		if e.taken {
			owner[e.partition] = e.instance
		} else if owner[e.partition] == e.instance {
			delete(owner, e.partition)
		}
	}
	if len(owner) != n {
		return false
	}
	count := map[string]int{}
	for _, i := range owner {
		count[i]++
	}
	for i := range instances {
		want := n / instances
		if i < n%instances {
			want++
		}
		if count["i"+strconv.Itoa(i)] != want {
			return false
		}
	}
	return true
}

// takeEvent is a partition taken by an instance, or released by it for
// balance, as its log says.
type takeEvent struct {
	at        time.Time
	partition int
	instance  string
	taken     bool // taken; false: released for balance
}

// takeEvents returns what the logs of stages say of partitions taken
// ("scale-out: partition taken") and released for balance ("scale-out:
// partition released for balance"), in order of time.
func takeEvents(stages []*stage) []takeEvent {
	var events []takeEvent
	for i, s := range stages {
		for line := range strings.Lines(s.last().Log()) {
			taken := strings.Contains(line, `"scale-out: partition taken"`)
			if !taken && !strings.Contains(line, `"scale-out: partition released for balance"`) {
				continue
			}
			var r struct {
				Time      time.Time `json:"time"`
				Partition int       `json:"partition"`
			}
			if json.Unmarshal([]byte(line), &r) != nil {
				continue
			}
			events = append(events, takeEvent{at: r.Time, partition: r.Partition, instance: "i" + strconv.Itoa(i), taken: taken})
		}
	}
	slices.SortFunc(events, func(a, b takeEvent) int { return a.at.Compare(b.at) })
	return events
}
