package stage_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
)

// TestScaleOutFenceOutlivesMaxAge runs one owner of every partition on an
// output stream that keeps messages for a few seconds (the retention of a
// 2s window), while keys arrive for three times that: the owner refreshes
// its fences before they age out, so none of its batches is refused, it
// takes each partition once, and it forwards every key once.
func TestScaleOutFenceOutlivesMaxAge(t *testing.T) {
	e := newScaleOutEnv(t).as("a")
	e.cfg.Window.Paths = []config.Path{{Name: "client-retry", Max: config.Duration(2 * time.Second)}}
	e.cfg.Window.Margin = 0
	e.cfg.Output.RestartMargin = config.Duration(time.Second)
	e.cfg.Output.AllowShortDuplicateWindow = true
	w, err := e.cfg.Window.Derive()
	if err != nil {
		t.Fatal(err)
	}
	maxAge := e.cfg.OutputRetention(w.W) + time.Second
	if _, err := e.js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: e.cfg.Output.Stream, Subjects: e.cfg.OutputStreamSubjects(), Retention: jetstream.LimitsPolicy,
		MaxAge: maxAge, Duplicates: e.cfg.MinDuplicateWindow(), AllowAtomicPublish: true,
	}); err != nil {
		t.Fatal(err)
	}
	a := e.start()
	payload := map[string][]byte{}
	for i := 0; time.Duration(i)*250*time.Millisecond < 3*maxAge; i++ {
		var ks []string
		for j := range 4 {
			k := fmt.Sprintf("k-%d-%d", i, j)
			payload[k] = []byte(`{"n":1}`)
			ks = append(ks, k)
		}
		e.publishKeys(ks, payload)
		time.Sleep(250 * time.Millisecond) // on purpose: the run outlasts max_age
	}
	e.scaleOutDrained(60 * time.Second)
	if got := counter(t, a.reg, "dedupe_fence_refusals_total", nil); got != 0 {
		t.Errorf("dedupe_fence_refusals_total = %v with output max_age %v, want 0: the owner's own fence aged out", got, maxAge)
	}
	if got := counter(t, a.reg, "dedupe_partition_takeovers_total", nil); got != 4 {
		t.Errorf("dedupe_partition_takeovers_total = %v, want 4: each partition taken once", got)
	}
	if got := counter(t, a.reg, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != float64(len(payload)) {
		t.Errorf("forwarded %v keys, want %d", got, len(payload))
	}
}
