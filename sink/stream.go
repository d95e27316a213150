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

// streamSink is the JetStream stream sink; see NewStream.
type streamSink struct {
	js     jetstream.JetStream
	prefix string
	err    error // from CheckSubjectPrefix, returned by every Write
	closed atomic.Bool
}

// NewStream returns a Sink that publishes one message per total to a
// JetStream stream that captures subjectPrefix.>:
//
//   - subject: subjectPrefix + "." + EncodeGroup(Group), so one group's
//     totals share a subject;
//   - payload: the JSON form of the Total,
//     {"group":"campaign-42","bucket":"2026-01-01T00:00:00Z","value":1017};
//   - headers: HeaderGroup, HeaderBucket, HeaderTotal, and Nats-Msg-Id set to
//     Total.ID() + ":" + decimal Value.
//
// A re-flush of the same value for the same (group, bucket) inside the
// stream's duplicate window is dropped by the server (PubAck.Duplicate) and
// counted as Stale. Any other value is appended, even a smaller one: the
// stream is a log of observations and cannot compare with what it holds.
// Readers keep the largest value per (group, bucket) (see Latest), so the
// total they see never moves backwards. Result.Applied counts messages the
// stream stored.
//
// An invalid subjectPrefix (see CheckSubjectPrefix) makes every Write fail
// with ErrBadSubject. Publishes are pipelined; when Write fails, its Result
// counts the acks received before the failure, and calling it again is safe
// (the message ids make the repeat a no-op inside the duplicate window).
//
// The sink does not own js. It is safe for concurrent use.
func NewStream(js jetstream.JetStream, subjectPrefix string) Sink {
	return &streamSink{js: js, prefix: subjectPrefix, err: CheckSubjectPrefix(subjectPrefix)}
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
				return res, fmt.Errorf("sink stream: waiting for acks: %w", ctx.Err())
			}
		}
		if pubErr != nil {
			return res, pubErr
		}
	}
	return res, nil
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
