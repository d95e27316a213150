// Package loop is the minimal consume -> publish -> ack loop that the
// benchmarks measure dedupe-stage against: the same durable pull consumer,
// the same routing to workers, the same batches with a linger, the same
// asynchronous publishes awaited as a batch before the batch is acked, and
// no dedupe state at all.
//
// With Options.Key set, messages are routed to workers by their key, as the
// stage routes keys to partitions. With Options.KeyAsMsgID as well it
// becomes "JetStream's own dedupe": every forward carries its key as
// Nats-Msg-Id and the output stream's duplicate window drops the repeats.
//
// Use:
//
//	st, err := loop.Run(ctx, loop.DefaultOptions(cons, js, func(s string) string { return "out." + s }))
//	// Run returns after ctx is done and the batches in flight are acked.
package loop

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/dedupe-stage/dedupe-stage/internal/batcher"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
)

// Errors returned by Run.
var (
	// ErrBadOptions means an Options field is invalid; the message names it.
	ErrBadOptions = errors.New("loop: bad options")
)

// Options configure Run. Build them with DefaultOptions.
type Options struct {
	// Consumer is the durable pull consumer to drain. Required.
	Consumer jetstream.Consumer
	// JS publishes the forwards. Required. Its PublishAsyncMaxPending
	// bounds publishes in flight (the stage uses 1024).
	JS jetstream.JetStream
	// Subject maps an input subject to the output subject. Required.
	Subject func(in string) string
	// Key, if set, returns a message's key: messages are routed to
	// workers by xxhash64(key) mod Workers, so that copies of a key meet
	// in one worker, and a message for which it fails is acked and
	// counted in Stats.Skipped, never forwarded. Nil (default) routes
	// round robin.
	Key func(m jetstream.Msg) (string, error)
	// KeyAsMsgID carries the key as Nats-Msg-Id on every forward. It
	// requires Key. Default false: forwards carry no id.
	KeyAsMsgID bool
	// Workers is the number of batching goroutines. Default 8 (the
	// stage's default partitions).
	Workers int
	// BatchSize is the most messages a worker publishes and acks together.
	// Default 256.
	BatchSize int
	// Linger is how long a worker waits for more messages to fill a batch.
	// Default 1ms.
	Linger time.Duration
	// PullMax is the pull subscription's buffer (PullMaxMessages). Default
	// min(4096, BatchSize*Workers), as the stage does with its defaults.
	PullMax int
	// Atomic forwards each batch as atomic batches (forward.Options.Atomic),
	// as the stage does with output.publish atomic; the output stream must
	// allow atomic publish. Default false.
	Atomic bool
	// BatchMax is the most messages of one atomic batch. Default
	// forward.DefaultBatchMax.
	BatchMax int
	// MaxBatchesInFlight bounds the atomic batches open at once across
	// the workers. Default 32, the stage's default.
	MaxBatchesInFlight int
	// Fast forwards each batch as one fast batch (nats-server 2.14's
	// flow-controlled batch publish, jetstreamext.NewFastPublisher): the
	// server stores each message as it comes, acknowledges every Flow
	// messages and the commit, and stops the batch at a gap. The output
	// stream must allow batch publish. A fast batch carries no PubAck per
	// message: Stats.Duplicates is not counted. Default false.
	Fast bool
}

// DefaultOptions returns options with the stage's batching defaults: 8
// workers, batches of 256, 1ms linger.
func DefaultOptions(cons jetstream.Consumer, js jetstream.JetStream, subject func(string) string) Options {
	return Options{
		Consumer:  cons,
		JS:        js,
		Subject:   subject,
		Workers:   8,
		BatchSize: 256,
		Linger:    time.Millisecond,
		PullMax:   2048,

		BatchMax:           forward.DefaultBatchMax,
		MaxBatchesInFlight: 32,
	}
}

// Validate reports the first invalid field.
func (o Options) Validate() error {
	switch {
	case o.Consumer == nil:
		return fmt.Errorf("%w: Consumer is nil", ErrBadOptions)
	case o.JS == nil:
		return fmt.Errorf("%w: JS is nil", ErrBadOptions)
	case o.Subject == nil:
		return fmt.Errorf("%w: Subject is nil", ErrBadOptions)
	case o.KeyAsMsgID && o.Key == nil:
		return fmt.Errorf("%w: KeyAsMsgID is set and Key is nil", ErrBadOptions)
	case o.Workers < 1:
		return fmt.Errorf("%w: Workers is %d, want >= 1", ErrBadOptions, o.Workers)
	case o.BatchSize < 1:
		return fmt.Errorf("%w: BatchSize is %d, want >= 1", ErrBadOptions, o.BatchSize)
	case o.Linger < 0:
		return fmt.Errorf("%w: Linger is %v, want >= 0", ErrBadOptions, o.Linger)
	case o.PullMax < 1:
		return fmt.Errorf("%w: PullMax is %d, want >= 1", ErrBadOptions, o.PullMax)
	case o.Atomic && o.BatchMax < 1:
		return fmt.Errorf("%w: BatchMax is %d, want >= 1", ErrBadOptions, o.BatchMax)
	case o.Atomic && o.Fast:
		return fmt.Errorf("%w: Atomic and Fast are both set", ErrBadOptions)
	case o.Atomic && o.MaxBatchesInFlight < 1:
		return fmt.Errorf("%w: MaxBatchesInFlight is %d, want >= 1", ErrBadOptions, o.MaxBatchesInFlight)
	}
	return nil
}

// Stats count what Run did. Read them with Load while Run works.
type Stats struct {
	// Forwarded counts PubAcks received (duplicates included).
	Forwarded atomic.Uint64
	// Duplicates counts PubAcks that said the output stream dropped the
	// forward as a duplicate of an id it holds.
	Duplicates atomic.Uint64
	// Skipped counts messages Key failed on (acked, not forwarded).
	Skipped atomic.Uint64
	// PublishErrors counts publishes that failed and were retried.
	PublishErrors atomic.Uint64
	// BatchesRefused counts atomic batches the output refused as a whole
	// and the loop then forwarded one message at a time.
	BatchesRefused atomic.Uint64
	// Rejected counts messages the output refused with an error no retry
	// changes (acked, not forwarded).
	Rejected atomic.Uint64
}

// Run drains the consumer until ctx is done, then stops pulling, finishes
// the batches in flight (publish, await every PubAck, ack) and returns. It
// forwards with internal/forward, as the stage does: a publish that fails
// transiently is retried (with the same id) until it succeeds or ctx is
// done, and what is not acknowledged then comes back after AckWait; one
// refused permanently is counted in Stats.Rejected and acked. stats may be
// nil.
func Run(ctx context.Context, opts Options, stats *Stats) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	if stats == nil {
		stats = &Stats{}
	}
	fo := forward.Options{
		OnRetry:    func(_, failed int, _ error) { stats.PublishErrors.Add(uint64(failed)) },
		OnFallback: func(int, error) { stats.BatchesRefused.Add(1) },
		Atomic:     opts.Atomic,
		BatchMax:   opts.BatchMax,
	}
	if opts.Atomic {
		fo.Inflight = forward.NewLimiter(opts.MaxBatchesInFlight)
	}
	ins := make([]chan item, opts.Workers)
	var wg sync.WaitGroup
	for i := range ins {
		ins[i] = make(chan item, opts.BatchSize)
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker(ctx, opts, fo, ins[i], stats)
		}()
	}
	defer func() {
		for _, c := range ins {
			close(c)
		}
		wg.Wait()
	}()

	next := 0
	for ctx.Err() == nil {
		iter, err := opts.Consumer.Messages(jetstream.PullMaxMessages(opts.PullMax))
		if err != nil {
			return fmt.Errorf("loop: pull: %w", err)
		}
		stop := context.AfterFunc(ctx, iter.Drain)
		for {
			m, err := iter.Next()
			if err != nil {
				break
			}
			it := item{msg: m}
			w := next
			if opts.Key != nil {
				if it.id, err = opts.Key(m); err != nil {
					stats.Skipped.Add(1)
					_ = m.Ack()
					continue
				}
				w = int(xxhash.Sum64String(it.id) % uint64(opts.Workers))
			} else {
				next = (next + 1) % opts.Workers
			}
			ins[w] <- it
		}
		stop()
		iter.Stop()
	}
	return nil
}

// item is a message on its way to a worker, with its key when Options.Key
// is set.
type item struct {
	msg jetstream.Msg
	id  string
}

// worker gathers batches as the stage's partition worker does (the same
// batcher) and forwards them.
func worker(ctx context.Context, opts Options, fo forward.Options, in <-chan item, stats *Stats) {
	var out []*nats.Msg
	var res []forward.Result
	batcher.Run(in, opts.BatchSize, opts.Linger, func(batch []item) {
		out, res = out[:0], res[:0]
		for i := range batch {
			out = append(out, outMsg(opts, &batch[i]))
		}
		res = append(res, make([]forward.Result, len(out))...)
		if opts.Fast {
			forwardFast(ctx, opts.JS, batch, out, stats)
			return
		}
		forwardBatch(ctx, opts.JS, fo, batch, out, res, stats)
	})
}

// forwardBatch publishes the batch with the stage's forward loop (every
// PubAck awaited, transient failures retried while ctx lasts), then acks
// the batch. A message the output refuses permanently is counted in
// Stats.Rejected and acked. On ctx done with publishes failing, the batch
// is left unacked.
func forwardBatch(ctx context.Context, js jetstream.JetStream, fo forward.Options, batch []item, out []*nats.Msg, res []forward.Result, stats *Stats) {
	if err := forward.Batch(ctx, js, out, res, fo); err != nil {
		return
	}
	for _, r := range res {
		switch {
		case r.Err != nil:
			stats.Rejected.Add(1)
		case r.Duplicate:
			stats.Forwarded.Add(1)
			stats.Duplicates.Add(1)
		default:
			stats.Forwarded.Add(1)
		}
	}
	for _, it := range batch {
		_ = it.msg.Ack()
	}
}

// forwardFast publishes the batch as one fast batch and acks it once the
// server has committed it; a batch that fails is published again whole
// (the same messages: with ids, the output's duplicate window drops what
// landed) while ctx lasts, and left unacked when ctx is done.
func forwardFast(ctx context.Context, js jetstream.JetStream, batch []item, out []*nats.Msg, stats *Stats) {
	for ctx.Err() == nil {
		if err := fastBatch(ctx, js, out); err != nil {
			stats.PublishErrors.Add(uint64(len(out)))
			continue
		}
		stats.Forwarded.Add(uint64(len(out)))
		for _, it := range batch {
			_ = it.msg.Ack()
		}
		return
	}
}

// fastBatch publishes out as one fast batch, out's last message the
// commit.
func fastBatch(ctx context.Context, js jetstream.JetStream, out []*nats.Msg) error {
	fp, err := jetstreamext.NewFastPublisher(js)
	if err != nil {
		return err
	}
	for _, m := range out[:len(out)-1] {
		if _, err := fp.AddMsg(m); err != nil {
			return err
		}
	}
	_, err = fp.CommitMsg(ctx, out[len(out)-1])
	return err
}

// outMsg copies the message's headers (without Nats-Expected-*) and payload to the
// output subject, with the key as Nats-Msg-Id when KeyAsMsgID is set: the
// same work the stage's forward does.
func outMsg(opts Options, it *item) *nats.Msg {
	in := it.msg.Headers()
	h := make(nats.Header, len(in)+1)
	for k, v := range in {
		if strings.HasPrefix(k, "Nats-Expected-") {
			continue
		}
		h[k] = v
	}
	if opts.KeyAsMsgID {
		h[jetstream.MsgIDHeader] = []string{it.id}
	}
	return &nats.Msg{Subject: opts.Subject(it.msg.Subject()), Header: h, Data: it.msg.Data()}
}
