// Package batcher gathers items from a channel into batches: the batching
// the stage's partition workers use, shared with the benchmark's raw loop so
// both batch the same way.
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
		var open bool
		if linger > 0 {
			batch, open = fillFor(in, append(batch[:0], it), linger, timer)
		} else {
			batch, open = fillQueued(in, append(batch[:0], it))
		}
		process(batch)
		clear(batch)
		if !open {
			return
		}
	}
}

// fillQueued adds to batch what is already queued on in, up to its
// capacity; open is false when in is closed.
func fillQueued[T any](in <-chan T, batch []T) (_ []T, open bool) {
	for len(batch) < cap(batch) {
		select {
		case it, ok := <-in:
			if !ok {
				return batch, false
			}
			batch = append(batch, it)
		default:
			return batch, true
		}
	}
	return batch, true
}

// fillFor adds to batch what arrives on in within linger, up to its
// capacity, and leaves timer stopped; open is false when in is closed.
func fillFor[T any](in <-chan T, batch []T, linger time.Duration, timer *time.Timer) (_ []T, open bool) {
	timer.Reset(linger)
	defer func() {
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}()
	for len(batch) < cap(batch) {
		select {
		case it, ok := <-in:
			if !ok {
				return batch, false
			}
			batch = append(batch, it)
		case <-timer.C:
			return batch, true
		}
	}
	return batch, true
}
