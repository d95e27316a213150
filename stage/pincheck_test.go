package stage_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// TestScaleOutRecoversFromFailedPinCheck moves every partition's fence
// under a running owner while its pin checks fail (as with the member
// consumer's leader node down): its batches are refused and it cannot
// tell whether the server still pins it, so it counts its pins lost. The
// server does still pin it, and delivers the partitions to no one else:
// once the checks answer again, the owner must see that, take the fences
// again and forward every key once, instead of leaving the messages
// unacked forever.
func TestScaleOutRecoversFromFailedPinCheck(t *testing.T) {
	e := newScaleOutEnv(t).as("a")
	var failing atomic.Bool
	t.Cleanup(stage.SetPinCheckFault(func(int) error {
		if failing.Load() {
			return errors.New("injected: no responders (the consumer's leader is down)")
		}
		return nil
	}))
	a := e.start()
	payload := map[string][]byte{}
	var first, second []string
	for i := range 100 {
		k, k2 := fmt.Sprintf("k-%d", i), fmt.Sprintf("k2-%d", i)
		payload[k], payload[k2] = []byte(`{"n":1}`), []byte(`{"n":2}`)
		first, second = append(first, k), append(second, k2)
	}
	e.publishKeys(first, payload)
	e.scaleOutDrained(60 * time.Second)

	failing.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for p := range 4 {
		if _, err := changelog.Take(ctx, e.js, e.cfg.Output.Stream, changelog.FenceSubject(e.cfg.Output.SubjectPrefix, p), "other"); err != nil {
			t.Fatal(err)
		}
	}
	e.publishKeys(second, payload)
	// Refused, pins counted lost: a batch that came back after ack_wait
	// under the lost pin is given back.
	natstest.Until(30*time.Second, 50*time.Millisecond, func() bool {
		return counter(t, a.reg, "dedupe_fence_refusals_total", nil) >= 1 &&
			counter(t, a.reg, "dedupe_stale_pin_messages_total", nil) >= 1
	})
	if got := counter(t, a.reg, "dedupe_fence_refusals_total", nil); got < 1 {
		t.Errorf("dedupe_fence_refusals_total = %v, want >= 1", got)
	}
	failing.Store(false)
	e.scaleOutDrained(30 * time.Second)
	e.checkOnce(e.scaleOutOutput(), payload)
}
