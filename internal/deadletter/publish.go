package deadletter

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/batcher"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/lograte"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
)

// Letter is an input on its way to the dead-letter stream, with why: what
// the stage and the route step hand a Publisher.
type Letter struct {
	// Msg is the message dead-lettered: the input, or a copy of it that
	// Publisher.Input traces back to the input.
	Msg jetstream.Msg
	// Reason is why it is dead-lettered; Detail says what was wrong, in
	// words.
	Reason Reason
	Detail string
	// Partition is the label of the partition that decided it, or "" for
	// an input dead-lettered before it reached one. The Publisher only
	// passes it on to Done.
	Partition string
	// Fence is the dead-letter fence the publish expects (a scale-out
	// partition owner's; nil: not fenced); P and Pin are the partition and
	// the pin of the tenure that decided it, passed on to Fenced.
	Fence *forward.Fence
	P     int
	Pin   string
}

// Publisher publishes dead letters and settles their inputs, the same way
// for the stage and the route step (docs/failures.md, "Dead letter"): the
// letters of one Publish go together (forward.Batch), each built with its
// input's payload when it fits; one refused for good, or too large to
// publish, is stored again alone in its Shrink form; one refused even so
// is unstorable. Each settled letter goes to Done, which counts it and
// acks its input; one still failing when ctx ends stays unsettled (its
// input unacked, it comes back after ack_wait). The inputs are kept in
// progress meanwhile. Letters with a Fence are published in groups of one
// fence each, every publish of a group expecting it; a group the server
// refuses because the fence moved is left unsettled and goes to Fenced.
//
// A Publisher holds no state of its own once built: Publish may be
// called from several goroutines at once.
type Publisher struct {
	// JS publishes; Conn tells the server's max payload. Required.
	JS   jetstream.JetStream
	Conn *nats.Conn
	// Component names the publishes to Reporter (retry.Do) and begins the
	// reason of every log line ("<Component>_refused", ...).
	Component string
	// Reporter is told about every attempt. Default: nobody.
	Reporter retry.Reporter
	// Logs writes the rate-limited log lines. Default: nil, which writes
	// to slog.Default() without a limit.
	Logs *lograte.Limiter
	// AckWait is the inputs' ack wait: they are kept in progress once a
	// third of it has passed (batcher.Progress).
	AckWait time.Duration
	// Atomic publishes the letters of one Publish as atomic batches
	// (forward.Options.Atomic).
	Atomic bool
	// Subject returns the dead-letter subject of reason. Required.
	Subject func(reason string) string
	// Note is what HeaderPayloadOmitted says after the size of a payload
	// the dead letter does not carry (OmittedTooLarge, OmittedRoute).
	Note string
	// Input returns where l's input is, for a letter whose message is a
	// copy (ok false: the message's own subject, stream and sequence).
	// Default: nil, every message is its own input.
	Input func(l Letter) (subject, stream string, seq uint64, ok bool)
	// Done settles l, stored (unstorable false) or refused even in its
	// Shrink form (unstorable true, already logged with where the input
	// is): it counts l and acks its input. Required.
	Done func(l Letter, unstorable bool)
	// Fenced, if set, hears a group of n letters expecting l.Fence that
	// the server refused because the fence moved, with the error; the
	// letters stay unsettled.
	Fenced func(l Letter, n int, err error)
}

// Publish publishes the dead letters of letters and settles each (Done),
// or leaves it unsettled: refused for a fence, or still failing when ctx
// ends.
func (p *Publisher) Publish(ctx context.Context, letters []Letter) {
	if len(letters) == 0 {
		return
	}
	var progress batcher.Progress
	progress.Start(time.Now())
	maxPayload := p.Conn.MaxPayload()
	msgs := make([]*nats.Msg, len(letters))
	res := make([]forward.Result, len(letters))
	type group struct {
		fence *forward.Fence
		idx   []int // into letters
	}
	var groups []group
	for i, l := range letters {
		msgs[i] = Build(p.input(l), p.Subject(string(l.Reason)), maxPayload, p.Note)
		if err := forward.CheckSize(msgs[i], maxPayload); err != nil {
			res[i] = forward.Result{Done: true, Err: err}
			continue
		}
		k := -1
		for j, g := range groups {
			if (g.fence == nil && l.Fence == nil) || (g.fence != nil && l.Fence != nil && *g.fence == *l.Fence) {
				k = j
				break
			}
		}
		if k < 0 {
			groups = append(groups, group{fence: l.Fence})
			k = len(groups) - 1
		}
		groups[k].idx = append(groups[k].idx, i)
	}
	for _, g := range groups {
		send := make([]*nats.Msg, len(g.idx))
		sent := make([]forward.Result, len(g.idx))
		for k, i := range g.idx {
			send[k] = msgs[i]
		}
		err := forward.Batch(ctx, p.JS, send, sent, p.batchOptions(letters, &progress, g.fence))
		for k, i := range g.idx {
			res[i] = sent[k]
		}
		switch {
		case g.fence != nil && retry.IsFenced(err):
			if p.Fenced != nil {
				p.Fenced(letters[g.idx[0]], len(g.idx), err)
			}
		case err != nil:
			p.Logs.Warn(p.Component+"_unfinished", "stopping with dead letters unsettled; their inputs stay unacked and come back", "err", err)
		}
	}
	for i, l := range letters {
		p.settle(ctx, l, msgs[i], res[i])
	}
}

// batchOptions are the publish options of a group of dead letters
// expecting fence: transient failures retried (and logged) while ctx
// lasts, every input of letters kept in progress meanwhile.
func (p *Publisher) batchOptions(letters []Letter, progress *batcher.Progress, fence *forward.Fence) forward.Options {
	return forward.Options{
		Component: p.Component,
		Atomic:    p.Atomic,
		Fence:     fence,
		Retry: retry.Options{
			Reporter: p.Reporter,
			Pause: func() {
				if progress.Due(p.AckWait) {
					for _, l := range letters {
						_ = l.Msg.InProgress()
					}
				}
			},
		},
		OnRetry: func(attempt, failed int, err error) {
			p.Logs.Warn(p.Component+"_publish_retry", "dead-letter publish failed, retrying; the inputs stay unacked meanwhile", "dead_letters", failed, "attempt", attempt, "err", err)
		},
	}
}

// settle finishes l, published as m with result r: one refused for good
// is stored alone in its Shrink form, one refused even so is logged as
// unstorable; either way it goes to Done. One still unsettled (ctx ended,
// or refused for a fence) is left: its input comes back after ack_wait.
func (p *Publisher) settle(ctx context.Context, l Letter, m *nats.Msg, r forward.Result) {
	if !r.Done {
		return
	}
	if r.Err == nil {
		p.Done(l, false)
		return
	}
	if retry.IsFenced(r.Err) {
		return
	}
	p.Logs.Warn(p.Component+"_refused", "dead letter refused; storing it without payload and with its headers cut",
		"reason", l.Reason, "subject", m.Subject, "err", r.Err)
	in := p.input(l)
	err := Store(ctx, p.JS, Shrink(in, m.Subject), l.Msg, StoreOptions{
		Component:  p.Component,
		Reporter:   p.Reporter,
		MaxPayload: p.Conn.MaxPayload(),
		AckWait:    p.AckWait,
		OnRetry: func(attempt int, err error) {
			p.Logs.Warn(p.Component+"_publish_retry", "dead-letter publish failed, retrying; the input stays unacked meanwhile", "subject", m.Subject, "attempt", attempt, "err", err)
		},
	})
	if err != nil && !retry.IsPermanent(err) {
		return // ctx ended: left unacked, it comes back after ack_wait
	}
	if err != nil {
		p.Logs.Error(p.Component+"_unstorable", "dead letter cannot be stored even shrunk; the input is acked and stays in its stream",
			"reason", l.Reason, "stream", in.Stream, "sequence", in.Sequence, "subject", in.Subject, "err", err)
	}
	p.Done(l, err != nil)
}

// input is what l's dead letter is built from: where its input is
// (Publisher.Input, else the message's own subject, stream and sequence;
// Stream "" when the metadata cannot be read), why, and its headers and
// payload.
func (p *Publisher) input(l Letter) Input {
	in := Input{Reason: l.Reason, Detail: l.Detail, Header: l.Msg.Headers(), Data: l.Msg.Data(), Subject: l.Msg.Subject()}
	if p.Input != nil {
		if subject, stream, seq, ok := p.Input(l); ok {
			in.Subject, in.Stream, in.Sequence = subject, stream, seq
			return in
		}
	}
	if md, err := l.Msg.Metadata(); err == nil {
		in.Stream, in.Sequence = md.Stream, md.Sequence.Stream
	}
	return in
}
