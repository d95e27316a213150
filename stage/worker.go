package stage

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/batcher"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Headers the stage sets on dead letters.
const (
	HeaderReason           = "Dedupe-Reason"
	HeaderDetail           = "Dedupe-Detail"
	HeaderOriginalSubject  = "Dedupe-Original-Subject"
	HeaderOriginalStream   = "Dedupe-Original-Stream"
	HeaderOriginalSequence = "Dedupe-Original-Sequence"
	HeaderPayloadOmitted   = "Dedupe-Payload-Omitted"
)

// fingerprint is the payload fingerprint stored with each key.
func fingerprint(data []byte) uint64 { return xxhash.Sum64(data) }

// partitionWorker owns one partition: it gathers batches from in and
// processes them one after another until in is closed.
func (s *Stage) partitionWorker(ctx context.Context, p *state.Partition, in <-chan item, dlq chan<- deadLetter) {
	w := &batchWork{s: s, p: p, label: strconv.Itoa(p.Index()), dlq: dlq}
	batcher.Run(in, s.cfg.Pipeline.BatchSize, s.cfg.Pipeline.BatchLinger.D(), func(batch []item) {
		w.process(ctx, batch)
	})
}

// batchWork processes the batches of one partition.
type batchWork struct {
	s     *Stage
	p     *state.Partition
	label string
	dlq   chan<- deadLetter

	// per batch, reused
	firstIdx map[string]int
	newIdx   []int
	acks     []int
	started  time.Time
	touched  time.Time
}

// process judges one batch: look up every key, publish the new ones, commit
// their claims in one transaction, then ack. If ctx is cancelled while the
// output or the store keeps failing, the batch is left unacked: the server
// redelivers it after AckWait and it is judged again.
func (w *batchWork) process(ctx context.Context, batch []item) {
	s := w.s
	s.metrics.BatchSize.Observe(float64(len(batch)))
	w.started, w.touched = time.Now(), time.Now()
	if w.firstIdx == nil {
		w.firstIdx = make(map[string]int, len(batch))
	}
	clear(w.firstIdx)
	w.newIdx, w.acks = w.newIdx[:0], w.acks[:0]
	now := s.clock.Now()

	for i := range batch {
		it := &batch[i]
		if j, ok := w.firstIdx[string(it.key)]; ok {
			// A copy of a key that is new in this same batch.
			w.repeat(i, batch, state.Record{FirstSeen: now, Fingerprint: batch[j].fp}, now)
			continue
		}
		var res state.LookupResult
		if err := w.retry(ctx, batch, "lookup", func() (err error) {
			res, err = w.p.Lookup(it.key)
			return err
		}); err != nil {
			return
		}
		if res.Found {
			w.repeat(i, batch, res.Record, now)
			continue
		}
		if s.totals != nil && s.totals.late(w, i, batch, now) {
			continue
		}
		w.firstIdx[string(it.key)] = i
		w.newIdx = append(w.newIdx, i)
	}

	if len(w.newIdx) > 0 {
		if s.beforePublish != nil {
			s.beforePublish(w.p.Index(), len(batch))
		}
		t := time.Now()
		if err := w.publish(ctx, batch); err != nil {
			return
		}
		s.metrics.PublishSeconds.Observe(time.Since(t).Seconds())

		claims := make([]state.Claim, len(w.newIdx))
		for k, i := range w.newIdx {
			claims[k] = state.Claim{Key: batch[i].key, Fingerprint: batch[i].fp, Total: batch[i].tot}
		}
		t = time.Now()
		var results []state.ClaimResult
		if err := w.retry(ctx, batch, "commit", func() (err error) {
			results, err = w.p.Claim(claims)
			return err
		}); err != nil {
			return
		}
		s.metrics.CommitSeconds.Observe(time.Since(t).Seconds())
		for k, r := range results {
			if !r.New {
				// Only this goroutine claims in this partition, so the
				// lookup above saw everything. Forwarded and recorded once
				// all the same; say so loudly.
				s.log.Error("claim found a key the lookup did not", "partition", w.label, "key", string(claims[k].Key))
			}
		}
		s.metrics.Messages.WithLabelValues(w.label, outcomeNew).Add(float64(len(w.newIdx)))
		w.acks = append(w.acks, w.newIdx...)
	}
	for _, i := range w.acks {
		_ = batch[i].msg.Ack() // a lost ack redelivers; the store then knows the key
	}
}

// repeat handles a message whose key the window already holds.
func (w *batchWork) repeat(i int, batch []item, rec state.Record, now time.Time) {
	s, it := w.s, &batch[i]
	age := s.win.Age(rec.FirstSeen, now)
	s.metrics.RepeatAge.Observe(age.Seconds())
	if s.win.Near(age) {
		s.metrics.NearWindowEnd.Inc()
	}
	if rec.Fingerprint != it.fp {
		s.metrics.FingerprintMismatch.Inc()
		if !s.dlqRepeatOnFP {
			w.dlq <- deadLetter{msg: it.msg, reason: "fingerprint_mismatch", partition: w.label,
				detail: fmt.Sprintf("key %q first seen %s with payload fingerprint %016x; this payload has %016x: the key was reused for a different operation",
					it.key, rec.FirstSeen.UTC().Format(time.RFC3339Nano), rec.Fingerprint, it.fp)}
			return
		}
		s.log.Warn("fingerprint mismatch treated as a repeat", "key", string(it.key), "first_seen", rec.FirstSeen)
	}
	s.metrics.Messages.WithLabelValues(w.label, outcomeRepeat).Inc()
	w.acks = append(w.acks, i)
}

// publish forwards the batch's new messages to the output, many in flight,
// and waits for every PubAck. Failed publishes are retried with backoff
// (the same Nats-Msg-Id, so a publish that did land is dropped as a
// duplicate) until they succeed or ctx is cancelled.
func (w *batchWork) publish(ctx context.Context, batch []item) error {
	s := w.s
	pending := append([]int(nil), w.newIdx...)
	futures := make([]jetstream.PubAckFuture, len(pending))
	b := newBackoff()
	for attempt := 0; ; attempt++ {
		var lastErr error
		futures = futures[:len(pending)]
		for k, i := range pending {
			f, err := s.js.PublishMsgAsync(s.outputMsg(&batch[i]), jetstream.WithStallWait(5*time.Second))
			if err != nil {
				futures[k], lastErr = nil, err
				continue
			}
			futures[k] = f
		}
		failed := pending[:0]
		for k, i := range pending {
			f := futures[k]
			if f == nil {
				failed = append(failed, i)
				continue
			}
			select {
			case ack := <-f.Ok():
				if ack.Duplicate {
					s.metrics.RepublishDuplicates.Inc()
				}
			case err := <-f.Err():
				failed = append(failed, i)
				lastErr = err
			}
		}
		pending = failed
		if len(pending) == 0 {
			if attempt > 0 {
				s.status.setHealthy("publish")
				s.metrics.Healthy.Set(1)
				s.log.Info("output publishes recovered", "partition", w.label)
			}
			return nil
		}
		s.metrics.PublishRetries.Add(float64(len(pending)))
		if attempt >= 2 {
			s.status.setUnhealthy("publish", lastErr)
			s.metrics.Healthy.Set(0)
		}
		s.log.Warn("output publish failed, retrying", "partition", w.label, "messages", len(pending), "attempt", attempt+1, "err", lastErr)
		if err := w.pause(ctx, batch, b); err != nil {
			s.log.Warn("stopping with a batch unforwarded; it stays unacked and comes back after ack_wait", "partition", w.label, "messages", len(batch))
			return err
		}
	}
}

// retry runs op until it succeeds or ctx is cancelled, backing off and
// keeping the batch's messages from being redelivered meanwhile.
func (w *batchWork) retry(ctx context.Context, batch []item, what string, op func() error) error {
	s := w.s
	b := newBackoff()
	for attempt := 0; ; attempt++ {
		err := op()
		if err == nil {
			if attempt > 0 {
				s.status.setHealthy(what)
				s.metrics.Healthy.Set(1)
				s.log.Info("state "+what+" recovered", "partition", w.label)
			}
			return nil
		}
		if what == "commit" {
			s.metrics.CommitRetries.Inc()
		}
		if attempt >= 2 {
			s.status.setUnhealthy(what, err)
			s.metrics.Healthy.Set(0)
		}
		s.log.Warn("state "+what+" failed, retrying; nothing is acked meanwhile", "partition", w.label, "attempt", attempt+1, "err", err)
		if err := w.pause(ctx, batch, b); err != nil {
			s.log.Warn("stopping with a batch uncommitted; it stays unacked and comes back after ack_wait", "partition", w.label, "messages", len(batch))
			return err
		}
	}
}

// pause waits for the next backoff step, telling the server the batch is
// still being worked on so it is not redelivered to nobody.
func (w *batchWork) pause(ctx context.Context, batch []item, b *backoff) error {
	w.keepAlive(batch)
	if err := b.wait(ctx); err != nil {
		return err
	}
	w.keepAlive(batch)
	return nil
}

// keepAlive sends InProgress for the batch when a third of AckWait has
// passed since the last signal.
func (w *batchWork) keepAlive(batch []item) {
	if time.Since(w.touched) < w.s.ackWait/3 {
		return
	}
	for i := range batch {
		_ = batch[i].msg.InProgress()
	}
	w.touched = time.Now()
}

// outputMsg builds the forwarded copy: the input's subject under the output
// prefix, its headers and payload, and the key carried as Nats-Msg-Id.
func (s *Stage) outputMsg(it *item) *nats.Msg {
	in := it.msg.Headers()
	h := make(nats.Header, len(in)+1)
	for k, v := range in {
		if strings.HasPrefix(k, "Nats-Expected-") {
			continue
		}
		h[k] = v
	}
	h[jetstream.MsgIDHeader] = []string{string(it.key)}
	return &nats.Msg{Subject: s.cfg.Output.Subject(it.msg.Subject()), Header: h, Data: it.msg.Data()}
}

// deadLetterWorker publishes dead letters, waiting for the stream to store
// each, then acks the original. Publishing is retried until it succeeds or
// ctx is cancelled; an unpublished dead letter stays unacked.
func (s *Stage) deadLetterWorker(ctx context.Context, in <-chan deadLetter) {
	for dl := range in {
		m := s.deadLetterMsg(dl)
		b := newBackoff()
		for attempt := 0; ; attempt++ {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := s.js.PublishMsg(pctx, m)
			cancel()
			if err == nil {
				break
			}
			s.log.Warn("dead-letter publish failed, retrying", "subject", m.Subject, "attempt", attempt+1, "err", err)
			if attempt >= 2 {
				s.status.setUnhealthy("dead_letter", err)
				s.metrics.Healthy.Set(0)
			}
			if time.Since(b.start) > s.ackWait/3 {
				_ = dl.msg.InProgress()
			}
			if b.wait(ctx) != nil {
				break
			}
		}
		if ctx.Err() != nil {
			continue // left unacked: it comes back after ack_wait
		}
		s.status.setHealthy("dead_letter")
		s.metrics.DeadLetters.WithLabelValues(dl.reason).Inc()
		s.metrics.Messages.WithLabelValues(dl.partition, outcomeDeadLetter).Inc()
		_ = dl.msg.Ack()
	}
}

// deadLetterMsg builds the dead letter: the original headers and payload
// with the reason, the detail and where the original is.
func (s *Stage) deadLetterMsg(dl deadLetter) *nats.Msg {
	in := dl.msg.Headers()
	h := make(nats.Header, len(in)+6)
	for k, v := range in {
		if strings.HasPrefix(k, "Nats-") {
			continue
		}
		h[k] = v
	}
	h.Set(HeaderReason, dl.reason)
	h.Set(HeaderDetail, dl.detail)
	h.Set(HeaderOriginalSubject, dl.msg.Subject())
	data := dl.msg.Data()
	if md, err := dl.msg.Metadata(); err == nil {
		h.Set(HeaderOriginalStream, md.Stream)
		h.Set(HeaderOriginalSequence, strconv.FormatUint(md.Sequence.Stream, 10))
		// One dead letter per input message, even if this one is redelivered.
		h.Set(jetstream.MsgIDHeader, "dlq:"+md.Stream+":"+strconv.FormatUint(md.Sequence.Stream, 10))
	}
	if room := s.nc.MaxPayload() - 8192; int64(len(data)) > room {
		h.Set(HeaderPayloadOmitted, fmt.Sprintf("%d bytes: too large to dead-letter; read it from the original stream and sequence", len(data)))
		data = nil
	}
	return &nats.Msg{Subject: s.cfg.DeadLetter.SubjectFor(dl.reason), Header: h, Data: data}
}

// backoff is exponential backoff with jitter, from 50ms to 5s.
type backoff struct {
	start time.Time
	next  time.Duration
}

func newBackoff() *backoff { return &backoff{start: time.Now(), next: 50 * time.Millisecond} }

func (b *backoff) reset() { b.next = 50 * time.Millisecond }

// wait sleeps for the next step or until ctx is done, and returns ctx.Err().
func (b *backoff) wait(ctx context.Context) error {
	d := b.next/2 + rand.N(b.next/2+1)
	b.next = min(2*b.next, 5*time.Second)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
