package sink

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"
)

// kvParallel is how many totals of one batch the KV sink works on at once.
const kvParallel = 16

// MaxKVAttempts bounds the compare-and-set attempts the KV sink makes for one
// total before it gives up with ErrConflicts.
const MaxKVAttempts = 100

// kvSink is the JetStream key-value sink; see NewKV.
type kvSink struct {
	kv     jetstream.KeyValue
	closed atomic.Bool
}

// NewKV returns a Sink that keeps totals in the JetStream key-value bucket
// kv, raised by compare-and-set only (docs/sinks.md). When a total fails,
// Write finishes those in flight and returns the first error. The sink does
// not own kv; it is safe for concurrent use.
func NewKV(kv jetstream.KeyValue) Sink {
	return &kvSink{kv: kv}
}

// Name returns "kv".
func (s *kvSink) Name() string { return "kv" }

// Close marks the sink closed. It is safe to call more than once.
func (s *kvSink) Close() error {
	s.closed.Store(true)
	return nil
}

// Write keeps the larger value for each total; see NewKV.
func (s *kvSink) Write(ctx context.Context, totals []Total) (Result, error) {
	if s.closed.Load() {
		return Result{}, ErrClosed
	}
	uniq, dropped, err := prepare(totals)
	if err != nil {
		return Result{}, err
	}
	var (
		mu       sync.Mutex
		res      = Result{Stale: dropped}
		firstErr error
		next     atomic.Int64
		wg       sync.WaitGroup
	)
	for range min(len(uniq), kvParallel) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(uniq) {
					return
				}
				applied, retried, err := s.writeOne(ctx, uniq[i])
				mu.Lock()
				res.Retried += retried
				switch {
				case err != nil:
					if firstErr == nil {
						firstErr = err
					}
				case applied:
					res.Applied++
				default:
					res.Stale++
				}
				stop := firstErr != nil
				mu.Unlock()
				if stop {
					return
				}
			}
		})
	}
	wg.Wait()
	return res, firstErr
}

// writeOne stores t unless the bucket holds the same or a larger value, and
// reports whether it stored it and how many conflicts it retried.
func (s *kvSink) writeOne(ctx context.Context, t Total) (applied bool, retried int, err error) {
	key := t.ID()
	val := []byte(strconv.FormatInt(t.Value, 10))
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return false, retried, fmt.Errorf("sink kv: key %s: %w", key, err)
		}
		e, err := s.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			_, err = s.kv.Create(ctx, key, val)
		case err != nil:
			return false, retried, fmt.Errorf("sink kv: get %s: %w", key, err)
		default:
			stored, perr := parseStored(e.Value())
			if perr != nil {
				return false, retried, fmt.Errorf("%w: kv key %s revision %d: %v", ErrBadStored, key, e.Revision(), perr)
			}
			if stored >= t.Value {
				return false, retried, nil
			}
			_, err = s.kv.Update(ctx, key, val, e.Revision())
		}
		if err == nil {
			return true, retried, nil
		}
		if !isConflict(err) {
			return false, retried, fmt.Errorf("sink kv: write %s: %w", key, err)
		}
		if attempt >= MaxKVAttempts {
			return false, retried, fmt.Errorf("%w: kv key %s: %d attempts: %w", ErrConflicts, key, attempt, err)
		}
		retried++
	}
}

// isConflict reports whether err is a compare-and-set conflict: the key was
// created or changed by someone else between our read and our write.
func isConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// parseStored decodes a stored total: the canonical decimal text of a
// non-negative int64.
func parseStored(b []byte) (int64, error) {
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("negative value %d", n)
	}
	return n, nil
}
