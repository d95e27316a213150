package stage

import (
	"errors"
	"testing"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
)

// stored returns the publish results of messages stored at seqs.
func stored(seqs ...uint64) []forward.Result {
	res := make([]forward.Result, len(seqs))
	for i, s := range seqs {
		res[i] = forward.Result{Done: true, Seq: s}
	}
	return res
}

// TestWatermarkTracking follows the watermark through partitions'
// batches: a partition in flight holds it at the highest sequence
// committed when its publish began, duplicates and refusals do not move
// it, and a batch left uncommitted keeps its floor through later batches.
func TestWatermarkTracking(t *testing.T) {
	m := newWatermark(3, 10)
	check := func(got, want uint64) {
		t.Helper()
		if got != want {
			t.Errorf("watermark %d, want %d", got, want)
		}
	}
	m.publishing(0)
	m.publishing(1)
	check(m.next(1, stored(11, 13)), 10) // partition 0's forwards may lie at 11..
	m.commit(1, stored(11, 13))
	check(m.next(0, stored(12, 14)), 14)
	m.commit(0, stored(12, 14))
	if w, ok := m.settled(); !ok || w != 14 {
		t.Errorf("settled() = %d, %v; want 14, true", w, ok)
	}

	// A duplicate's sequence is another message's; a refused one has none.
	m.publishing(2)
	res := []forward.Result{{Done: true, Duplicate: true, Seq: 40}, {Done: true, Err: errors.New("refused")}}
	check(m.next(2, res), 14)
	m.commit(2, res)

	// Partition 0 publishes and never commits; its next batch keeps the
	// floor it had.
	m.publishing(0)
	m.publishing(1)
	m.commit(1, stored(15))
	m.publishing(0)
	check(m.next(1, stored(16)), 14)
	if _, ok := m.settled(); ok {
		t.Error("settled() with partition 0 in flight: ok")
	}
	check(m.next(0, stored(17)), 17)
}
