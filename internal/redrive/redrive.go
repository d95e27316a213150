// Package redrive publishes dead letters again to the input subject each
// came from, with the input's headers and payload, once the cause is fixed:
// the stage then judges each copy like any other input.
//
// A run reads the selected dead letters of the dead-letter stream in order
// with an ordered consumer, bounded by the stream's last sequence when it
// starts. Each copy is published expecting the input's stream
// (Nats-Expected-Stream) with a Nats-Msg-Id that is the input's own, or
// else MsgID of the dead letter, and once the stream has stored it a mark
// (the dead letter's stream and sequence) goes into a key-value bucket.
// A dead letter with a mark is not published again, so an interrupted run
// resumes after its last confirmed copy, however late; a copy that landed
// without its mark (the run cut off between the two) is dropped by the
// input stream's duplicate window, unless the copy has no Nats-Msg-Id
// (Options.KeyFromMsgID). A dead letter that does not carry its
// input whole (no payload, cut headers) is refused with a reason, never
// published in part.
//
// A run does not loop. A dead letter whose reason lies in the input itself
// (deadletter.Reason.InInput: no_key, bad_payload, oversized, ...) is
// refused, since its copy would be dead-lettered again; and a dead letter
// of a copy, dead-lettered again for the reason it was redriven for
// (HeaderRedrivenReason), is skipped. Options.Force publishes both, once
// the configuration accepts them.
//
//	sum, err := redrive.Run(ctx, js, redrive.Options{Stream: "DEDUPE_DLQ", Subject: "dedupe.dlq",
//		Reasons: []deadletter.Reason{deadletter.ReasonOutputRejected}})
//
// The design and its limits are in configs/README.md, "Redriving dead letters".
package redrive

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
)

// Headers set on every copy.
const (
	// HeaderRedrivenFrom is the dead letter's stream and sequence ("DEDUPE_DLQ:17").
	HeaderRedrivenFrom = "Dedupe-Redriven-From"
	// HeaderRedrivenReason is the dead letter's reason: a dead letter of the copy for the same reason is
	// a loop, which a run skips (SkippedDeadLetteredAgain).
	HeaderRedrivenReason = "Dedupe-Redriven-Reason"
)

// DefaultBucket is the key-value bucket of the marks.
const DefaultBucket = "DEDUPE_REDRIVE"

// Defaults of Options.
const (
	// DefaultPublishTimeout bounds the retries of one copy's publish.
	DefaultPublishTimeout = 30 * time.Second
	// DefaultFetchWait is how long a run waits for the next dead letter before it ends.
	DefaultFetchWait = 2 * time.Second
)

// fetchBatch is the most dead letters read at once.
const fetchBatch = 256

// attemptTimeout bounds one publish attempt; markTimeout the write of one mark.
const (
	attemptTimeout = 10 * time.Second
	markTimeout    = 10 * time.Second
)

// Errors of Run.
var (
	// ErrStopped: a copy's publish failed for longer than PublishTimeout with errors a retry could clear
	// (no stream answers its subject, the server is away); the run stopped there and a later run resumes.
	ErrStopped = errors.New("redrive stopped")
)

// Options say which dead letters a run redrives and where its marks are.
type Options struct {
	// Stream is the dead-letter stream (dead_letter.stream). Required.
	Stream string
	// Subject is the dead letters' subject prefix (dead_letter.subject). Required.
	Subject string

	// Reasons selects the dead letters of these reasons. Default: every reason.
	Reasons []deadletter.Reason
	// FromSeq and ToSeq select the dead-letter stream's sequences, both included. Default: the first,
	// and the last when the run starts.
	FromSeq, ToSeq uint64
	// Since and Until select the dead letters stored in this time, both included. Default: any time.
	Since, Until time.Time
	// Limit is the most copies a run publishes. Default 0: no limit.
	Limit int
	// DryRun reports what a run would do, publishing nothing and writing no mark.
	DryRun bool
	// Force republishes what a run otherwise leaves: dead letters whose reason lies in the input
	// (deadletter.Reason.InInput; refused with RefusedReasonInInput) and copies dead-lettered again
	// for the reason they were redriven for (skipped with SkippedDeadLetteredAgain). Use it once,
	// after a change of configuration that accepts them; run on a schedule it republishes what
	// cannot pass again and again.
	Force bool

	// Bucket is the key-value bucket of the marks, created when missing with the dead-letter
	// stream's max age as its TTL. Default DefaultBucket.
	Bucket string
	// KeyFromMsgID says the stage takes its key (or scope) from the Nats-Msg-Id header: a copy whose
	// input had no Nats-Msg-Id then gets none, since a minted one would become its key.
	KeyFromMsgID bool
	// PublishTimeout bounds the retries of one copy's publish. Default DefaultPublishTimeout.
	PublishTimeout time.Duration
	// FetchWait is how long the run waits for the next dead letter before it ends. Default DefaultFetchWait.
	FetchWait time.Duration
	// OnResult, if set, is called with each dead letter's result as it is decided.
	OnResult func(Result)
}

// streamName is what a mark's key can hold of a stream name.
var streamName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Validate returns an error naming each field that is wrong, with its value.
func (o Options) Validate() error {
	var errs []error
	if o.Stream == "" || !streamName.MatchString(o.Stream) {
		errs = append(errs, fmt.Errorf("redrive: stream %q, want a name of letters, digits, '_' and '-'", o.Stream))
	}
	if o.Subject == "" {
		errs = append(errs, errors.New("redrive: subject is empty, want the dead letters' subject prefix"))
	}
	if o.ToSeq != 0 && o.FromSeq > o.ToSeq {
		errs = append(errs, fmt.Errorf("redrive: from sequence %d is after to sequence %d", o.FromSeq, o.ToSeq))
	}
	if !o.Since.IsZero() && !o.Until.IsZero() && o.Since.After(o.Until) {
		errs = append(errs, fmt.Errorf("redrive: since %s is after until %s", o.Since.Format(time.RFC3339), o.Until.Format(time.RFC3339)))
	}
	if o.Limit < 0 {
		errs = append(errs, fmt.Errorf("redrive: limit %d, want 0 (none) or more", o.Limit))
	}
	if o.Bucket != "" && !streamName.MatchString(o.Bucket) {
		errs = append(errs, fmt.Errorf("redrive: bucket %q, want a name of letters, digits, '_' and '-'", o.Bucket))
	}
	return errors.Join(errs...)
}

// Outcome is what a run did with one dead letter.
type Outcome string

// Outcomes of a dead letter.
const (
	// Republished: its copy is stored in the input stream, and marked.
	Republished Outcome = "republished"
	// WouldRepublish: a dry run would publish it.
	WouldRepublish Outcome = "would_republish"
	// AlreadyRedriven: an earlier run published its copy (its mark, or the input stream's duplicate window, says so).
	AlreadyRedriven Outcome = "already_redriven"
	// Refused: not published, for Refusal.
	Refused Outcome = "refused"
	// Skipped: not published, for Skip, as a run does by default; Options.Force publishes it.
	Skipped Outcome = "skipped"
)

// Skip says why a dead letter is skipped: a stable snake_case word.
type Skip string

// Skips of a dead letter.
const (
	// SkippedDeadLetteredAgain: the dead letter is of a copy an earlier run published, dead-lettered
	// again for the reason it was redriven for: publishing it again would loop.
	SkippedDeadLetteredAgain Skip = "dead_lettered_again"
)

// Refusal says why a dead letter is not published: a stable snake_case word.
type Refusal string

// Refusals of a dead letter.
const (
	// RefusedPayloadOmitted: the dead letter does not carry the payload (Dedupe-Payload-Omitted).
	RefusedPayloadOmitted Refusal = "payload_omitted"
	// RefusedHeadersTruncated: the dead letter is shrunk and carries the input's headers cut (Dedupe-Headers-Truncated).
	RefusedHeadersTruncated Refusal = "headers_truncated"
	// RefusedNoOrigin: the dead letter does not say the input's subject and stream.
	RefusedNoOrigin Refusal = "no_origin"
	// RefusedInDuplicateWindow: the input stream still holds the input's Nats-Msg-Id in its duplicate window and drops the copy.
	RefusedInDuplicateWindow Refusal = "in_duplicate_window"
	// RefusedRejected: the input stream refused the copy with an error no retry changes.
	RefusedRejected Refusal = "rejected"
	// RefusedReasonInInput: the dead letter's reason lies in the input itself (deadletter.Reason.InInput):
	// a copy would be dead-lettered again, unless the configuration changed (Options.Force).
	RefusedReasonInInput Refusal = "reason_in_input"
)

// Result is what a run did with one dead letter.
type Result struct {
	// Seq is the dead letter's sequence in the dead-letter stream.
	Seq uint64 `json:"seq"`
	// Reason is the dead letter's reason.
	Reason deadletter.Reason `json:"reason"`
	// Subject is the input subject the copy goes to.
	Subject string `json:"subject"`
	// Outcome is what the run did.
	Outcome Outcome `json:"outcome"`
	// Refusal says why, when Outcome is Refused.
	Refusal Refusal `json:"refusal,omitempty"`
	// Skip says why, when Outcome is Skipped.
	Skip Skip `json:"skip,omitempty"`
	// Detail says more, in words.
	Detail string `json:"detail,omitempty"`
	// Stream and StreamSeq are where the copy is stored, when it is.
	Stream    string `json:"stream,omitempty"`
	StreamSeq uint64 `json:"stream_seq,omitempty"`
}

// Summary is what a run did.
type Summary struct {
	// Stream is the dead-letter stream read; FromSeq and ToSeq the sequences the run read between.
	Stream  string `json:"stream"`
	FromSeq uint64 `json:"from_seq"`
	ToSeq   uint64 `json:"to_seq"`
	// DryRun says nothing was published.
	DryRun bool `json:"dry_run"`
	// Selected counts the dead letters the selection matched and the run reached.
	Selected int `json:"selected"`
	// Republished counts the copies stored by this run (a dry run: that it would publish).
	Republished int `json:"republished"`
	// AlreadyRedriven counts the dead letters an earlier run republished: the run resumed past them.
	AlreadyRedriven int `json:"already_redriven"`
	// Refused counts the dead letters not published, by Refusal.
	Refused map[Refusal]int `json:"refused"`
	// Skipped counts the dead letters skipped, by Skip: a run leaves them by default, and its exit
	// is not a failure for them.
	Skipped map[Skip]int `json:"skipped"`
	// LimitReached says the run stopped at Options.Limit; NextSeq is where a next run goes on.
	LimitReached bool   `json:"limit_reached"`
	NextSeq      uint64 `json:"next_seq,omitempty"`
	// Results has one entry per selected dead letter, in order.
	Results []Result `json:"results"`
}

// RefusedCount is the number of dead letters refused.
func (s Summary) RefusedCount() int {
	n := 0
	for _, c := range s.Refused {
		n += c
	}
	return n
}

// SkippedCount is the number of dead letters skipped.
func (s Summary) SkippedCount() int {
	n := 0
	for _, c := range s.Skipped {
		n += c
	}
	return n
}

// mark is the value of a dead letter's mark: where its copy is stored.
type mark struct {
	Stream string    `json:"stream"`
	Seq    uint64    `json:"seq"`
	MsgID  string    `json:"msg_id,omitempty"`
	At     time.Time `json:"at"`
}

// MsgID returns the Nats-Msg-Id of the copy of dead letter seq of stream when its input had none.
func MsgID(stream string, seq uint64) string {
	return "redrive:" + stream + ":" + strconv.FormatUint(seq, 10)
}

// markKey is the key of the mark of dead letter seq of stream.
func markKey(stream string, seq uint64) string { return stream + "." + strconv.FormatUint(seq, 10) }

// Run redrives the dead letters o selects and returns what it did. It
// returns an error when the dead-letter stream or the bucket cannot be
// read, when ctx ends (the summary then says what was done), or wrapping
// ErrStopped; a refused dead letter is a Result, not an error.
func Run(ctx context.Context, js jetstream.JetStream, o Options) (Summary, error) {
	if err := o.Validate(); err != nil {
		return Summary{}, err
	}
	if o.Bucket == "" {
		o.Bucket = DefaultBucket
	}
	if o.PublishTimeout <= 0 {
		o.PublishTimeout = DefaultPublishTimeout
	}
	if o.FetchWait <= 0 {
		o.FetchWait = DefaultFetchWait
	}
	sum := Summary{Stream: o.Stream, DryRun: o.DryRun, Refused: map[Refusal]int{}, Skipped: map[Skip]int{}, Results: []Result{}}
	st, err := js.Stream(ctx, o.Stream)
	if err != nil {
		return sum, fmt.Errorf("dead-letter stream %s: %w", o.Stream, err)
	}
	info := st.CachedInfo()
	sum.FromSeq, sum.ToSeq = max(o.FromSeq, info.State.FirstSeq), info.State.LastSeq
	if o.ToSeq != 0 {
		sum.ToSeq = min(o.ToSeq, sum.ToSeq)
	}
	if info.State.Msgs == 0 || sum.FromSeq > sum.ToSeq {
		return sum, nil
	}
	kv, err := marks(ctx, js, o, info.Config.MaxAge)
	if err != nil {
		return sum, err
	}
	r := &run{js: js, kv: kv, o: o, sum: &sum}
	return sum, r.read(ctx, st)
}

// marks returns the bucket of the marks, created (with ttl) when missing
// unless the run is dry; nil for a dry run without a bucket.
func marks(ctx context.Context, js jetstream.JetStream, o Options, ttl time.Duration) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, o.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		if o.DryRun {
			return nil, nil
		}
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: o.Bucket, TTL: ttl,
			Description: "dedupe-stage redrive: the dead letters already published again"})
	}
	if err != nil {
		return nil, fmt.Errorf("redrive bucket %s: %w", o.Bucket, err)
	}
	return kv, nil
}

// run is one Run's state.
type run struct {
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	o   Options
	sum *Summary
	// streams caches the configuration of each input stream read, nil for one that cannot be read.
	streams map[string]*jetstream.StreamConfig
}

// inputSubject returns the subject to publish an input of stream stored
// on subject to: subject itself, or, when the stream's subject transform
// put a partition token first (scale-out), subject without it, which the
// stream takes and transforms again. found is false when stream does not exist.
func (r *run) inputSubject(ctx context.Context, stream, subject string) (_ string, found bool, _ error) {
	cfg, ok := r.streams[stream]
	if !ok {
		st, err := r.js.Stream(ctx, stream)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
		case err != nil:
			return "", false, fmt.Errorf("input stream %s: %w", stream, err)
		default:
			cfg = &st.CachedInfo().Config
		}
		if r.streams == nil {
			r.streams = map[string]*jetstream.StreamConfig{}
		}
		r.streams[stream] = cfg
	}
	if cfg == nil {
		return subject, false, nil
	}
	t := cfg.SubjectTransform
	if t == nil || !strings.HasPrefix(strings.ToLower(t.Destination), "{{partition(") {
		return subject, true, nil
	}
	src := cmp.Or(t.Source, ">")
	if _, rest, ok := strings.Cut(subject, "."); ok && server.SubjectMatchesFilter(rest, src) {
		return rest, true, nil
	}
	return subject, true, nil
}

// read goes through the selected dead letters in order.
func (r *run) read(ctx context.Context, st jetstream.Stream) error {
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: r.sum.FromSeq}
	if r.o.FromSeq == 0 && !r.o.Since.IsZero() {
		since := r.o.Since
		cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, 0, &since
	}
	for _, reason := range r.o.Reasons {
		cfg.FilterSubjects = append(cfg.FilterSubjects, r.o.Subject+"."+string(reason))
	}
	if len(cfg.FilterSubjects) == 0 {
		cfg.FilterSubjects = []string{r.o.Subject + ".>"}
	}
	c, err := st.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("read dead-letter stream %s: %w", r.o.Stream, err)
	}
	for {
		batch, err := c.Fetch(fetchBatch, jetstream.FetchMaxWait(r.o.FetchWait))
		if err != nil {
			return fmt.Errorf("read dead-letter stream %s: %w", r.o.Stream, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			done, err := r.one(ctx, m)
			if err != nil || done {
				return err
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("read dead-letter stream %s: %w", r.o.Stream, err)
		}
		if n == 0 {
			return ctx.Err() // no dead letter came within FetchWait: none is left
		}
	}
}

// one decides dead letter m and reports whether the run is done.
func (r *run) one(ctx context.Context, m jetstream.Msg) (bool, error) {
	if err := ctx.Err(); err != nil {
		return true, err
	}
	md, err := m.Metadata()
	if err != nil {
		return true, fmt.Errorf("dead letter without metadata: %w", err)
	}
	seq := md.Sequence.Stream
	if seq > r.sum.ToSeq || (!r.o.Until.IsZero() && md.Timestamp.After(r.o.Until)) {
		return true, nil
	}
	if md.Timestamp.Before(r.o.Since) {
		return false, nil
	}
	if r.o.Limit > 0 && r.sum.Republished >= r.o.Limit {
		r.sum.LimitReached, r.sum.NextSeq = true, seq
		return true, nil
	}
	res, err := r.redrive(ctx, seq, m.Headers(), m.Data())
	if err != nil {
		return true, err
	}
	r.sum.Selected++
	switch res.Outcome {
	case Republished, WouldRepublish:
		r.sum.Republished++
	case AlreadyRedriven:
		r.sum.AlreadyRedriven++
	case Refused:
		r.sum.Refused[res.Refusal]++
	case Skipped:
		r.sum.Skipped[res.Skip]++
	}
	r.sum.Results = append(r.sum.Results, res)
	if r.o.OnResult != nil {
		r.o.OnResult(res)
	}
	return seq >= r.sum.ToSeq || md.NumPending == 0, nil
}

// redrive decides and, unless the run is dry, publishes the copy of dead
// letter seq with headers h and payload data.
func (r *run) redrive(ctx context.Context, seq uint64, h nats.Header, data []byte) (Result, error) {
	res := Result{Seq: seq, Reason: deadletter.Reason(h.Get(deadletter.HeaderReason)), Subject: h.Get(deadletter.HeaderOriginalSubject)}
	if r.kv != nil {
		e, err := r.kv.Get(ctx, markKey(r.o.Stream, seq))
		switch {
		case err == nil:
			var mk mark
			_ = json.Unmarshal(e.Value(), &mk)
			res.Outcome, res.Stream, res.StreamSeq = AlreadyRedriven, mk.Stream, mk.Seq
			res.Detail = "republished at " + mk.At.UTC().Format(time.RFC3339)
			return res, nil
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return res, fmt.Errorf("read the mark of dead letter %d: %w", seq, err)
		}
	}
	var err error
	msg, origSeq, refusal, detail := Copy(r.o.Stream, seq, h, data, r.o.KeyFromMsgID)
	if refusal != "" {
		res.Outcome, res.Refusal, res.Detail = Refused, refusal, detail
		return res, nil
	}
	if !r.o.Force {
		if again, detail, err := r.deadLetteredAgain(ctx, h); err != nil {
			return res, err
		} else if again {
			res.Outcome, res.Skip, res.Detail = Skipped, SkippedDeadLetteredAgain, detail
			return res, nil
		}
		if res.Reason.InInput() {
			res.Outcome, res.Refusal = Refused, RefusedReasonInInput
			res.Detail = fmt.Sprintf("%s lies in the input itself: a copy would be dead-lettered again for it; once the configuration accepts such input, redrive it with --force", res.Reason)
			return res, nil
		}
	}
	res.Stream = h.Get(deadletter.HeaderOriginalStream)
	found := false
	if msg.Subject, found, err = r.inputSubject(ctx, res.Stream, msg.Subject); err != nil {
		return res, err
	}
	if !found {
		res.Outcome, res.Refusal, res.Detail = Refused, RefusedRejected, "the input stream "+res.Stream+" does not exist"
		return res, nil
	}
	res.Subject = msg.Subject
	if r.o.DryRun {
		res.Outcome = WouldRepublish
		return res, nil
	}
	ack, err := r.publish(ctx, msg)
	switch {
	case retry.IsPermanent(err):
		res.Outcome, res.Refusal, res.Detail = Refused, RefusedRejected, deadletter.Describe(err)
		return res, nil
	case err != nil && ctx.Err() != nil:
		return res, ctx.Err()
	case err != nil:
		return res, fmt.Errorf("%w at dead letter %d (publish to %s): %w", ErrStopped, seq, msg.Subject, err)
	}
	res.StreamSeq = ack.Sequence
	id := msg.Header.Get(jetstream.MsgIDHeader)
	if ack.Duplicate && ack.Sequence == origSeq {
		res.Outcome, res.Refusal = Refused, RefusedInDuplicateWindow
		res.Detail = fmt.Sprintf("the input stream %s still holds Nats-Msg-Id %q of the input in its duplicate window; run again once the window has passed", ack.Stream, id)
		return res, nil
	}
	res.Outcome = Republished
	if ack.Duplicate {
		res.Outcome, res.Detail = AlreadyRedriven, "stored by an earlier run, dropped now by the input stream's duplicate window"
	}
	// The mark is written even when ctx has just ended: the copy is stored.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	v, _ := json.Marshal(mark{Stream: ack.Stream, Seq: ack.Sequence, MsgID: id, At: time.Now()})
	if _, err := r.kv.Put(mctx, markKey(r.o.Stream, seq), v); err != nil {
		return res, fmt.Errorf("mark dead letter %d republished (as %s %d): %w", seq, ack.Stream, ack.Sequence, err)
	}
	return res, nil
}

// deadLetteredAgain reports whether the dead letter with headers h is of a
// copy an earlier run published (HeaderRedrivenFrom), dead-lettered again
// for the reason that copy was redriven for: HeaderRedrivenReason, or for
// a copy without it (published by an older version) the reason of the
// dead letter it names, read from its stream. detail says so. A dead
// letter it names that its stream no longer holds cannot tell: false.
func (r *run) deadLetteredAgain(ctx context.Context, h nats.Header) (bool, string, error) {
	from, reason := h.Get(HeaderRedrivenFrom), h.Get(deadletter.HeaderReason)
	if from == "" {
		return false, "", nil
	}
	was := h.Get(HeaderRedrivenReason)
	if was == "" {
		var err error
		if was, err = r.reasonOf(ctx, from); err != nil {
			return false, "", err
		}
	}
	if was != reason {
		return false, "", nil
	}
	return true, fmt.Sprintf("a copy of dead letter %s, redriven for %s and dead-lettered again for it: republishing it would loop; "+
		"fix the cause, then redrive with --force", from, reason), nil
}

// reasonOf returns the reason of dead letter from ("STREAM:SEQ"), "" when
// its stream no longer holds it or from names none.
func (r *run) reasonOf(ctx context.Context, from string) (string, error) {
	name, seqText, ok := strings.Cut(from, ":")
	seq, err := strconv.ParseUint(seqText, 10, 64)
	if !ok || err != nil || !streamName.MatchString(name) {
		return "", nil
	}
	st, err := r.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read dead letter %s: %w", from, err)
	}
	m, err := st.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read dead letter %s: %w", from, err)
	}
	return m.Header.Get(deadletter.HeaderReason), nil
}

// publish publishes msg and waits for the stream to store it, retrying
// transient failures for up to PublishTimeout.
func (r *run) publish(ctx context.Context, msg *nats.Msg) (*jetstream.PubAck, error) {
	ctx, cancel := context.WithTimeout(ctx, r.o.PublishTimeout)
	defer cancel()
	var ack *jetstream.PubAck
	err := retry.Do(ctx, "redrive", func() error {
		// An attempt under way is not cut by ctx: the stream may store the
		// copy, and its mark must then be written.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), attemptTimeout)
		defer cancel()
		var err error
		ack, err = r.js.PublishMsg(actx, msg)
		return err
	}, retry.Options{})
	return ack, err
}

// Copy returns the copy of dead letter seq of stream, with headers h and
// payload data, for its input subject: the input's headers and payload,
// Nats-Msg-Id the input's own (else MsgID, unless keyFromMsgID), expecting
// the input's stream, HeaderRedrivenFrom and HeaderRedrivenReason. origSeq is the input's
// sequence. A dead letter that does not carry its input whole gives no
// copy but a refusal and a detail.
func Copy(stream string, seq uint64, h nats.Header, data []byte, keyFromMsgID bool) (m *nats.Msg, origSeq uint64, refusal Refusal, detail string) {
	if v := h.Get(deadletter.HeaderHeadersTruncated); v != "" {
		return nil, 0, RefusedHeadersTruncated, "the dead letter has the input's headers cut (" + v + ")"
	}
	if v := h.Get(deadletter.HeaderPayloadOmitted); v != "" {
		return nil, 0, RefusedPayloadOmitted, "the dead letter has no payload (" + v + ")"
	}
	subject, origStream := h.Get(deadletter.HeaderOriginalSubject), h.Get(deadletter.HeaderOriginalStream)
	origSeq, err := strconv.ParseUint(h.Get(deadletter.HeaderOriginalSequence), 10, 64)
	if subject == "" || origStream == "" || err != nil {
		return nil, 0, RefusedNoOrigin, fmt.Sprintf("the dead letter does not say where its input was (%s %q, %s %q, %s %q)",
			deadletter.HeaderOriginalSubject, subject, deadletter.HeaderOriginalStream, origStream,
			deadletter.HeaderOriginalSequence, h.Get(deadletter.HeaderOriginalSequence))
	}
	out := make(nats.Header, len(h)+2)
	for k, v := range h {
		if !strings.HasPrefix(k, "Nats-") && !deadLetterHeader(k) {
			out[k] = v
		}
	}
	switch id := h.Get(deadletter.HeaderOriginalMsgID); {
	case id != "":
		out.Set(jetstream.MsgIDHeader, id)
	case !keyFromMsgID:
		out.Set(jetstream.MsgIDHeader, MsgID(stream, seq))
	}
	out.Set(jetstream.ExpectedStreamHeader, origStream)
	out.Set(HeaderRedrivenFrom, stream+":"+strconv.FormatUint(seq, 10))
	if reason := h.Get(deadletter.HeaderReason); reason != "" {
		out.Set(HeaderRedrivenReason, reason)
	}
	return &nats.Msg{Subject: subject, Header: out, Data: data}, origSeq, "", ""
}

// deadLetterHeader reports whether k is a header the dead letter added, or an earlier redrive's.
func deadLetterHeader(k string) bool {
	switch k {
	case deadletter.HeaderReason, deadletter.HeaderDetail, deadletter.HeaderOriginalSubject,
		deadletter.HeaderOriginalStream, deadletter.HeaderOriginalSequence, deadletter.HeaderOriginalMsgID,
		deadletter.HeaderPayloadOmitted, deadletter.HeaderHeadersTruncated, HeaderRedrivenFrom, HeaderRedrivenReason:
		return true
	}
	return false
}
