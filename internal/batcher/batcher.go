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
		batch = append(batch[:0], it)
		open := true
		if linger > 0 {
			timer.Reset(linger)
		}
	fill:
		for len(batch) < cap(batch) {
			if linger <= 0 {
				select {
				case it, ok := <-in:
					if !ok {
						open = false
						break fill
					}
					batch = append(batch, it)
				default:
					break fill
				}
				continue
			}
			select {
			case it, ok := <-in:
				if !ok {
					open = false
					break fill
				}
				batch = append(batch, it)
			case <-timer.C:
				break fill
			}
		}
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
