// Package forward publishes a batch of messages to JetStream with many in
// flight, waits for every PubAck, and retries what failed transiently: the
// forward loop of the stage's partition workers, shared with the
// benchmark's raw loop so that both forward with the same code.
//
// A message the server (or the client) refuses permanently (retry.Classify)
// is not retried: its Result carries the error and the rest of the batch
// proceeds. Use CheckSize before publishing to turn away a message that
// cannot fit the server's limits without sending it.
//
// With Options.Atomic, the batch is published as atomic batches of at most
// Options.BatchMax messages (github.com/synadia-io/orbit.go/jetstreamext):
// the server stores each whole or not at all, and syncs it to disk once
// instead of once per message, which is what makes a server that fsyncs
// every write fast. An atomic batch that fails transiently
// (retry.ClassifyBatch: a timeout, too many batches open on the stream) is
// published again whole; one the server refuses as a whole (an id already
// in the duplicate window, after a crash between publish and commit; a
// batch over the server's size limit; a stream that does not allow atomic
// publish) is published again one message at a time, as without Atomic,
// so that the duplicate window drops the copies it holds and the rest are
// stored. Options.OnFallback hears about each such batch. A Limiter shared
// by every caller that publishes to one stream bounds the batches open on
// it at once.
//
// Use:
//
//	res := make([]forward.Result, len(msgs))
//	err := forward.Batch(ctx, js, msgs, res, forward.Options{})
//	// err != nil: ctx ended with publishes still failing; res[i].Done says which landed.
//	// res[i].Err != nil: message i was refused permanently.
package forward

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/dedupe-stage/dedupe-stage/internal/retry"
)

// Errors returned by CheckSize. Both are permanent (retry.IsPermanent).
var (
	// ErrTooLarge means headers plus payload exceed the server's
	// max_payload.
	ErrTooLarge = errors.New("forward: message larger than the server's max_payload")
	// ErrHeadersTooLarge means the headers exceed what JetStream stores
	// (retry.MaxHeaderBytes).
	ErrHeadersTooLarge = errors.New("forward: headers larger than JetStream stores")
)

// DefaultBatchMax is the most messages of one atomic batch: nats-server's
// default max_batch_size (jetstream.limits), which a client cannot read.
const DefaultBatchMax = 1000

// DefaultStallWait is how long a publish waits for room when the maximum
// of asynchronous publishes in flight is reached.
const DefaultStallWait = 5 * time.Second

// Options configure Batch. The zero value is usable.
type Options struct {
	// Component names the operation to Retry.Reporter. Default "publish".
	Component string
	// StallWait: default DefaultStallWait.
	StallWait time.Duration
	// Retry is passed to retry.Do (its OnRetry is replaced by OnRetry
	// below).
	Retry retry.Options
	// OnRetry, if set, runs after an attempt in which failed messages
	// failed transiently, before the backoff wait, with the attempt number
	// (from 1) and the last error.
	OnRetry func(attempt, failed int, err error)

	// Atomic publishes the batch as atomic batches (the stream must allow
	// atomic publish; if it does not, every batch falls back to one
	// publish per message). Default false: one asynchronous publish per
	// message.
	Atomic bool
	// BatchMax is the most messages of one atomic batch; a larger batch is
	// split. At most the server's max_batch_size. Default DefaultBatchMax.
	BatchMax int
	// Inflight, if set, bounds the atomic batches open at once; share one
	// Limiter among all callers that publish to one stream. Default nil:
	// unbounded.
	Inflight *Limiter
	// OnFallback, if set, runs when the server refuses an atomic batch as
	// a whole, with the number of its messages and the server's error,
	// before they are published one by one.
	OnFallback func(messages int, err error)
}

// Limiter bounds how many atomic batches are open at once. It is safe for
// concurrent use; a nil *Limiter bounds nothing.
type Limiter struct{ slots chan struct{} }

// NewLimiter returns a Limiter of n slots (at least 1).
func NewLimiter(n int) *Limiter { return &Limiter{slots: make(chan struct{}, max(n, 1))} }

// acquire waits for a slot or for ctx to end.
func (l *Limiter) acquire(ctx context.Context) error {
	if l == nil {
		return nil
	}
	select {
	case l.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// release frees a slot taken by acquire.
func (l *Limiter) release() {
	if l != nil {
		<-l.slots
	}
}

// Result is the outcome of one message of a batch.
type Result struct {
	// Done is true once the message's fate is known: stored (Err nil) or
	// refused permanently (Err set).
	Done bool
	// Err is the permanent error the message was refused with.
	Err error
	// Duplicate is true when the stream already held the message's
	// Nats-Msg-Id and dropped this copy.
	Duplicate bool
}

// Batch publishes msgs through js and waits until each is stored: without
// Options.Atomic, asynchronously one by one, awaiting every PubAck; with
// it, as atomic batches awaiting each batch's commit ack (see the package
// comment). Messages that fail transiently are published again (the same
// message, so one that did land is dropped as a duplicate of its
// Nats-Msg-Id) with backoff, until each is stored or refused permanently;
// res[i] (len(res) must be len(msgs)) tells which. Batch returns nil then,
// or an error wrapping ctx.Err() when ctx ends first, with res[i].Done
// false for the messages still unsettled. msgs are left as they were
// given.
func Batch(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg, res []Result, o Options) error {
	if len(res) != len(msgs) {
		return fmt.Errorf("forward: %d results for %d messages", len(res), len(msgs))
	}
	if o.Component == "" {
		o.Component = "publish"
	}
	if o.StallWait <= 0 {
		o.StallWait = DefaultStallWait
	}
	if !o.Atomic {
		return each(ctx, js, msgs, res, o)
	}
	if o.BatchMax <= 0 {
		o.BatchMax = DefaultBatchMax
	}
	clear(res)
	for start := 0; start < len(msgs); start += o.BatchMax {
		end := min(start+o.BatchMax, len(msgs))
		if err := atomicBatch(ctx, js, msgs[start:end], res[start:end], o); err != nil {
			return err
		}
	}
	return nil
}

// atomicBatch publishes msgs (at most o.BatchMax) as one atomic batch, again
// whole while it fails transiently, and one by one once the server refuses
// it as a whole.
func atomicBatch(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg, res []Result, o Options) error {
	var refused error
	ro := o.Retry
	if o.OnRetry != nil {
		ro.OnRetry = func(attempt int, err error) { o.OnRetry(attempt, len(msgs), err) }
	}
	err := retry.Do(ctx, o.Component, func() error {
		if err := o.Inflight.acquire(ctx); err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header == nil {
				m.Header = nats.Header{}
			}
		}
		_, err := jetstreamext.PublishMsgBatch(ctx, js, msgs)
		o.Inflight.release()
		for _, m := range msgs {
			m.Header.Del(jetstreamext.BatchIDHeader)
			m.Header.Del(jetstreamext.BatchSeqHeader)
			m.Header.Del(jetstreamext.BatchCommitHeader)
			m.Reply = ""
		}
		switch retry.ClassifyBatch(err) {
		case retry.None:
			return nil
		case retry.Permanent:
			refused = err
			return nil
		}
		return fmt.Errorf("atomic batch of %d messages: %w", len(msgs), err)
	}, ro)
	if err != nil {
		return err
	}
	if refused == nil {
		for i := range res {
			res[i] = Result{Done: true}
		}
		return nil
	}
	if o.OnFallback != nil {
		o.OnFallback(len(msgs), refused)
	}
	return each(ctx, js, msgs, res, o)
}

// each publishes msgs asynchronously, one by one, and awaits every PubAck;
// see Batch.
func each(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg, res []Result, o Options) error {
	pending := make([]int, len(msgs))
	for i := range pending {
		pending[i] = i
		res[i] = Result{}
	}
	futures := make([]jetstream.PubAckFuture, len(msgs))
	failed := 0
	ro := o.Retry
	if o.OnRetry != nil {
		ro.OnRetry = func(attempt int, err error) { o.OnRetry(attempt, failed, err) }
	}
	return retry.Do(ctx, o.Component, func() error {
		var last error
		futures = futures[:len(pending)]
		for k, i := range pending {
			f, err := js.PublishMsgAsync(msgs[i], jetstream.WithStallWait(o.StallWait))
			if err != nil {
				futures[k] = nil
				if retry.IsPermanent(err) {
					res[i] = Result{Done: true, Err: err}
				} else {
					last = err
				}
				continue
			}
			futures[k] = f
		}
		still := pending[:0]
		for k, i := range pending {
			f := futures[k]
			if f == nil {
				if !res[i].Done {
					still = append(still, i)
				}
				continue
			}
			select {
			case ack := <-f.Ok():
				res[i] = Result{Done: true, Duplicate: ack.Duplicate}
			case err := <-f.Err():
				if retry.IsPermanent(err) {
					res[i] = Result{Done: true, Err: err}
					continue
				}
				still = append(still, i)
				last = err
			}
		}
		pending, failed = still, len(still)
		if len(pending) > 0 {
			return fmt.Errorf("%d of the batch's publishes failed: %w", len(pending), last)
		}
		return nil
	}, ro)
}

// HeaderSize returns the size of h as nats.go sends it: the NATS/1.0 status
// line, one "Key: value" line per value, and the blank line; 0 without
// headers.
func HeaderSize(h nats.Header) int {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}

// CheckSize returns nil if m fits the server's maxPayload (headers and
// payload together, as the client checks) and JetStream's header limit;
// otherwise an error wrapping ErrTooLarge or ErrHeadersTooLarge that gives
// the sizes. maxPayload <= 0 checks only the header limit.
func CheckSize(m *nats.Msg, maxPayload int64) error {
	hdr := HeaderSize(m.Header)
	if hdr > retry.MaxHeaderBytes {
		return retry.MarkPermanent(fmt.Errorf("%w: headers are %d bytes, JetStream stores at most %d", ErrHeadersTooLarge, hdr, retry.MaxHeaderBytes))
	}
	if total := int64(hdr + len(m.Data)); maxPayload > 0 && total > maxPayload {
		return retry.MarkPermanent(fmt.Errorf("%w: %d bytes of headers and %d of payload, max_payload is %d", ErrTooLarge, hdr, len(m.Data), maxPayload))
	}
	return nil
}
