package stage_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// TestGroupHealthQuietGroupIsNotStalled runs two instances of a group that
// has no input: one of them, a (its name sorts first), reads the group's
// status and counts every partition as owned or idle, none as waiting or
// stalled, and no input as waiting, so that an alert on stalled partitions
// stays quiet on a quiet group; b exports no health series, so that the
// group is read once, not once per instance. When a stops, b becomes the
// reader.
func TestGroupHealthQuietGroupIsNotStalled(t *testing.T) {
	e := newScaleOutEnv(t)
	parts := float64(e.cfg.State.Partitions)
	group := e.cfg.ScaleOut.Group
	states := func(r *running) (map[string]float64, bool) {
		got, any := map[string]float64{}, false
		for _, s := range []string{"owned", "idle", "waiting", "stalled"} {
			v, ok := metrictest.Lookup(t, r.reg, "dedupe_group_health_partitions", map[string]string{"group": group, "state": s})
			got[s], any = v, any || ok
		}
		return got, any
	}
	quiet := func(r *running, name string) {
		t.Helper()
		got, _ := states(r)
		if got["owned"]+got["idle"] != parts || got["waiting"] != 0 || got["stalled"] != 0 {
			t.Errorf("%s: partitions by state %v, want %v owned or idle and none waiting or stalled", name, got, parts)
		}
		if w := metrictest.Value(t, r.reg, "dedupe_group_health_longest_wait_seconds", nil); w != 0 {
			t.Errorf("%s: longest wait %vs, want 0: no input waits", name, w)
		}
		if n := metrictest.Sum(t, r.reg, "dedupe_group_health_read_errors_total", nil); n != 0 {
			t.Errorf("%s: %v failed reads of the group's status, want 0", name, n)
		}
	}
	a, b := e.as("a").start(), e.as("b").start()
	natstest.Poll(t, 60*time.Second, 100*time.Millisecond, "a alone to export the group's health", func() (bool, error) {
		ga, inA := states(a)
		gb, inB := states(b)
		_, waitInB := metrictest.Lookup(t, b.reg, "dedupe_group_health_longest_wait_seconds", nil)
		return inA && !inB && !waitInB && ga["owned"]+ga["idle"] == parts, fmt.Errorf("a exports %v (%v), b %v (%v, longest wait %v)", ga, inA, gb, inB, waitInB)
	})
	quiet(a, "a")
	a.stop(t)
	natstest.Poll(t, 60*time.Second, 100*time.Millisecond, "b to read the group's health once a has left", func() (bool, error) {
		gb, inB := states(b)
		return inB && gb["owned"]+gb["idle"] == parts, fmt.Errorf("b exports %v (%v)", gb, inB)
	})
	quiet(b, "b")
}
