package forward

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
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
	// AtomicMin, with Atomic, publishes a batch of fewer messages one
	// message at a time, all in flight together, as without Atomic, unless
	// Fence is set: an atomic batch costs about one sync of the server's
	// store, which a few messages alone cost less than
	// (BenchmarkBatchLatency). Default 0: every batch atomic.
	AtomicMin int
	// OnFallback, if set, runs when the server refuses an atomic batch as
	// a whole, with the number of its messages and the server's error,
	// before they are published one by one.
	OnFallback func(messages int, err error)

	// Fence, if set, makes every publish depend on the fence subject's
	// last sequence (see the package comment). The messages given are not
	// changed: the fence headers go on copies. Default nil: no fence.
	Fence *Fence
}

// Fence is a partition's fence as its owner took it: the fence subject in
// the output stream and the sequence of the fence message the owner wrote.
// A publish carrying it is stored only while that message is still the
// subject's last.
type Fence struct {
	// Subject is the fence subject (changelog.FenceSubject).
	Subject string
	// Seq is the stream sequence of the fence subject's last message, as
	// the owner wrote it.
	Seq uint64
}

// apply returns a copy of m whose headers (copied too) expect f.
func (f *Fence) apply(m *nats.Msg) *nats.Msg {
	h := make(nats.Header, len(m.Header)+2)
	for k, v := range m.Header {
		h[k] = slices.Clone(v)
	}
	h.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(f.Seq, 10))
	h.Set(jetstream.ExpectedLastSubjSeqSubjHeader, f.Subject)
	return &nats.Msg{Subject: m.Subject, Header: h, Data: m.Data}
}

// fenced wraps err, a fence refusal of n messages, so that it matches
// retry.ErrFenced. f may be nil: a message that carried its own
// expectation.
func (f *Fence) fenced(n int, err error) error {
	if f == nil {
		return fmt.Errorf("forward: %d messages: %w: %w", n, retry.ErrFenced, err)
	}
	return fmt.Errorf("forward: %d messages expecting %s at sequence %d: %w: %w", n, f.Subject, f.Seq, retry.ErrFenced, err)
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
	// Seq is the stream sequence of the stored message, when Done and Err
	// is nil: the one the PubAck gave (for a Duplicate, the sequence of
	// the copy the stream already held), or, for a message of an atomic
	// batch, the commit's sequence less the messages after it (the server
	// stores a batch at consecutive sequences).
	Seq uint64
}

// StoredUpTo is the highest sequence at which res says a batch stored a
// message itself, 0 for none. A duplicate does not count: its sequence is
// the copy the stream already held, which may be another writer's (a
// group's cursor) or below what this batch made durable (a watermark).
func StoredUpTo(res []Result) uint64 {
	var seq uint64
	for _, r := range res {
		if r.Done && r.Err == nil && !r.Duplicate {
			seq = max(seq, r.Seq)
		}
	}
	return seq
}

// Batch publishes msgs through js, one by one or as atomic batches
// (Options.Atomic), and waits until each is stored or refused for good;
// res[i] (len(res) == len(msgs)) tells which. Transient failures are
// published again with backoff, the same Nats-Msg-Id dropping a copy that
// did land. It returns an error wrapping ctx.Err() when ctx ends first, or
// retry.ErrFenced as soon as the fence moves (Options.Fence); res[i].Done is
// then false for the messages unsettled. msgs are left as given.
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
	if !o.Atomic || (o.Fence == nil && len(msgs) < o.AtomicMin) {
		return each(ctx, js, msgs, res, o)
	}
	// The sub-batches go one after the other: with a fence, never two of
	// them in flight.
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
	var ack *jetstreamext.BatchAck
	ro := o.Retry
	if o.OnRetry != nil {
		ro.OnRetry = func(attempt int, err error) { o.OnRetry(attempt, len(msgs), err) }
	}
	send := msgs
	if o.Fence != nil {
		// The first message carries the check, on a copy: the whole batch
		// depends on it.
		send = slices.Clone(msgs)
		send[0] = o.Fence.apply(msgs[0])
	}
	tried := false
	err := retry.Do(ctx, o.Component, func() error {
		if tried && o.Fence != nil {
			// The last attempt failed without an answer (a time-out, a
			// lost connection), so it may have been stored. Publishing it
			// again would store it twice once the stream's duplicate
			// window has passed; the fence makes this owner the
			// partition's only writer while it holds, so the stream
			// tells whether it was (landed).
			seq, err := landed(ctx, js, o.Fence, send[len(send)-1])
			if err != nil {
				return landedFailed(o.Fence, len(msgs), err)
			}
			if seq > 0 {
				ack = &jetstreamext.BatchAck{Sequence: seq}
				return nil
			}
		}
		tried = true
		if err := o.Inflight.acquire(ctx); err != nil {
			return err
		}
		for _, m := range send {
			if m.Header == nil {
				m.Header = nats.Header{}
			}
		}
		a, err := publishBatch(ctx, js, send, noFirstAck)
		o.Inflight.release()
		for _, m := range send {
			m.Header.Del(jetstreamext.BatchIDHeader)
			m.Header.Del(jetstreamext.BatchSeqHeader)
			m.Header.Del(jetstreamext.BatchCommitHeader)
			m.Reply = ""
		}
		switch retry.ClassifyBatch(err) {
		case retry.None:
			ack = a
			return nil
		case retry.Permanent:
			refused = err
			return nil
		case retry.Fenced:
			return o.Fence.fenced(len(msgs), err)
		}
		return fmt.Errorf("atomic batch of %d messages: %w", len(msgs), err)
	}, ro)
	if err != nil {
		return err
	}
	if refused == nil {
		// The batch is stored at consecutive sequences ending at the
		// commit's.
		last := len(res) - 1
		for i := range res {
			res[i] = Result{Done: true, Seq: ack.Sequence - uint64(last-i)}
		}
		return nil
	}
	if o.OnFallback != nil {
		o.OnFallback(len(msgs), refused)
	}
	return each(ctx, js, msgs, res, o)
}

// publishBatch publishes one atomic batch; a variable so that tests can
// lose an answer.
var publishBatch = jetstreamext.PublishMsgBatch

// noFirstAck sends a batch's messages without waiting for the server to
// acknowledge the first one: one round trip per batch (the commit's)
// instead of two. The server still answers the commit with the batch's
// fate, and with the error that ended a batch early.
var noFirstAck = jetstreamext.BatchFlowControl{AckFirst: false}

// landed tells whether last, the last message of a fenced atomic batch
// whose publish got no answer, is stored: the last message on its
// subject after the fence is last itself (the same payload and headers,
// the fence's and the batch's aside; the first-seen time a record
// carries tells two forwards of one key apart). An atomic batch is stored
// whole or not at all, so it returns the sequence of the batch's last
// message, or 0 when the batch is not stored.
//
// An equal message is this writer's only while the fence is still f: a
// new owner that took the fence meanwhile forwards the same inputs (its
// redeliveries, or an input routed twice) as equal messages, and taking
// one of them for this batch would settle the batch's other messages
// unstored. So once it finds one, landed reads the fence again, and
// reports that it moved (errFenceMoved), a fence refusal: what this
// batch stored before the new fence, the new owner restored; the rest is
// its to forward.
func landed(ctx context.Context, js jetstream.JetStream, f *Fence, last *nats.Msg) (uint64, error) {
	name, err := js.StreamNameBySubject(ctx, last.Subject)
	if err != nil {
		return 0, err
	}
	m, err := LastOnLeader(ctx, js, name, last.Subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	}
	if m.Sequence <= f.Seq || !bytes.Equal(m.Data, last.Data) || !sameHeaders(m.Header, last.Header) {
		return 0, nil
	}
	fence, err := LastOnLeader(ctx, js, name, f.Subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, fmt.Errorf("%w: none is stored", errFenceMoved)
	case err != nil:
		return 0, err
	case fence.Sequence != f.Seq:
		return 0, fmt.Errorf("%w: it is at sequence %d", errFenceMoved, fence.Sequence)
	}
	return m.Sequence, nil
}

// errFenceMoved is landed's answer when the fence moved: the caller
// reports it as a fence refusal (Fence.fenced).
var errFenceMoved = errors.New("the fence moved while the publish went unanswered")

// landedFailed is the error of an atomic batch of n messages whose landed
// check failed with err: a fence refusal when the fence moved.
func landedFailed(f *Fence, n int, err error) error {
	if errors.Is(err, errFenceMoved) {
		return f.fenced(n, err)
	}
	return fmt.Errorf("atomic batch of %d messages: did the last attempt land: %w", n, err)
}

// APIPrefix returns the subject prefix of the JetStream API that a
// JetStream context with options o asks: its domain's, its API prefix, or
// the server's own.
func APIPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// LastSeqOn returns the highest sequence of a message on subjects
// (wildcards allowed) in stream, as its leader stores it (LastOnLeader),
// 0 when none: each subject asked with requests bounded by request,
// retried (as component) until ctx ends.
func LastSeqOn(ctx context.Context, js jetstream.JetStream, stream string, subjects []string, request time.Duration, component string) (uint64, error) {
	var last uint64
	for _, sub := range subjects {
		var seq uint64
		err := retry.Do(ctx, component, func() error {
			rctx, cancel := context.WithTimeout(ctx, request)
			defer cancel()
			m, err := LastOnLeader(rctx, js, stream, sub)
			switch {
			case errors.Is(err, jetstream.ErrMsgNotFound):
				seq = 0
			case err != nil:
				return err
			default:
				seq = m.Sequence
			}
			return nil
		}, retry.Options{})
		if err != nil {
			return 0, fmt.Errorf("last message on %s: %w", sub, err)
		}
		last = max(last, seq)
	}
	return last, nil
}

// LastOnLeader returns the last message stored on subject (wildcards
// allowed) in stream as the stream's leader answers it (the STREAM.MSG.GET API), or
// jetstream.ErrMsgNotFound. Stream.GetLastMsgForSubject asks any replica
// when the stream allows direct gets (allow_direct, which `nats stream
// add` turns on by default), and a replica behind the leader would answer
// that a stored batch is not stored: it would be published again, and
// stored twice once the duplicate window has passed.
func LastOnLeader(ctx context.Context, js jetstream.JetStream, stream, subject string) (*jetstream.RawStreamMsg, error) {
	return getOnLeader(ctx, js, stream, struct {
		LastFor string `json:"last_by_subj"`
	}{subject}, "last message on "+subject)
}

// AtOnLeader returns the message stored at seq in stream as the stream's
// leader answers it (see LastOnLeader), or jetstream.ErrMsgNotFound when
// the stream holds none there (never written, deleted or past its end).
func AtOnLeader(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) (*jetstream.RawStreamMsg, error) {
	return getOnLeader(ctx, js, stream, struct {
		Seq uint64 `json:"seq"`
	}{seq}, fmt.Sprintf("message at sequence %d", seq))
}

// getOnLeader asks stream's leader for the message req selects (the
// STREAM.MSG.GET API); what names it in errors.
func getOnLeader(ctx context.Context, js jetstream.JetStream, stream string, req any, what string) (*jetstream.RawStreamMsg, error) {
	o := js.Options()
	prefix := APIPrefix(o)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.DefaultTimeout)
		defer cancel()
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	msg, err := js.Conn().RequestWithContext(ctx, prefix+"STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Header  []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("stream %s: %s: %w", stream, what, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return nil, resp.Error
	case resp.Message == nil:
		return nil, fmt.Errorf("stream %s: %s: an answer without a message", stream, what)
	}
	m := &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Seq, Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return nil, fmt.Errorf("stream %s: %s: headers: %w", stream, what, err)
		}
	}
	return m, nil
}

// sameHeaders compares a stored message's headers with those it was sent
// with, leaving out the ones the fence and the batch add.
func sameHeaders(stored, sent nats.Header) bool {
	skip := func(k string) bool {
		return strings.HasPrefix(k, "Nats-Expected-") || strings.HasPrefix(k, "Nats-Batch-")
	}
	n := 0
	for k, v := range sent {
		if skip(k) {
			continue
		}
		n++
		if !slices.Equal(stored[k], v) {
			return false
		}
	}
	for k := range stored {
		if !skip(k) {
			n--
		}
	}
	return n == 0
}

// each publishes msgs asynchronously, one by one, and awaits every PubAck;
// see Batch. With a fence, it publishes copies that carry the fence, one
// at a time (fencedRound).
func each(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg, res []Result, o Options) error {
	if o.Fence != nil {
		unanswered := make([]bool, len(msgs))
		return settle(ctx, res, o, "fenced publishes", func(pending []int) ([]int, error) {
			return fencedRound(ctx, js, msgs, res, o.Fence, pending, unanswered)
		})
	}
	futures := make([]jetstream.PubAckFuture, len(msgs))
	// Made once: an option built per message costs two allocations each.
	stall := []jetstream.PublishOpt{jetstream.WithStallWait(o.StallWait)}
	return settle(ctx, res, o, "publishes", func(pending []int) ([]int, error) {
		var last error
		futures = futures[:len(pending)]
		for k, i := range pending {
			if ctx.Err() != nil {
				// Abandoned: what is not published yet stays pending. A
				// publish already waiting for room waits out StallWait.
				clear(futures[k:])
				break
			}
			f, err := js.PublishMsgAsync(msgs[i], stall...)
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
			case <-ctx.Done():
				// Abandoned (a stop on a link that is down): the rest
				// stay pending, unanswered, without waiting out the
				// async publish timeout for each.
				still = append(still, pending[k:]...)
				return still, ctx.Err()
			case ack := <-f.Ok():
				res[i] = Result{Done: true, Duplicate: ack.Duplicate, Seq: ack.Sequence}
			case err := <-f.Err():
				if retry.IsPermanent(err) {
					res[i] = Result{Done: true, Err: err}
					continue
				}
				still = append(still, i)
				last = err
			}
		}
		return still, last
	})
}

// fencedRound publishes a copy of each pending message carrying f, one at
// a time and waiting for each PubAck, so that no two fenced publishes are
// in flight at once. It returns the messages that failed transiently and
// the last such error, or, at the first fence refusal, that refusal
// (retry.IsFenced). A message whose last publish got no answer
// (unanswered[i]) may be stored: as for an atomic batch, the stream is
// asked first (landed), and a message it holds is not published again,
// which would store it twice once the duplicate window has passed.
func fencedRound(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg, res []Result, f *Fence, pending []int, unanswered []bool) ([]int, error) {
	var last error
	still := pending[:0]
	for k, i := range pending {
		m := f.apply(msgs[i])
		if unanswered[i] {
			seq, err := landed(ctx, js, f, m)
			if errors.Is(err, errFenceMoved) {
				return nil, f.fenced(len(pending)-k, err)
			}
			if err != nil {
				still = append(still, i)
				last = fmt.Errorf("did the last publish land: %w", err)
				continue
			}
			if seq > 0 {
				res[i] = Result{Done: true, Seq: seq}
				continue
			}
		}
		ack, err := publishMsg(ctx, js, m)
		unanswered[i] = err != nil && !isAnswer(err)
		switch retry.Classify(err) {
		case retry.None:
			res[i] = Result{Done: true, Duplicate: ack.Duplicate, Seq: ack.Sequence}
		case retry.Permanent:
			res[i] = Result{Done: true, Err: err}
		case retry.Fenced:
			return nil, f.fenced(len(pending)-k, err)
		default:
			still = append(still, i)
			last = err
		}
	}
	return still, last
}

// publishMsg publishes one message and awaits its PubAck; a variable so
// that tests can lose an answer.
var publishMsg = func(ctx context.Context, js jetstream.JetStream, m *nats.Msg) (*jetstream.PubAck, error) {
	return js.PublishMsg(ctx, m)
}

// isAnswer tells whether err is the server's answer to a publish (an API
// error: the message was refused, not stored), as opposed to no answer (a
// time-out, a lost connection), after which the message may be stored.
func isAnswer(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api)
}

// settle runs round over the indexes of res still pending, with retry.Do,
// until none is: round publishes them, settles res for each stored or
// refused permanently, and returns the ones that failed transiently with
// the last such error. A fenced error from round ends settle at once.
func settle(ctx context.Context, res []Result, o Options, what string, round func(pending []int) ([]int, error)) error {
	pending := make([]int, len(res))
	for i := range pending {
		pending[i] = i
		res[i] = Result{}
	}
	failed := 0
	ro := o.Retry
	if o.OnRetry != nil {
		ro.OnRetry = func(attempt int, err error) { o.OnRetry(attempt, failed, err) }
	}
	return retry.Do(ctx, o.Component, func() error {
		still, err := round(pending)
		if retry.IsFenced(err) {
			return err
		}
		pending, failed = still, len(still)
		if len(pending) > 0 {
			return fmt.Errorf("%d of the batch's %s failed: %w", len(pending), what, err)
		}
		return nil
	}, ro)
}

// IsDirective reports whether header name k is an instruction to the stream
// or server that carried the message (Nats-Expected-*, Nats-Batch-*,
// Nats-Rollup, ...) rather than part of it. A copy of an input leaves these
// out, so that the next stream does not carry them out again
// (docs/failures.md); Nats-TTL is not one.
func IsDirective(k string) bool {
	if !strings.HasPrefix(k, "Nats-") {
		return false
	}
	switch k {
	case "Nats-Rollup", "Nats-Incr", "Nats-Required-Api-Level", "Nats-Pin-Id":
		return true
	}
	return strings.HasPrefix(k, "Nats-Expected-") || strings.HasPrefix(k, "Nats-Batch-") ||
		strings.HasPrefix(k, "Nats-Schedule") || strings.HasPrefix(k, "Nats-Trace-")
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
