package batcher

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

func TestRun(t *testing.T) {
	for _, tt := range []struct {
		name   string
		linger time.Duration
	}{
		{"no linger", 0},
		{"linger", 5 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			in := make(chan int, 100)
			for i := range 10 {
				in <- i
			}
			var got [][]int
			var handled atomic.Int64
			done := make(chan struct{})
			go func() {
				Run(in, 4, tt.linger, func(b []int) {
					got = append(got, slices.Clone(b))
					handled.Add(int64(len(b)))
				})
				close(done)
			}()
			// The first 10 are batched before more arrive.
			natstest.WaitFor(t, 5*time.Second, "the first 10 items handled", func() bool { return handled.Load() == 10 })
			in <- 10
			close(in)
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Run did not return after in was closed")
			}
			var all []int
			for _, b := range got {
				if len(b) == 0 || len(b) > 4 {
					t.Errorf("batch of %d items, want 1..4", len(b))
				}
				all = append(all, b...)
			}
			if !slices.Equal(all, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) {
				t.Errorf("items %v, want 0..10 in order, each once", all)
			}
			if len(got) < 4 || !slices.Equal(got[0], []int{0, 1, 2, 3}) {
				t.Errorf("batches %v, want full batches of 4 first", got)
			}
		})
	}
}
