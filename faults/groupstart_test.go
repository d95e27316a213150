package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/natstest"
)

// groupStartRounds is how many fresh clusters TestScaleOutGroupStart starts
// a group on.
const groupStartRounds = 10

// groupStartBound is how long after the last instance of a group is ready
// every partition with waiting input must have an owner.
const groupStartBound = 2 * time.Second

// groupStartReady is how long after their start the instances of a group
// started together must be ready.
const groupStartReady = 4 * time.Second

// TestScaleOutGroupStart starts three instances of a group at the same
// moment on a fresh 3-node cluster (R3 streams, the buckets and streams
// created by the instances at once) with input waiting in every
// partition, round after round: every instance is ready within
// groupStartReady, every partition is taken within groupStartBound of the
// last instance being ready, and no instance exits.
// It logs the time from the start to the first forwarded message of each
// round, and their median and maximum.
func TestScaleOutGroupStart(t *testing.T) {
	var firsts []time.Duration
	for round := range groupStartRounds {
		t.Run("round"+strconv.Itoa(round), func(t *testing.T) {
			firsts = append(firsts, groupStartRound(t, round))
		})
		if t.Failed() && testing.Short() {
			break
		}
	}
	if len(firsts) == 0 {
		return
	}
	slices.Sort(firsts)
	t.Logf("start to first forward over %d rounds: median %v, max %v (all %v)", len(firsts),
		firsts[len(firsts)/2].Round(time.Millisecond), firsts[len(firsts)-1].Round(time.Millisecond), firsts)
}

// groupStartRound runs one round of TestScaleOutGroupStart and returns the
// time from the instances' start to the first message in the output.
func groupStartRound(t *testing.T, round int) time.Duration {
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
	mustPublish(t, js, w.mix(400, 0.3, 0, 0), "in")

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
	ready := make([]time.Time, len(stages))
	var wg sync.WaitGroup
	for i, s := range stages {
		wg.Go(func() {
			natstest.Until(60*time.Second, 5*time.Millisecond, func() bool {
				if !s.last().running() {
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
		if !s.last().running() {
			t.Fatalf("instance i%d exited at start (%v) after %v:\n%s", i, s.last().err, ready[i].Sub(start), crashReport(s.last().log()))
		}
	}
	last := slices.MaxFunc(ready, func(a, b time.Time) int { return a.Compare(b) })
	// Every partition has waiting input: wait for each to be taken,
	// then a little longer than the bound, to say how late the late ones
	// were.
	partitions := cl0.Partitions
	var taken map[int]time.Time
	natstest.Until(groupStartBound+3*time.Second, 20*time.Millisecond, func() bool {
		taken = takenAt(stages)
		return len(taken) == partitions && time.Now().After(last)
	})
	var late []string
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
			late = append(late, fmt.Sprintf("partition %d not taken %v after the last instance was ready", p, time.Since(last).Round(time.Millisecond)))
		case at.Sub(last) > groupStartBound:
			late = append(late, fmt.Sprintf("partition %d taken %v after the last instance was ready", p, at.Sub(last).Round(time.Millisecond)))
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
	t.Logf("round %d: ready %v after the start; partitions taken %v after the last ready; first forward %v after the start",
		round, readyAfter, takenAfter, first.Round(time.Millisecond))
	for _, l := range late {
		t.Error(l)
	}
	for i, s := range stages {
		if !s.last().running() {
			t.Errorf("instance i%d exited: %v\n%s", i, s.last().err, crashReport(s.last().log()))
		}
	}
	for _, s := range stages {
		s.last().signal(t, syscall.SIGTERM, 30*time.Second)
	}
	return first
}

// takenAt returns when each partition was first taken by any of stages,
// from their logs ("scale-out: partition taken").
func takenAt(stages []*stage) map[int]time.Time {
	taken := map[int]time.Time{}
	for _, s := range stages {
		for line := range strings.Lines(s.last().log()) {
			if !strings.Contains(line, `"scale-out: partition taken"`) {
				continue
			}
			var r struct {
				Time      time.Time `json:"time"`
				Partition int       `json:"partition"`
			}
			if json.Unmarshal([]byte(line), &r) != nil {
				continue
			}
			if at, ok := taken[r.Partition]; !ok || r.Time.Before(at) {
				taken[r.Partition] = r.Time
			}
		}
	}
	return taken
}
