package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
)

// Headers the stream sink sets on every message, next to Nats-Msg-Id.
const (
	// HeaderGroup carries Total.Group as given. It is informational: the
	// JSON payload is authoritative.
	HeaderGroup = "Dedupe-Group"
	// HeaderBucket carries Total.Bucket in RFC 3339, UTC.
	HeaderBucket = "Dedupe-Bucket"
	// HeaderTotal carries Total.Value in decimal.
	HeaderTotal = "Dedupe-Total"
)

// streamWindow is how many publishes the stream sink keeps in flight before
// it waits for their acks.
const streamWindow = 256

// StreamOptions configure the stream sink. The zero value publishes one
// message at a time, asynchronously.
type StreamOptions struct {
	// Atomic publishes each Write as atomic batches of at most BatchMax
	// totals: a server that fsyncs every write (sync_always) then syncs
	// once per batch instead of once per total. The stream must allow
	// atomic publish. A batch the server refuses as a whole (one of its
	// message ids is already in the stream's duplicate window, as after a
	// flush that stored but did not return) is published again one message
	// at a time, so that the window drops the repeats and the rest are
	// stored. Default false.
	Atomic bool
	// BatchMax is the most totals of one atomic batch, at most the
	// server's max_batch_size. Default forward.DefaultBatchMax (the
	// server's default, 1000).
	BatchMax int
}

// streamSink is the JetStream stream sink; see NewStream.
type streamSink struct {
	js     jetstream.JetStream
	prefix string
	opts   StreamOptions
	err    error // from CheckSubjectPrefix, returned by every Write
	closed atomic.Bool
}

// NewStream returns a Sink that publishes one message per total to the
// stream capturing subjectPrefix.>, with Nats-Msg-Id set from the total's ID
// and value; readers keep the largest value per (group, bucket) (Latest,
// docs/sinks.md). A failed Write can be called again. An invalid
// subjectPrefix makes every Write fail with ErrBadSubject. The sink does not
// own js; it is safe for concurrent use.
func NewStream(js jetstream.JetStream, subjectPrefix string) Sink {
	return NewStreamWith(js, subjectPrefix, StreamOptions{})
}

// NewStreamWith is NewStream with options: with StreamOptions.Atomic, each
// Write is published as atomic batches.
func NewStreamWith(js jetstream.JetStream, subjectPrefix string, o StreamOptions) Sink {
	if o.BatchMax <= 0 {
		o.BatchMax = forward.DefaultBatchMax
	}
	return &streamSink{js: js, prefix: subjectPrefix, opts: o, err: CheckSubjectPrefix(subjectPrefix)}
}

// CheckSubjectPrefix returns nil if prefix is usable as the stream sink's
// subject prefix: one or more non-empty "."-separated tokens without
// whitespace, control characters or the wildcards "*" and ">". Otherwise it
// returns an error wrapping ErrBadSubject that names the prefix.
func CheckSubjectPrefix(prefix string) error {
	if prefix == "" {
		return fmt.Errorf("%w: empty", ErrBadSubject)
	}
	for tok := range strings.SplitSeq(prefix, ".") {
		if tok == "" {
			return fmt.Errorf("%w: %q has an empty token", ErrBadSubject, prefix)
		}
		if strings.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '*' || r == '>' }) {
			return fmt.Errorf("%w: %q contains whitespace, a control character or a wildcard", ErrBadSubject, prefix)
		}
	}
	return nil
}

// Name returns "stream".
func (s *streamSink) Name() string { return "stream" }

// Close marks the sink closed. It is safe to call more than once.
func (s *streamSink) Close() error {
	s.closed.Store(true)
	return nil
}

// Write publishes each total; see NewStream.
func (s *streamSink) Write(ctx context.Context, totals []Total) (Result, error) {
	if s.closed.Load() {
		return Result{}, ErrClosed
	}
	if s.err != nil {
		return Result{}, s.err
	}
	uniq, dropped, err := prepare(totals)
	if err != nil {
		return Result{}, err
	}
	res := Result{Stale: dropped}
	if s.opts.Atomic {
		for start := 0; start < len(uniq); start += s.opts.BatchMax {
			if err := s.writeAtomic(ctx, uniq[start:min(start+s.opts.BatchMax, len(uniq))], &res); err != nil {
				return res, err
			}
		}
		return res, nil
	}
	return res, s.writeAsync(ctx, uniq, &res)
}

// writeAsync publishes totals asynchronously, streamWindow in flight at a
// time, and counts the acks in res.
func (s *streamSink) writeAsync(ctx context.Context, uniq []Total, res *Result) error {
	for start := 0; start < len(uniq); start += streamWindow {
		chunk := uniq[start:min(start+streamWindow, len(uniq))]
		futures := make([]jetstream.PubAckFuture, 0, len(chunk))
		var pubErr error
		for _, t := range chunk {
			m, id, err := s.message(t)
			if err != nil {
				pubErr = err
				break
			}
			f, err := s.js.PublishMsgAsync(m, jetstream.WithMsgID(id))
			if err != nil {
				pubErr = fmt.Errorf("sink stream: publish %s: %w", id, err)
				break
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case ack := <-f.Ok():
				if ack.Duplicate {
					res.Stale++
				} else {
					res.Applied++
				}
			case err := <-f.Err():
				if pubErr == nil {
					pubErr = fmt.Errorf("sink stream: publish %s: %w", f.Msg().Header.Get(jetstream.MsgIDHeader), err)
				}
			case <-ctx.Done():
				return fmt.Errorf("sink stream: waiting for acks: %w", ctx.Err())
			}
		}
		if pubErr != nil {
			return pubErr
		}
	}
	return nil
}

// writeAtomic publishes totals (at most BatchMax) as one atomic batch, and
// one at a time (writeAsync) when the server refuses the batch as a whole.
// A batch that fails otherwise is not retried here: Write returns the error
// and the caller writes the totals again, and their ids make the repeat
// safe.
func (s *streamSink) writeAtomic(ctx context.Context, totals []Total, res *Result) error {
	msgs := make([]*nats.Msg, len(totals))
	for i, t := range totals {
		m, id, err := s.message(t)
		if err != nil {
			return err
		}
		m.Header.Set(jetstream.MsgIDHeader, id)
		msgs[i] = m
	}
	_, err := jetstreamext.PublishMsgBatch(ctx, s.js, msgs)
	switch retry.ClassifyBatch(err) {
	case retry.None:
		res.Applied += len(totals)
		return nil
	case retry.Permanent:
		return s.writeAsync(ctx, totals, res)
	}
	return fmt.Errorf("sink stream: atomic batch of %d totals: %w", len(totals), err)
}

// message builds the message for t and returns it with its Nats-Msg-Id.
func (s *streamSink) message(t Total) (*nats.Msg, string, error) {
	data, err := json.Marshal(t)
	if err != nil {
		return nil, "", fmt.Errorf("sink stream: encode %s: %w", t.ID(), err)
	}
	value := strconv.FormatInt(t.Value, 10)
	m := nats.NewMsg(s.prefix + "." + EncodeGroup(t.Group))
	m.Data = data
	m.Header.Set(HeaderGroup, t.Group)
	m.Header.Set(HeaderBucket, t.Bucket.UTC().Format(time.RFC3339))
	m.Header.Set(HeaderTotal, value)
	return m, t.ID() + ":" + value, nil
}
