// Package retry decides whether a failed operation is worth trying again
// and, when it is, tries again with backoff. It is the one place where the
// stage classifies its failures and the one retry loop its paths share.
//
// A failure is transient when the same operation can succeed later without
// anything about the message changing: a timeout, no responders while a
// stream's leader moves, a server restarting, a stream at its limits, a
// disk that fills and empties. It is permanent when no retry changes the
// answer: a message or its headers larger than the server or the stream
// accept, an invalid subject, a sealed stream, a JetStream API error the
// server answers with "bad request". Unknown errors are transient: retrying
// one that turns out permanent costs health and time, while treating a
// transient one as permanent would turn away a good message. An error of
// this module's packages says itself that it is permanent, with a
// Permanent method (PermanentError): Classify knows the NATS client's and
// server's errors, and nothing of the packages that use it.
//
// A third class, Fenced, is neither: a publish that expected the last
// sequence of a partition's fence subject was refused because another
// owner moved the fence (JetStream error 10071). Retrying it cannot
// succeed, and its messages are not at fault either: they belong to the
// new owner, so they are neither retried in place nor dead-lettered, only
// left unacknowledged (ErrFenced, IsFenced).
//
// Use:
//
//	err := retry.Do(ctx, "commit", func() error { return store.Commit(batch) }, retry.Options{Reporter: status})
//	if retry.IsPermanent(err) { /* dead-letter, do not retry */ }
package retry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Class says whether trying a failed operation again can succeed.
type Class int

// Classes of failures.
const (
	// None is the class of a nil error.
	None Class = iota
	// Transient failures may succeed when tried again unchanged.
	Transient
	// Permanent failures give the same answer however often they are
	// tried: the operation must be given up and its input handled another
	// way (dead-lettered, recorded).
	Permanent
	// Fenced failures end the caller's ownership of a partition: another
	// owner moved the partition's fence. The operation is given up and its
	// input is left as it is (not acknowledged, not dead-lettered) for the
	// new owner. Do never retries it.
	Fenced
)

// String returns "none", "transient", "permanent" or "fenced".
func (c Class) String() string {
	switch c {
	case Transient:
		return "transient"
	case Permanent:
		return "permanent"
	case Fenced:
		return "fenced"
	}
	return "none"
}

// JetStream API error codes the publish path can meet, from nats-server's
// server/jetstream_errors_generated.go.
const (
	// CodeMessageTooLarge: the message exceeds the stream's max_msg_size
	// or the server's max_payload (JSStreamMessageExceedsMaximumErr).
	CodeMessageTooLarge jetstream.ErrorCode = 10054
	// CodeHeaderTooLarge: the headers exceed 64 KiB - 1, the most
	// JetStream stores (JSStreamHeaderExceedsMaximumErr).
	CodeHeaderTooLarge jetstream.ErrorCode = 10097
	// CodeStreamSealed: the stream is sealed (JSStreamSealedErr).
	CodeStreamSealed jetstream.ErrorCode = 10109
	// CodeStreamNotMatch: the subject is stored by a stream other than the
	// one the publish expects (Nats-Expected-Stream; JSStreamNotMatchErr).
	CodeStreamNotMatch jetstream.ErrorCode = 10060
	// CodeStoreFailed: the store refused the message, for example a
	// stream at max_msgs or max_bytes with discard new
	// (JSStreamStoreFailedF); it clears when the stream has room again.
	CodeStoreFailed jetstream.ErrorCode = 10077
	// CodeWrongLastSequence: a Nats-Expected-Last-Subject-Sequence (or
	// Nats-Expected-Last-Sequence) check failed, "wrong last sequence: N"
	// with the real last sequence (JSStreamWrongLastSequenceErrF). On a
	// publish checked against a fence subject it means the fence moved:
	// Fenced. HTTP status 400.
	CodeWrongLastSequence jetstream.ErrorCode = 10071
	// CodeWrongLastSequenceConstant: "wrong last sequence" with no number
	// (JSStreamWrongLastSequenceConstantErr). A clustered stream refuses a
	// proposal that expects a subject's last sequence while another
	// proposal on that subject is in flight; it clears once that one is
	// applied: Transient. A batch that writes a subject and then checks it
	// gets it too. HTTP status 400.
	CodeWrongLastSequenceConstant jetstream.ErrorCode = 10164
	// CodeNoSuitablePeers: "no suitable peers for placement" (with "peer
	// offline", JSClusterNoPeersErrF): a replicated stream, key-value or
	// object store bucket cannot be placed now, as when servers of a
	// cluster that is starting or restarting are not up yet. It clears
	// when they are: Transient, although its HTTP status is 400. A
	// placement no server can ever meet (tags nobody has) gives the same
	// code: the stage's set-up retries it for streams.SetUpTimeout and
	// then fails with it, and the presence bucket behind balance is asked
	// again with a warning every 20 attempts.
	CodeNoSuitablePeers jetstream.ErrorCode = 10005
)

// ErrFenced means a publish was refused because the partition's fence
// moved: another owner took the partition (CodeWrongLastSequence on a
// fenced publish). Classify reports it, and any error wrapping it, as
// Fenced.
var ErrFenced = errors.New("fenced: the partition's fence moved, another owner holds it")

// Error codes with which nats-server (2.12 and later) refuses an atomic
// batch as a whole (server/jetstream_errors_generated.go). None of them
// says anything about one message of the batch: ClassifyBatch tells what
// to do with the batch.
const (
	// CodeBatchDisabled: the stream does not allow atomic publish
	// (AllowAtomicPublish off).
	CodeBatchDisabled jetstream.ErrorCode = 10174
	// CodeBatchMissingSeq: a message of the batch carried no sequence.
	CodeBatchMissingSeq jetstream.ErrorCode = 10175
	// CodeBatchIncomplete: the batch was abandoned before its commit (a
	// message lost on the way, the batch timed out, or it spans streams).
	CodeBatchIncomplete jetstream.ErrorCode = 10176
	// CodeBatchUnsupportedHeader: a header the server does not accept in
	// a batch.
	CodeBatchUnsupportedHeader jetstream.ErrorCode = 10177
	// CodeBatchTooLarge: more messages than the server's max_batch_size
	// (1000 by default).
	CodeBatchTooLarge jetstream.ErrorCode = 10199
	// CodeBatchDuplicateMsgID: a Nats-Msg-Id of the batch is already in
	// the stream's duplicate window, or twice in the batch; nothing of the
	// batch was stored.
	CodeBatchDuplicateMsgID jetstream.ErrorCode = 10201
	// CodeBatchTooManyInflight: the stream (or the server) has as many
	// open atomic batches as it allows (max_batch_inflight_per_stream, 50
	// by default); HTTP status 429.
	CodeBatchTooManyInflight jetstream.ErrorCode = 10210
)

// MaxHeaderBytes is the largest header block JetStream stores (nats-server
// refuses more than math.MaxUint16 bytes with CodeHeaderTooLarge).
const MaxHeaderBytes = 65535

// PermanentError is what an error implements to say whether it is
// permanent: Classify reports an error Permanent when the first error in
// its chain that implements it (errors.As) answers true. A
// package whose sentinel errors no retry can fix (state's ErrBadKey, for
// one) defines them with such a method, so that the classifier needs to
// know nothing of the package; MarkPermanent marks any other error.
type PermanentError interface {
	error
	// Permanent reports whether trying the failed operation again, with
	// the same input, gives the same answer. false leaves the error to
	// the rest of Classify's rules.
	Permanent() bool
}

// permanentError marks an error as permanent (MarkPermanent).
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent returns true: the error was marked permanent.
func (e *permanentError) Permanent() bool { return true }

// MarkPermanent returns err marked so that Classify reports it Permanent
// (it answers Permanent true, see PermanentError). It returns nil for
// nil.
func MarkPermanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// Classify tells whether err is worth retrying. The table, with where each
// error occurs and what the stage does, is docs/failures.md.
func Classify(err error) Class {
	if err == nil {
		return None
	}
	var pe PermanentError
	if errors.As(err, &pe) && pe.Permanent() {
		return Permanent
	}
	if errors.Is(err, ErrFenced) {
		return Fenced
	}
	switch {
	case errors.Is(err, nats.ErrMaxPayload), // client side: larger than the server's max_payload
		errors.Is(err, nats.ErrBadSubject),
		errors.Is(err, jetstream.ErrInvalidSubject),
		errors.Is(err, nats.ErrHeadersNotSupported),
		errors.Is(err, nats.ErrBadHeaderMsg):
		return Permanent
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		// Matched by code before the 400 rule below: both are 400s.
		switch api.ErrorCode {
		case CodeWrongLastSequence:
			return Fenced
		case CodeWrongLastSequenceConstant, CodeNoSuitablePeers:
			return Transient
		case CodeMessageTooLarge, CodeHeaderTooLarge, CodeStreamSealed, CodeStreamNotMatch:
			return Permanent
		}
		// 400 is the server's "bad request": the request itself is at
		// fault (an input header the output stream refuses, such as a
		// Nats-TTL it does not allow). 5xx, 404 (a stream being
		// recreated), 408 and 429 can clear.
		if api.Code == 400 || api.Code == 413 {
			return Permanent
		}
	}
	return Transient
}

// ClassifyBatch tells whether publishing an atomic batch again, unchanged,
// can succeed after it failed with err: Fenced when the fence moved (nothing
// was stored), Transient when the stream was busy or the call timed out,
// Permanent otherwise. A permanent failure of a batch is not one of its
// messages: the caller publishes them one by one, each judged by Classify.
// docs/failures.md has the table of codes.
func ClassifyBatch(err error) Class {
	if err == nil {
		return None
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case CodeWrongLastSequence:
			return Fenced
		case CodeBatchTooManyInflight, CodeWrongLastSequenceConstant:
			return Transient
		case CodeBatchDisabled, CodeBatchMissingSeq, CodeBatchIncomplete, CodeBatchUnsupportedHeader,
			CodeBatchTooLarge, CodeBatchDuplicateMsgID:
			return Permanent
		}
	}
	return Classify(err)
}

// IsPermanent reports whether Classify(err) is Permanent.
func IsPermanent(err error) bool { return Classify(err) == Permanent }

// IsFenced reports whether Classify(err) is Fenced: err wraps ErrFenced,
// or is the server's CodeWrongLastSequence refusal.
func IsFenced(err error) bool { return Classify(err) == Fenced }

// Reporter receives the outcome of every attempt of a component's
// operation. A Status implements it; the stage derives its health from it.
type Reporter interface {
	// Failed records a failed attempt (transient: it is retried).
	Failed(component string, err error)
	// Succeeded records a successful attempt; retried says whether
	// attempts failed before it.
	Succeeded(component string, retried bool)
}

// Options configure Do. The zero value retries silently.
type Options struct {
	// Reporter is told about every attempt. Default: nobody.
	Reporter Reporter
	// Pause, if set, runs before and after each backoff wait: the stage
	// tells the server the messages are still being worked on.
	Pause func()
	// OnRetry, if set, runs after each transient failure with the attempt
	// number (from 1), before the wait: for logs and metrics.
	OnRetry func(attempt int, err error)
}

// Do runs op until it succeeds, fails permanently or fenced, or ctx is
// done. Between transient failures it backs off (NewBackoff). It returns
// nil; op's permanent or fenced error as is (IsPermanent or IsFenced is
// true); or, when ctx ends first, an error wrapping ctx.Err() that names
// the component, the failed attempts, how long they took and the last
// failure. A permanent or fenced failure is not reported as a
// failure of the component: the component works, the input is at fault or
// belongs to another owner.
func Do(ctx context.Context, component string, op func() error, o Options) error {
	// The backoff starts at the first failure: most calls succeed at once,
	// and then never read the clock.
	var b Backoff
	for attempt := 1; ; attempt++ {
		err := op()
		if c := Classify(err); c == None || c == Permanent || c == Fenced {
			if o.Reporter != nil {
				o.Reporter.Succeeded(component, attempt > 1)
			}
			return err
		}
		if o.Reporter != nil {
			o.Reporter.Failed(component, err)
		}
		if o.OnRetry != nil {
			o.OnRetry(attempt, err)
		}
		if o.Pause != nil {
			o.Pause()
		}
		if attempt == 1 {
			b = *NewBackoff()
		}
		if werr := b.Wait(ctx); werr != nil {
			return fmt.Errorf("%s: %w after %d failed attempts in %v; the last: %v", component, werr, attempt, b.Since().Round(time.Millisecond), err)
		}
		if o.Pause != nil {
			o.Pause()
		}
	}
}

// Backoff is exponential backoff with jitter, from 50ms up to 5s. It is
// not safe for concurrent use.
type Backoff struct {
	start time.Time
	next  time.Duration
}

// Backoff bounds.
const (
	minWait = 50 * time.Millisecond
	maxWait = 5 * time.Second
)

// NewBackoff returns a backoff at its first step.
func NewBackoff() *Backoff { return &Backoff{start: time.Now(), next: minWait} }

// Reset returns to the first step.
func (b *Backoff) Reset() { b.next = minWait }

// Since returns the time since NewBackoff.
func (b *Backoff) Since() time.Duration { return time.Since(b.start) }

// Wait sleeps for the next step (a random time between half of it and all
// of it) or until ctx is done, and returns ctx.Err().
func (b *Backoff) Wait(ctx context.Context) error {
	d := b.next/2 + rand.N(b.next/2+1)
	b.next = min(2*b.next, maxWait)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
