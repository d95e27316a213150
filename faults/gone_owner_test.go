package faults

import (
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// goneAckWait is TestScaleOutPausedOwnerFenced's input.ack_wait, the
// default: the pin's TTL, which detection (docs/scale-out.md §4.3) beats.
const goneAckWait = 10 * time.Second

// gonePause is how long TestScaleOutPausedOwnerFenced pauses the owner:
// longer than detection's 3 s of silence, shorter than the pin's TTL.
const gonePause = 7 * time.Second

// TestScaleOutPausedOwnerFenced runs a group of two with input.ack_wait at
// its default (10 s, the pin's TTL) and pauses (SIGSTOP) instance i0, an
// owner, in the middle of a burst for gonePause: less than the pin's TTL,
// more than the 3 s of silence after which its standby unpins its
// partitions (dedupe_gone_owner_unpins_total, within the pause). i1 takes
// them before the pin's TTL has passed since the pause, and i0, resumed,
// finds the batches it judged before the pause refused by the fence. Nothing
// reaches the output twice, nothing is lost. As in TestScaleOutZombieFenced
// a pause that catches no batch in flight proves nothing about the fence,
// so it is tried up to pauseAttempts times.
func TestScaleOutPausedOwnerFenced(t *testing.T) {
	t.Parallel()
	w := newWorkload(66, "gone", 4096)
	_, stages, js := scaleOutGroupWith(t, 2, w, func(c *stageConfig) {
		c.AckWait = goneAckWait
		c.DuplicateWindow = goneAckWait + 5*time.Second
	})
	a, b := stages[0], stages[1]
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			// The last attempt's partitions go back to i0 first, so
			// that the pause catches i0 owning them and judging a batch.
			waitSpread(t, js, w, stages, takeoverWait)
		}
		unpins := b.metric("dedupe_gone_owner_unpins_total")
		takeovers := b.metric("dedupe_partition_takeovers_total")
		// The input keeps coming through the pause: what i0 holds comes
		// back only after ack_wait, while new input goes to whoever the
		// server pins, which detection makes i1 before the pin's TTL.
		wait := publishBehind(t, js, w.mix(3000, 0.3, 0.01, 0), "burst"+strconv.Itoa(attempt), 250)
		outputGrows(t, js, 300, "the group forwarding the burst") // i0 is paused mid-burst
		t.Logf("attempt %d: SIGSTOP i0 for %v (pin TTL %v)", attempt, gonePause, goneAckWait)
		if err := a.last().Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		paused := time.Now()
		var unpinned, took time.Duration
		natstest.Until(gonePause, 100*time.Millisecond, func() bool {
			if unpinned == 0 && b.metric("dedupe_gone_owner_unpins_total") > unpins {
				unpinned = time.Since(paused)
			}
			if unpinned > 0 && b.metric("dedupe_partition_takeovers_total") > takeovers {
				took = time.Since(paused)
				return true
			}
			return false
		})
		time.Sleep(time.Until(paused.Add(gonePause))) // on purpose: i0 stays paused for gonePause
		if err := a.last().Cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if unpinned == 0 {
			t.Fatalf("attempt %d: i1 unpinned none of i0's partitions while i0 was paused for %v: detection did not beat the pin's TTL (%v)",
				attempt, gonePause, goneAckWait)
		}
		if took == 0 {
			// Unpinned within the pause, i1's take may end after it (a
			// restore on a busy machine takes seconds): it must end
			// before the pin's TTL would have moved the partition.
			natstest.Until(time.Until(paused.Add(goneAckWait)), 100*time.Millisecond, func() bool {
				if b.metric("dedupe_partition_takeovers_total") > takeovers {
					took = time.Since(paused)
				}
				return took > 0
			})
		}
		if took == 0 {
			t.Fatalf("attempt %d: i1 took none of i0's partitions within the pin's TTL (%v) of the pause, though it unpinned one %v after the pause",
				attempt, goneAckWait, unpinned.Round(time.Millisecond))
		}
		t.Logf("attempt %d: i1 unpinned a partition of the paused i0 %v after the pause, and took one %v after it",
			attempt, unpinned.Round(time.Millisecond), took.Round(time.Millisecond))
		wait()
		scaleOutDrained(t, js, a.cfg.Partitions, takeoverWait)
		if pausedFenced(t, a, attempt) {
			break
		}
	}
	lateCopiesThenCheck(t, js, w, a.cfg.Partitions)
}
