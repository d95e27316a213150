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

// Batch publishes msgs asynchronously through js and waits for every
// PubAck. Messages that fail transiently are published again (the same
// message, so one that did land is dropped as a duplicate of its
// Nats-Msg-Id) with backoff, until each is stored or refused permanently;
// res[i] (len(res) must be len(msgs)) tells which. Batch returns nil then,
// or an error wrapping ctx.Err() when ctx ends first, with res[i].Done
// false for the messages still unsettled.
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
