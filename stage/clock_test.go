package stage_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/config"
)

// offsetClock is the wall clock off by an offset that a test can move
// while the stage runs (a host clock set wrong, or stepped by NTP).
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// TestStageClockMovesNoDecision runs the same input through a stage whose
// clock is true, one an hour ahead, one an hour behind, and one that
// steps 2 x W forward mid-run: copies of half the keys W - W/5 after
// their first copies (repeats), of the other half W + W/5 after (each
// forwarded again). Each stage forwards the same keys as often as the one
// with the true clock, and as the input's times say: the window runs on
// the times the input stored the copies, not on the stage's clock.
func TestStageClockMovesNoDecision(t *testing.T) {
	const (
		w    = 2 * time.Second
		keys = 20
	)
	clocks := []struct {
		name        string
		off, stepBy time.Duration
	}{
		{"true", 0, 0},
		{"an hour ahead", time.Hour, 0},
		{"an hour behind", -time.Hour, 0},
		{"stepping 2W forward", 0, 2 * w},
	}
	type result struct {
		forwards map[string]int
		judged   float64 // new
	}
	results := make([]result, len(clocks))
	t.Run("clocks", func(t *testing.T) {
		for i, c := range clocks {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				clock := &offsetClock{}
				clock.off.Store(int64(c.off))
				e.clock = clock
				e.cfg.Window.Paths = []config.Path{{Name: "test", Max: config.Duration(w)}}
				e.cfg.Window.Margin = 0
				r := e.start()
				copies := func(odd bool) []event {
					var evs []event
					for k := range keys {
						if k%2 == 1 == odd {
							evs = append(evs, event{key: fmt.Sprintf("k%d", k), payload: []byte("p")})
						}
					}
					return evs
				}
				first := time.Now()
				e.publish(append(copies(false), copies(true)...))
				e.drained(30 * time.Second)
				clock.off.Add(int64(c.stepBy))
				time.Sleep(time.Until(first.Add(w - w/5))) // on purpose: copies just inside W
				e.publish(copies(false))
				e.drained(30 * time.Second)
				time.Sleep(time.Until(first.Add(w + w/5))) // on purpose: copies just past W
				e.publish(copies(true))
				e.drained(30 * time.Second)
				res := result{forwards: map[string]int{}, judged: counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "new"})}
				for id, ms := range e.outputByKey() {
					if i := strings.Index(id, ".after."); i >= 0 {
						id = id[:i]
					}
					res.forwards[id] += len(ms)
				}
				results[i] = res
				for k := range keys {
					if id, want := fmt.Sprintf("k%d", k), 1+k%2; res.forwards[id] != want {
						t.Errorf("clock %s: %s forwarded %d times, want %d", c.name, id, res.forwards[id], want)
					}
				}
				if res.judged != keys+keys/2 {
					t.Errorf("clock %s: %v copies judged new, want %d: every key once, and again the %d copied past W", c.name, res.judged, keys+keys/2, keys/2)
				}
			})
		}
	})
	for i := 1; i < len(clocks); i++ {
		got, want := results[i], results[0]
		if got.forwards == nil || want.forwards == nil {
			continue
		}
		if got.judged != want.judged || fmt.Sprint(got.forwards) != fmt.Sprint(want.forwards) {
			t.Errorf("clock %s: %v judged new, forwards %v; with a true clock %v, %v", clocks[i].name, got.judged, got.forwards, want.judged, want.forwards)
		}
	}
}
