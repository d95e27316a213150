package stage_test

import (
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/stage"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// TestRepeatAgeAndNearWindowMetrics drives repeats at known input times
// (a manual clock gives each message its input time) and checks what dedupe_repeat_age_seconds and
// dedupe_repeats_near_window_end_total report: every caught repeat's age,
// and exactly those at or past near_fraction of W.
func TestRepeatAgeAndNearWindowMetrics(t *testing.T) {
	e := newEnv(t)
	clock := window.NewManualClock(time.Now())
	e.inputClock = clock
	e.cfg.Window.Paths = []config.Path{{Name: "client-retry", Max: config.Duration(time.Minute)}}
	e.cfg.Window.Margin = 0
	e.cfg.Window.NearFraction = 0.8 // W = 60s: near from 48s
	r := e.start()

	step := func(advance time.Duration, keys ...string) {
		t.Helper()
		clock.Advance(advance)
		evs := make([]event, len(keys))
		for i, k := range keys {
			evs[i] = event{key: k, payload: []byte("p-" + k)}
		}
		e.publish(evs)
		e.drained(30 * time.Second)
	}
	step(0, "k1", "k2")                   // t=0: both new
	step(10*time.Second, "k1")            // t=10: k1 age 10s
	step(37*time.Second, "k1")            // t=47: k1 age 47s, just before near
	step(1*time.Second, "k2")             // t=48: k2 age 48s, near (>= 0.8 W)
	step(11*time.Second, "k1")            // t=59: k1 age 59s, near
	step(2*time.Second, "k2", "k1")       // t=61: both past W: new again, no age observed
	wantAges := []float64{10, 47, 48, 59} // seconds

	h := metrictest.Histogram(t, r.reg, "dedupe_repeat_age_seconds")
	if h.GetSampleCount() != uint64(len(wantAges)) {
		t.Errorf("dedupe_repeat_age_seconds count %d, want %d repeats", h.GetSampleCount(), len(wantAges))
	}
	var sum float64
	for _, a := range wantAges {
		sum += a
	}
	if math.Abs(h.GetSampleSum()-sum) > 0.01 {
		t.Errorf("dedupe_repeat_age_seconds sum %v, want %v (ages %v)", h.GetSampleSum(), sum, wantAges)
	}
	// Each bucket counts the ages at or below its bound.
	for _, b := range h.GetBucket() {
		want := uint64(0)
		for _, a := range wantAges {
			if a <= b.GetUpperBound() {
				want++
			}
		}
		if b.GetCumulativeCount() != want {
			t.Errorf("dedupe_repeat_age_seconds bucket le=%v holds %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
		}
	}
	if got := counter(t, r.reg, "dedupe_repeats_near_window_end_total", nil); got != 2 {
		t.Errorf("dedupe_repeats_near_window_end_total %v, want 2 (ages 48s and 59s of W 60s, near from 48s)", got)
	}
	if got := counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "repeat"}); got != float64(len(wantAges)) {
		t.Errorf("repeats %v, want %d", got, len(wantAges))
	}
	if got := counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != 4 {
		t.Errorf("new %v, want 4 (two keys, each again past W)", got)
	}
}

// TestMetricsExportedFromTheStart starts a stage and reads its metrics
// before any input: dedupe_messages_total at 0 for every outcome of every
// partition, dedupe_dead_letters_total and
// dedupe_dead_letters_unstorable_total at 0 for every reason, and
// dedupe_repeat_age_seconds on the fixed buckets whatever W, with W as
// dedupe_window_seconds.
func TestMetricsExportedFromTheStart(t *testing.T) {
	e := newEnv(t)
	e.cfg.Window.Paths = []config.Path{{Name: "webhook-retry", Max: config.Duration(72 * time.Hour)}}
	e.cfg.Window.Margin = config.Duration(time.Hour)
	r := e.start()

	for p := range e.cfg.State.Partitions {
		for _, o := range []string{"new", "repeat", "stale", "dead_letter", "dropped"} {
			labels := map[string]string{"partition": strconv.Itoa(p), "outcome": o}
			if v, ok := metrictest.Lookup(t, r.reg, "dedupe_messages_total", labels); !ok || v != 0 {
				t.Errorf("dedupe_messages_total%v: %v (exported %v), want 0 from the start", labels, v, ok)
			}
		}
	}
	for _, reason := range deadletter.Reasons() {
		for _, name := range []string{"dedupe_dead_letters_total", "dedupe_dead_letters_unstorable_total"} {
			if v, ok := metrictest.Lookup(t, r.reg, name, map[string]string{"reason": string(reason)}); !ok || v != 0 {
				t.Errorf("%s{reason=%q}: %v (exported %v), want 0 from the start", name, reason, v, ok)
			}
		}
	}
	if w := gauge(t, r.reg, "dedupe_window_seconds"); w != 73*3600 {
		t.Errorf("dedupe_window_seconds %v, want 73h", w)
	}
	h := metrictest.Histogram(t, r.reg, "dedupe_repeat_age_seconds")
	var bounds []float64
	for _, b := range h.GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
	}
	if !slices.Equal(bounds, stage.RepeatAgeBuckets) || bounds[0] != 1 || bounds[len(bounds)-1] != 30*86400 {
		t.Errorf("dedupe_repeat_age_seconds buckets %v, want the fixed %v, from 1s to 30d", bounds, stage.RepeatAgeBuckets)
	}
}
