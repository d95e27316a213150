package stage_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// TestGroupHealthQuietGroupIsNotStalled runs two instances of a group that
// has no input: however the partitions are owned, each instance's gauges
// count every one of them as owned or idle, none as waiting or stalled,
// and no input as waiting, so that an alert on stalled partitions stays
// quiet on a quiet group.
func TestGroupHealthQuietGroupIsNotStalled(t *testing.T) {
	e := newScaleOutEnv(t)
	parts := float64(e.cfg.State.Partitions)
	for _, r := range []*running{e.as("a").start(), e.as("b").start()} {
		states := func() map[string]float64 {
			got := map[string]float64{}
			for _, s := range []string{"owned", "idle", "waiting", "stalled"} {
				got[s] = metrictest.Sum(t, r.reg, "dedupe_group_health_partitions", map[string]string{"group": e.cfg.ScaleOut.Group, "state": s})
			}
			return got
		}
		natstest.Poll(t, 30*time.Second, 100*time.Millisecond, "the health gauges to be set", func() (bool, error) {
			got := states()
			return got["owned"]+got["idle"]+got["waiting"]+got["stalled"] > 0, fmt.Errorf("partitions by state %v", got)
		})
		got := states()
		if got["owned"]+got["idle"] != parts || got["waiting"] != 0 || got["stalled"] != 0 {
			t.Errorf("partitions by state %v, want %v owned or idle and none waiting or stalled", got, parts)
		}
		if w := metrictest.Sum(t, r.reg, "dedupe_group_health_longest_wait_seconds", nil); w != 0 {
			t.Errorf("longest wait %vs, want 0: no input waits", w)
		}
		if n := metrictest.Sum(t, r.reg, "dedupe_group_health_read_errors_total", nil); n != 0 {
			t.Errorf("%v failed reads of the group's status, want 0", n)
		}
	}
}
