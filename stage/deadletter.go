package stage

import (
	"context"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/batcher"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
)

// deadLetterBatch is the most dead letters the worker publishes together.
const deadLetterBatch = 256

// deadLetterWorker publishes the dead letters queued together as one batch
// (forward.Batch), waits for the stream to store each, then acks the
// originals; what it does on each failure (retry, shrink, count as
// unstorable) is in docs/failures.md, "Dead letter".
func (s *Stage) deadLetterWorker(ctx context.Context, in <-chan deadLetter) {
	health := s.reporter("")
	var msgs, send []*nats.Msg
	var res, sent []forward.Result
	var idx []int
	batcher.Run(in, deadLetterBatch, 0, func(batch []deadLetter) {
		msgs, send, idx = msgs[:0], send[:0], idx[:0]
		res = append(res[:0], make([]forward.Result, len(batch))...)
		for i, dl := range batch {
			m := s.deadLetterMsg(dl)
			msgs = append(msgs, m)
			if err := forward.CheckSize(m, s.nc.MaxPayload()); err != nil {
				res[i] = forward.Result{Done: true, Err: err}
				continue
			}
			send, idx = append(send, m), append(idx, i)
		}
		sent = append(sent[:0], make([]forward.Result, len(send))...)
		if len(send) > 0 && !s.fencedDeadLetters(batch, idx) {
			// An error here is ctx's: the unsettled ones stay unacked.
			_ = forward.Batch(ctx, s.js, send, sent, s.deadLetterOptions(batch, health))
		} else if len(send) > 0 {
			s.publishFencedDeadLetters(ctx, batch, idx, send, sent, health)
		}
		for j, i := range idx {
			res[i] = sent[j]
		}
		for i, dl := range batch {
			s.settleDeadLetter(ctx, dl, msgs[i], res[i], health)
		}
	})
}

// fencedDeadLetters reports whether any dead letter to send (batch[idx[j]])
// carries a partition's dead-letter fence.
func (s *Stage) fencedDeadLetters(batch []deadLetter, idx []int) bool {
	for _, i := range idx {
		if batch[i].fence != nil {
			return true
		}
	}
	return false
}

// publishFencedDeadLetters publishes the dead letters to send
// (send[j] of batch[idx[j]]) in groups of one fence each, every publish of
// a group expecting its fence (forward.Options.Fence), and puts each
// result in sent. A group the server refuses because the fence moved is
// left unsettled (unacked: the partition's new owner decides those
// inputs), counted in dedupe_dead_letter_fence_refusals_total, and ends
// the tenure that decided it, as a lost pin does: the worker asks the
// server whether it still owns the partition before it takes it again.
func (s *Stage) publishFencedDeadLetters(ctx context.Context, batch []deadLetter, idx []int, send []*nats.Msg, sent []forward.Result, health retry.Reporter) {
	type group struct {
		fence *forward.Fence
		js    []int
	}
	var groups []group
	for j, i := range idx {
		f := batch[i].fence
		k := slices.IndexFunc(groups, func(g group) bool {
			return (g.fence == nil && f == nil) || (g.fence != nil && f != nil && *g.fence == *f)
		})
		if k < 0 {
			groups = append(groups, group{fence: f})
			k = len(groups) - 1
		}
		groups[k].js = append(groups[k].js, j)
	}
	for _, g := range groups {
		msgs := make([]*nats.Msg, len(g.js))
		res := make([]forward.Result, len(g.js))
		for k, j := range g.js {
			msgs[k] = send[j]
		}
		opts := s.deadLetterOptions(batch, health)
		opts.Fence = g.fence
		err := forward.Batch(ctx, s.js, msgs, res, opts)
		for k, j := range g.js {
			sent[j] = res[k]
		}
		if g.fence != nil && retry.IsFenced(err) {
			dl := batch[idx[g.js[0]]]
			s.src.deadLetterFenced(dl.p, dl.pin)
			s.logs.Warn("dead_letter_fenced", "scale-out: dead letters refused: another instance took the partition's dead-letter fence; they stay unacked for its owner",
				"partition", dl.partition, "dead_letters", len(g.js), "fence", g.fence.Subject, "err", err)
		}
	}
}

// deadLetterOptions are the publish options of a batch of dead letters:
// transient failures retried (and logged) while ctx lasts, the originals
// kept in progress while that takes long.
func (s *Stage) deadLetterOptions(batch []deadLetter, health retry.Reporter) forward.Options {
	b := retry.NewBackoff()
	last := time.Now()
	return forward.Options{
		Component: CompDeadLetter,
		Atomic:    s.atomicDeadLetters,
		Retry: retry.Options{
			Reporter: health,
			Pause: func() {
				if b.Since() > s.ackWait/3 && time.Since(last) > s.ackWait/3 {
					for _, dl := range batch {
						_ = dl.msg.InProgress()
					}
					last = time.Now()
				}
			},
		},
		OnRetry: func(attempt, failed int, err error) {
			s.logs.Warn("dead_letter_publish_retry", "dead-letter publish failed, retrying", "dead_letters", failed, "attempt", attempt, "err", err)
		},
	}
}

// settleDeadLetter finishes dead letter dl, published as m with result r:
// one refused permanently is shrunk and stored on its own; then the
// original is acked and counted. One still unsettled (ctx ended) is left
// unacked: it comes back after ack_wait.
func (s *Stage) settleDeadLetter(ctx context.Context, dl deadLetter, m *nats.Msg, r forward.Result, health retry.Reporter) {
	if !r.Done {
		return
	}
	err := r.Err
	if err != nil {
		s.logs.Warn("dead_letter_refused", "dead letter refused; storing it without payload and with its headers cut",
			"reason", dl.reason, "subject", m.Subject, "err", err)
		err = s.storeDeadLetter(ctx, dl, deadletter.Shrink(s.deadLetterInput(dl), m.Subject), health)
		if err != nil && !retry.IsPermanent(err) {
			return // ctx ended: left unacked, it comes back after ack_wait
		}
	}
	if err != nil {
		subject, stream, seq, _ := s.sourceOf(dl)
		s.metrics.DeadLettersUnstorable.WithLabelValues(string(dl.reason)).Inc()
		s.logs.Error("dead_letter_unstorable", "dead letter cannot be stored even shrunk; the input is acked and stays in its stream",
			"reason", dl.reason, "stream", stream, "sequence", seq, "subject", subject, "err", err)
	}
	s.metrics.DeadLetters.WithLabelValues(string(dl.reason)).Inc()
	if dl.partition == "" {
		s.metrics.UnpartitionedDeadLetters.Inc()
	} else {
		s.metrics.Messages.WithLabelValues(dl.partition, outcomeDeadLetter).Inc()
	}
	_ = dl.msg.Ack()
}

// storeDeadLetter publishes m, the dead letter of dl, alone and waits for
// the stream to store it (deadletter.Store).
func (s *Stage) storeDeadLetter(ctx context.Context, dl deadLetter, m *nats.Msg, health retry.Reporter) error {
	return deadletter.Store(ctx, s.js, m, dl.msg, deadletter.StoreOptions{
		Component:  CompDeadLetter,
		Reporter:   health,
		MaxPayload: s.nc.MaxPayload(),
		AckWait:    s.ackWait,
		OnRetry: func(attempt int, err error) {
			s.logs.Warn("dead_letter_publish_retry", "dead-letter publish failed, retrying", "subject", m.Subject, "attempt", attempt, "err", err)
		},
	})
}

// deadLetterMsg builds the dead letter of dl: the input's headers and,
// when it fits, its payload, with the reason, the detail and where the
// input is.
func (s *Stage) deadLetterMsg(dl deadLetter) *nats.Msg {
	return deadletter.Build(s.deadLetterInput(dl), s.cfg.DeadLetter.SubjectFor(string(dl.reason)), s.nc.MaxPayload(), deadletter.OmittedTooLarge)
}

// deadLetterInput is what deadletter builds dl's dead letter from.
func (s *Stage) deadLetterInput(dl deadLetter) deadletter.Input {
	in := deadletter.Input{Reason: dl.reason, Detail: dl.detail, Header: dl.msg.Headers(), Data: dl.msg.Data()}
	in.Subject, in.Stream, in.Sequence, _ = s.sourceOf(dl) // Stream is "" when not ok
	return in
}

// sourceOf returns where the input of dead letter dl is: for a copy its
// source made (source.inputOf; not for a message dead-lettered as not
// routed), the input it copied, which outlives the copy; for any other,
// and for a copy the source cannot trace, the message's own subject,
// stream and sequence. ok is false when the stream and sequence cannot be
// read.
func (s *Stage) sourceOf(dl deadLetter) (subject, stream string, seq uint64, ok bool) {
	md, err := dl.msg.Metadata()
	if err != nil {
		return dl.msg.Subject(), "", 0, false
	}
	if dl.reason != deadletter.ReasonNotRouted {
		if subject, stream, seq, ok := s.src.inputOf(dl.msg, md.Stream); ok {
			return subject, stream, seq, true
		}
	}
	return dl.msg.Subject(), md.Stream, md.Sequence.Stream, true
}
