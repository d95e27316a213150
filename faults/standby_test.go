package faults

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// standbyRecords returns the changelog records the running instances of
// stages applied as warm standbys (dedupe_standby_records_total), summed.
func standbyRecords(stages []*stage) float64 {
	var n float64
	for _, s := range stages {
		if p := s.last(); p != nil && p.Running() {
			n += s.metric("dedupe_standby_records_total")
		}
	}
	return n
}

// standbysCaughtUp waits until every running instance of stages stands
// by for a partition and their warm standbys have applied at least least
// records between them and nothing new for two tail intervals (the
// standbys tail every 2 s), and returns how many.
func standbysCaughtUp(t *testing.T, stages []*stage, least float64) float64 {
	t.Helper()
	last, since := -1.0, time.Now()
	natstest.WaitFor(t, takeoverWait, "the warm standbys to catch up with the changelog", func() bool {
		n := standbyRecords(stages)
		for _, s := range stages {
			// A standby stands by once the group has settled (5 s);
			// until then nothing is tailed, and a quiet count proves
			// nothing.
			if p := s.last(); p != nil && p.Running() && s.metric("dedupe_standby_partitions") == 0 {
				since = time.Now()
			}
		}
		if n != last {
			last, since = n, time.Now()
			return false
		}
		return n >= least && n > 0 && time.Since(since) >= 4*time.Second
	})
	return last
}

// TestScaleOutStandbyRestoresTheTail runs a group of two (one warm
// standby per partition, the default), loads keys, lets each instance's
// standby partitions catch up, then stops (SIGTERM) or kills (SIGKILL)
// i0: i1 takes i0's partitions from its local store (path local),
// restoring only the tail, which after a load that was drained is
// nothing. No key reaches the output twice, none is lost.
func TestScaleOutStandbyRestoresTheTail(t *testing.T) {
	t.Parallel()
	for i, how := range []string{"stop", "kill"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			w := newWorkload(uint64(70+i), "standby"+how, 4096)
			_, stages, js := scaleOutGroup(t, 2, w, "")
			a, b := stages[0], stages[1]
			mustPublish(t, js, w.mix(3000, 0.3, 0.01, 0), "load")
			scaleOutDrained(t, js, a.cfg.Partitions, takeoverWait)
			natstest.WaitFor(t, 10*time.Second, "i1 to stand by for every partition i0 owns", func() bool {
				return b.metric("dedupe_standby_partitions") == float64(a.owned())
			})
			applied := standbysCaughtUp(t, stages, 1)
			owned := a.owned()
			local := b.metric("dedupe_restore_path_total", "path", "local")
			restored := b.metric("dedupe_restore_records_total")
			takeovers := b.metric("dedupe_partition_takeovers_total")
			t.Logf("standbys applied %v records; i0 owns %d partitions; %s i0", applied, owned, how)
			from := len(b.last().Log())
			if how == "kill" {
				a.last().kill(t)
			} else {
				a.last().signal(t, syscall.SIGTERM, 30*time.Second)
			}
			// New keys after the stop: i1 takes i0's partitions with
			// their first messages (or before, by balance after a stop).
			wait := publishBehind(t, js, w.mix(1000, 0.3, 0.01, 0), "after", 250)
			natstest.WaitFor(t, takeoverWait, "i1 to own every partition", func() bool {
				return b.owned() == a.cfg.Partitions
			})
			wait()
			scaleOutDrained(t, js, a.cfg.Partitions, takeoverWait)
			tookLocal := b.metric("dedupe_restore_path_total", "path", "local") - local
			took := b.metric("dedupe_partition_takeovers_total") - takeovers
			tail := b.metric("dedupe_restore_records_total") - restored
			t.Logf("i1 took %v partitions, %v of them from its local store, restoring %v records", took, tookLocal, tail)
			if took < float64(owned) || tookLocal != took {
				t.Errorf("i1 took %v partitions, %v by path local; want i0's %d, all local", took, tookLocal, owned)
			}
			// A warm standby's cursor is close to the output's last sequence,
			// so no snapshot can be past it: its takeover does not open the
			// snapshot, whose transfer it would wait for.
			if n := strings.Count(b.last().Log()[from:], "not opened: the output's last sequence"); n < int(took) {
				t.Errorf("i1 left the snapshot unopened in %d of its %v takeovers; want all", n, took)
			}
			// Only the tail: the load was drained and the standbys caught
			// up before the stop, so what is left is what i0 forwarded
			// of the new keys before it went.
			if tail > 300 {
				t.Errorf("i1 restored %v records at its takeovers; want only the tail (the standbys held %v)", tail, applied)
			}
			lateCopiesThenCheck(t, js, w, a.cfg.Partitions)
		})
	}
}

// standbyW is TestScaleOutStandbyExpires's window.
const standbyW = 4 * time.Second

// TestScaleOutStandbyExpires runs a group of two with W = standbyW: a
// first round of keys is tailed by each partition's warm standby; a second
// round after W moves the input clock of every partition on the owners
// and, through the changelog, on the standbys, and the first round's
// records expire on both: the group's instances expire them twice over
// (dedupe_expired_total{kind="record"}), once where each partition is
// owned and once where it is stood by for (at least 1.75 times the
// records); without expiry on the standby partitions the group would
// expire each about once.
func TestScaleOutStandbyExpires(t *testing.T) {
	t.Parallel()
	w := newWorkload(72, "sbexp", 4096)
	_, stages, js := scaleOutGroupWith(t, 2, w, func(c *stageConfig) { c.Extra += windowYAML(standbyW, false) })
	a := stages[0]
	mustPublish(t, js, w.mix(1000, 0, 0, 0), "first")
	scaleOutDrained(t, js, a.cfg.Partitions, takeoverWait)
	standbysCaughtUp(t, stages, 1)
	// Each partition's records are in its owner's store and its
	// standby's (tailed, or held from when it owned the partition).
	first := float64(len(forwardsByKey(t, js)))
	time.Sleep(standbyW + time.Second) // on purpose: the first round's windows end on the input clock
	mustPublish(t, js, w.mix(400, 0, 0, 0), "second")
	scaleOutDrained(t, js, a.cfg.Partitions, takeoverWait)
	standbysCaughtUp(t, stages, 1)
	expired := func() float64 {
		var n float64
		for _, s := range stages {
			n += s.metric("dedupe_expired_total", "kind", "record")
		}
		return n
	}
	logged := time.Now()
	// Each record expires about twice, once on its partition's owner and
	// once on its standby: 1.75 times the records leaves room for the few
	// a store did not hold when its partition moved in the warm-up, and is
	// well above the once over that expiry on owners alone gives.
	want := 1.75 * first
	natstest.WaitFor(t, takeoverWait, "the first round's records to expire on owners and standbys: "+strconv.Itoa(int(want)), func() bool {
		n := expired()
		if time.Since(logged) > 10*time.Second {
			logged = time.Now()
			t.Logf("expired so far: %v of %v; standby partitions %v and %v", n, want,
				stages[0].metric("dedupe_standby_partitions"), stages[1].metric("dedupe_standby_partitions"))
		}
		return n >= want
	})
	t.Logf("first round: %v records in the changelog; expired on the group: %v", first, expired())
}
