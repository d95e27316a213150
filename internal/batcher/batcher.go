// Package batcher gathers items from a channel into batches: the batching
// the stage's partition workers use, shared with the benchmark's raw loop so
// both batch the same way; EndPull ends the pull iterators that feed them
// at a stop. Progress paces the InProgress signals of a
// batch held up by retries, for the stage's workers and the route step
// alike.
package batcher

import "time"

// Run reads in until it is closed, and calls process with batches of at most
// size items. A batch starts with the first item that arrives; Run then
// waits up to linger for more (with linger <= 0 it takes only what is
// already queued). process owns the slice only during the call: Run reuses
// it and clears it afterwards, so it holds no references. Run returns after
// the last batch when in is closed.
func Run[T any](in <-chan T, size int, linger time.Duration, process func([]T)) {
	batch := make([]T, 0, max(size, 1))
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		it, ok := <-in
		if !ok {
			return
		}
		var lingered <-chan time.Time // nil: take only what is queued
		if linger > 0 {
			timer.Reset(linger)
			lingered = timer.C
		}
		var open bool
		batch, open = fill(in, append(batch[:0], it), lingered)
		if linger > 0 && !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		process(batch)
		clear(batch)
		if !open {
			return
		}
	}
}

// fill adds to batch what arrives on in, up to its capacity, until lingered
// is ready or, with lingered nil, what is already queued. open is false
// when in is closed.
func fill[T any](in <-chan T, batch []T, lingered <-chan time.Time) (_ []T, open bool) {
	for len(batch) < cap(batch) {
		var it T
		var ok bool
		if lingered == nil {
			select {
			case it, ok = <-in:
			default:
				return batch, true
			}
		} else {
			select {
			case it, ok = <-in:
			case <-lingered:
				return batch, true
			}
		}
		if !ok {
			return batch, false
		}
		batch = append(batch, it)
	}
	return batch, true
}
