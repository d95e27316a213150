// Package ensure opens a JetStream stream, consumer, key-value bucket or
// object store the stage needs at start, creating it when it is missing, from any
// number of instances at once, without waiting on a request the cluster
// leaves unanswered.
//
// The model: on a JetStream cluster, nats-server leaves a stream's info
// request unanswered while the stream is assigned but has no leader yet,
// which is the state another instance's create leaves it in for a moment
// (nats-server issue 6421). A lookup that waited for the client's request
// timeout held up the start of a group's instances started together by
// that timeout. Open therefore gives a lookup LookupTimeout only, and asks
// for the create as soon as a lookup says the stream is missing or does
// not answer: a create equal to an existing stream, or to one being
// created, is answered with that stream. While the create is in flight,
// lookups go on every pollInterval, and whichever answers first wins. A
// create refused because the name is taken with another configuration
// (another version's instance, an operator) binds to what is there.
//
// Use:
//
//	kv, _, err := ensure.Open(ctx, "hand-over bucket "+b, func(ctx context.Context) (jetstream.KeyValue, error) {
//		return js.KeyValue(ctx, b)
//	}, func(ctx context.Context) (jetstream.KeyValue, error) {
//		return js.CreateKeyValue(ctx, cfg)
//	}, ensure.Options{Logger: log})
package ensure

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/retry"
)

// Timeouts of one request of Open.
const (
	// LookupTimeout bounds one lookup: a lookup of a stream that exists
	// and leads is answered in milliseconds, and one that is not answered
	// in this time is the case the package is for.
	LookupTimeout = time.Second
	// CreateTimeout bounds one create: the first create of a replicated
	// stream is answered once its leader is elected.
	CreateTimeout = 10 * time.Second
	// MissingGrace is how long Open without a create asks again a lookup
	// that says the stream is missing: a stream one instance has just
	// created was reported missing to another right after its create was
	// answered, and that instance exited.
	MissingGrace = 3 * time.Second
	// pollInterval is how often a lookup is asked while a create is in
	// flight.
	pollInterval = 200 * time.Millisecond
	// logEvery is how often Open logs that it still waits.
	logEvery = 2 * time.Second
)

// Options configure Open. The zero value logs nothing.
type Options struct {
	// Logger is told, at most every two seconds, which step waits and
	// why. Default: nobody.
	Logger *slog.Logger
}

// Open returns what lookup finds, creating it with create while lookup says
// it is missing or does not answer (with create nil, missing for
// MissingGrace is an error). created is true when this call's create made
// it. A permanent failure returns at once; when ctx ends first, the error
// wraps context.Cause(ctx) and names what, the time waited and the last reason.
func Open[T any](ctx context.Context, what string, lookup, create func(context.Context) (T, error), o Options) (v T, created bool, err error) {
	pr := &progress{ctx: ctx, what: what, start: time.Now(), log: o.Logger}
	cctx, cancelCreate := context.WithCancel(ctx)
	defer cancelCreate()
	c := &creator[T]{progress: pr, cctx: cctx, create: create}
	var b *retry.Backoff
	for {
		if ctx.Err() != nil {
			return v, false, pr.stopped()
		}
		found, lerr := timed(ctx, LookupTimeout, lookup)
		if lerr == nil {
			return found, false, nil
		}
		if permanent(lerr) || (create == nil && missing(lerr) && time.Since(pr.start) >= MissingGrace) {
			return v, false, fmt.Errorf("%s: %w", what, lerr)
		}
		if !missing(lerr) && !unanswered(lerr) {
			pr.wait(fmt.Errorf("lookup: %w", lerr)) // a transient refusal: asked again after a backoff
			if b == nil {
				b = retry.NewBackoff()
			}
			if b.Wait(ctx) != nil {
				return v, false, pr.stopped()
			}
			continue
		}
		if why := lookupWait(lerr, create != nil); why != nil {
			pr.wait(why)
		}
		if create == nil {
			if !sleep(ctx, pollInterval) {
				return v, false, pr.stopped()
			}
			continue
		}
		if v, done, err := c.await(); done {
			return v, err == nil, err
		}
	}
}

// creator runs Open's create beside its lookups, one at a time.
type creator[T any] struct {
	*progress
	cctx     context.Context // the creates', cancelled when Open returns
	create   func(context.Context) (T, error)
	creating chan result[T] // non-nil while a create is in flight
}

// await starts a create unless one is in flight and waits for it at most
// pollInterval. done is true when Open returns v and err: made (err nil),
// stopped or refused for good.
func (c *creator[T]) await() (v T, done bool, err error) {
	if c.creating == nil {
		c.creating = make(chan result[T], 1)
		go func(ch chan<- result[T]) {
			r, err := timed(c.cctx, CreateTimeout, c.create)
			ch <- result[T]{r, err}
		}(c.creating)
	}
	select {
	case <-c.ctx.Done():
		return v, true, c.stopped()
	case r := <-c.creating:
		c.creating = nil
		if c.ctx.Err() != nil {
			// The create ended with Open's own stop: not a reason of the server's.
			return v, true, c.stopped()
		}
		if r.err == nil {
			return r.v, true, nil
		}
		bind, err := c.createFailed(r.err)
		if err != nil {
			return v, true, err
		}
		if bind {
			// The lookups bind to what is there; no create is asked again.
			c.creating = make(chan result[T]) // never ready
		}
	case <-time.After(pollInterval):
	}
	return v, false, nil
}

// lookupWait is why Open waits after a lookup that found nothing or got no
// answer, or nil when a create is about to be asked and there is no other reason.
func lookupWait(lerr error, canCreate bool) error {
	switch {
	case errors.Is(lerr, nats.ErrNoResponders):
		return fmt.Errorf("lookup: no JetStream answered (a server still starting, or another JetStream domain): %w", lerr)
	case unanswered(lerr):
		return fmt.Errorf("lookup not answered in %v (a stream or consumer being created or catching up has no leader yet): %w", LookupTimeout, lerr)
	case !canCreate:
		return fmt.Errorf("lookup: %w (a stream just created can be reported missing for a moment)", lerr)
	}
	return nil
}

// createFailed judges a create that failed: a permanent failure ends Open
// (end), a name in use with another configuration is bound to (bind), and
// anything else is asked again.
func (p *progress) createFailed(err error) (bind bool, end error) {
	switch {
	case inUse(err):
		p.wait(fmt.Errorf("create: in use with another configuration; binding to it: %w", err))
		return true, nil
	case permanent(err):
		return false, fmt.Errorf("%s: create: %w", p.what, err)
	default:
		p.wait(fmt.Errorf("create: %w", err))
		return false, nil
	}
}

// progress is what Open tells while it waits: each reason it waits for is
// logged at most every logEvery, and a stop names the step, the time waited
// and the last reason.
type progress struct {
	ctx    context.Context
	what   string
	start  time.Time
	log    *slog.Logger
	last   error
	logged time.Time
}

// wait records why Open waits, and logs it unless it logged lately.
func (p *progress) wait(why error) {
	p.last = why
	if p.log != nil && time.Since(p.logged) >= logEvery {
		p.logged = time.Now()
		p.log.Warn("start-up: waiting for the server", "step", p.what, "waited", time.Since(p.start).Round(time.Millisecond), "why", why)
	}
}

// stopped is Open's error when its context ends: the step, the cause, how
// long it waited and the last reason.
func (p *progress) stopped() error {
	cause := context.Cause(p.ctx)
	if p.last == nil {
		return fmt.Errorf("%s: %w after %v", p.what, cause, time.Since(p.start).Round(time.Millisecond))
	}
	return fmt.Errorf("%s: %w after %v waiting for the server (last: %v)", p.what, cause, time.Since(p.start).Round(time.Millisecond), p.last)
}

// sleep waits d or until ctx is done, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// result is what a create returned.
type result[T any] struct {
	v   T
	err error
}

// timed calls f with at most d of ctx.
func timed[T any](ctx context.Context, d time.Duration, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return f(ctx)
}

// missing reports whether err says the stream, consumer or bucket does
// not exist.
func missing(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) ||
		errors.Is(err, jetstream.ErrConsumerNotFound)
}

// inUse reports whether err says a create's name is taken with another
// configuration.
func inUse(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) || errors.Is(err, jetstream.ErrBucketExists) ||
		errors.Is(err, jetstream.ErrConsumerExists)
}

// unanswered reports whether err says the request got no answer.
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse)
}

// permanent reports whether no retry changes err's answer.
func permanent(err error) bool {
	return errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		(!missing(err) && !inUse(err) && retry.Classify(err) == retry.Permanent)
}
