package stage

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/batcher"
	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/lograte"
	"github.com/dedupe-stage/dedupe-stage/internal/ownership"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// fingerprint is the payload fingerprint stored with each key
// (changelog.Fingerprint, which a restore computes too).
func fingerprint(data []byte) uint64 { return changelog.Fingerprint(data) }

// runPartition owns one partition: it gathers batches from in and has its
// worker process them one after another until in is closed.
func (s *Stage) runPartition(ctx context.Context, p *state.Partition, in <-chan item, dlq chan<- deadletter.Letter) {
	label := strconv.Itoa(p.Index())
	w := &worker{s: s, p: p, label: label, dlq: dlq, health: newQuietReporter(s.reporter(label))}
	w.owner = s.owners[p.Index()]
	w.newKeys = lazyCounter{vec: s.metrics.Messages, partition: label, outcome: outcomeNew}
	w.repeats = lazyCounter{vec: s.metrics.Messages, partition: label, outcome: outcomeRepeat}
	w.stale = lazyCounter{vec: s.metrics.Messages, partition: label, outcome: outcomeStale}
	w.dropped = lazyCounter{vec: s.metrics.Messages, partition: label, outcome: outcomeDropped}
	batcher.Run(in, s.cfg.PartitionBatch(), s.cfg.Pipeline.BatchLinger.D(), func(batch []item) {
		w.process(ctx, batch)
	})
}

// worker processes the batches of one partition.
type worker struct {
	s      *Stage
	p      *state.Partition
	label  string
	dlq    chan<- deadletter.Letter
	health retry.Reporter // reports this partition's lookup, publish, commit

	// This partition's dedupe_messages_total of each outcome.
	newKeys, repeats, stale, dropped lazyCounter

	// per batch, reused
	firstIdx    map[string]int      // key -> index in the batch of its copy forwarded last
	seen        map[string]struct{} // segment's keys, with key.version
	newIdx      []int
	laterCopies [][2]int    // {copy, first}: a key new in this batch, seen again in it
	refreshIdx  []int       // repeats whose window the commit moves (window.refresh_on_repeat), acked after it
	refreshOut  []*nats.Msg // in a group, refreshIdx's changelog records (ownership.Owner.RefreshRecord), published after w.out
	acks        []int
	out         []*nats.Msg
	copies      []outCopy // the batch's forwarded copies, which out points into
	base        []string  // per forward in out (not refreshOut), its id before an AfterID
	res         []forward.Result
	progress    batcher.Progress // paces the batch's InProgress signals

	// owner is the partition's ownership: the single instance's, or this
	// instance's tenures in a scale-out group.
	owner ownership.Owner
}

// process judges one batch: look up every key, publish the new ones, commit
// their claims in one transaction, then ack. A message no retry can forward
// or record is dead-lettered and the rest of the batch proceeds. If ctx is
// cancelled while the output or the store keeps failing, the batch is left
// unacked: the server redelivers it after AckWait and it is judged again.
func (w *worker) process(ctx context.Context, batch []item) {
	s := w.s
	s.metrics.BatchMessages.Observe(float64(len(batch)))
	w.progress.Start(time.Now())
	defer s.turns.take(w.p.Index())() // an operator's forget waits for the batch
	release, v := w.owner.Own(ctx, batch[len(batch)-1].pin, len(batch), func() { w.keepAlive(batch) })
	defer release()
	switch v {
	case ownership.GiveBack:
		giveBack(batch)
		return
	case ownership.Leave:
		return
	}
	for len(batch) > 0 {
		seg := batch[:w.segment(batch)]
		if !w.judgeSegment(ctx, seg) {
			return
		}
		batch = batch[len(seg):]
	}
}

// judgeSegment judges seg, a segment of a batch, forwards and commits its
// new keys and acks it. It returns false when seg is left unacked.
func (w *worker) judgeSegment(ctx context.Context, batch []item) bool {
	w.reset(len(batch))
	if !w.judge(ctx, batch) {
		return false
	}
	if (len(w.newIdx) > 0 || len(w.refreshIdx) > 0) && !w.forwardNew(ctx, batch) {
		return false
	}
	w.settleLaterCopies(batch)
	for _, i := range w.acks {
		_ = batch[i].msg.Ack() // a lost ack redelivers; the store then knows the key
	}
	return true
}

// segment returns the length of the batch's first segment: the whole
// batch, or with key.version, up to the second copy of a key, so that
// each copy is judged against the version its predecessor recorded.
func (w *worker) segment(batch []item) int {
	if w.s.version == nil || len(batch) < 2 {
		return len(batch)
	}
	if w.seen == nil {
		w.seen = make(map[string]struct{}, len(batch))
	}
	clear(w.seen)
	for i := range batch {
		if _, ok := w.seen[string(batch[i].key)]; ok {
			return i
		}
		w.seen[string(batch[i].key)] = struct{}{}
	}
	return len(batch)
}

// reset clears the worker's per-batch state for a batch of n messages.
func (w *worker) reset(n int) {
	if w.firstIdx == nil {
		w.firstIdx = make(map[string]int, n)
	}
	clear(w.firstIdx)
	w.newIdx, w.laterCopies, w.refreshIdx, w.acks, w.out = w.newIdx[:0], w.laterCopies[:0], w.refreshIdx[:0], w.acks[:0], w.out[:0]
	w.base = w.base[:0]
	w.refreshOut = w.refreshOut[:0]
}

// judge looks up every key of the batch and sorts its messages, each at
// its own input time: a repeat (queued for its ack), a later copy of a key
// new in this batch (w.laterCopies), a late total or a dead letter, or
// new: its forwarded copy goes to w.out and its index to w.newIdx. It
// returns false when the batch is left unacked (ctx ended, or the store
// closed, while a lookup kept failing).
func (w *worker) judge(ctx context.Context, batch []item) bool {
	s := w.s
	lookupOpts := w.retryOpts(batch, "state lookup", nil) // once per batch: it allocates
	w.copies = nil                                        // made on first need (forwardCopy)
	for i := range batch {
		it := &batch[i]
		if j, ok := w.firstIdx[string(it.key)]; ok {
			if s.win.Inside(batch[j].at, it.at) {
				w.laterCopies = append(w.laterCopies, [2]int{i, j})
				continue
			}
			// The batch forwards this key already, but that copy's window
			// ended before this one came: forwarded again, after it.
			if !w.late(i, batch) {
				w.forwardCopy(i, batch, outputID(it), time.Time{}, batch[j].at)
			}
			continue
		}
		var res state.LookupResult
		err := retry.Do(ctx, CompLookup, func() (err error) {
			res, err = w.p.Lookup(it.key, it.at)
			return err
		}, lookupOpts)
		if err != nil {
			if !retry.IsPermanent(err) || errors.Is(err, state.ErrClosed) {
				w.stopping(batch, err)
				return false
			}
			w.deadLetter(it, deadletter.ReasonStateRejected, fmt.Sprintf("the state store cannot look up key %q: %v", it.key, err))
			continue
		}
		if res.Found && (!it.versioned || !res.Record.OlderThan(it.version)) {
			w.repeat(i, batch, res.Record, s.refresh)
			continue
		}
		if w.late(i, batch) {
			continue
		}
		var prev time.Time // the first-seen time of the key's forward whose window ended, when it had this id
		if !res.Ended.IsZero() && res.Record.HasVersion == it.versioned && (!it.versioned || res.Record.Version == it.version) {
			prev = res.Record.FirstSeen
		}
		w.forwardCopy(i, batch, outputID(it), res.Forgotten, prev)
	}
	return true
}

// forwardCopy queues batch[i] to be forwarded, with id (outputID) as
// ForwardID makes it after a forget at forgotten (zero: none) and, when
// prev is not zero, AfterID after the key's forward first seen at prev,
// whose window had ended; or dead-letters it when the copy is too large
// to publish.
func (w *worker) forwardCopy(i int, batch []item, id string, forgotten, prev time.Time) {
	s, it := w.s, &batch[i]
	if w.copies == nil {
		// One allocation for the batch's copies instead of two per copy.
		// Its capacity is never exceeded, so the pointers into it stay
		// valid; it is new for each batch because nats.go holds a copy
		// until its PubAck.
		w.copies = make([]outCopy, 0, len(batch)-i)
	}
	w.copies = append(w.copies, outCopy{})
	base := changelog.ForwardID(id, forgotten)
	fid := base
	if !prev.IsZero() {
		fid = changelog.AfterID(base, prev)
	}
	m := s.outputMsg(it, fid, &w.copies[len(w.copies)-1])
	if !forgotten.IsZero() {
		changelog.AnnotateForgotten(m.Header, forgotten) // the first forward since a forget
	}
	if !prev.IsZero() {
		changelog.AnnotateAfter(m.Header, prev)
		s.metrics.ForwardsAfterWindow.Inc()
	}
	w.owner.Annotate(m, it.inputSubject(), it.fp, it.tot, it.at)
	if err := forward.CheckSize(m, s.nc.MaxPayload()); err != nil {
		w.deadLetter(it, deadletter.ReasonOversized, "the forwarded copy (with the stage's Nats-Msg-Id) cannot be published: "+err.Error())
		return
	}
	w.firstIdx[string(it.key)] = i
	w.newIdx = append(w.newIdx, i)
	w.out = append(w.out, m)
	w.base = append(w.base, base)
}

// late handles a new key's message whose total is too late for its time
// bucket at its input time (totals.late): dropped and acked, or dead-lettered. It reports
// whether it did; false means the message is forwarded.
func (w *worker) late(i int, batch []item) bool {
	if w.s.totals == nil {
		return false
	}
	switch late, dl := w.s.totals.late(&batch[i], w.label, batch[i].at); late {
	case lateDrop:
		w.dropped.get().Inc()
		w.acks = append(w.acks, i)
		return true
	case lateDeadLetter:
		w.dlq <- w.fenced(dl)
		return true
	}
	return false
}

// forwardNew publishes the batch's new messages (w.out) and, in a group,
// its refresh records (w.refreshOut) in the same fenced publish,
// dead-letters the new messages the output refused for good, and commits
// the claims of the rest with the refreshes of its repeats (w.refreshIdx).
// It returns false when the batch is left unacked.
func (w *worker) forwardNew(ctx context.Context, batch []item) bool {
	w.res = w.res[:0]
	forwards := len(w.out)
	w.out = append(w.out, w.refreshOut...)
	if len(w.out) > 0 {
		if w.s.beforePublish != nil {
			w.s.beforePublish(w.p.Index(), len(batch))
		}
		w.owner.Publishing()
		w.res = append(w.res[:0], make([]forward.Result, len(w.out))...)
		if !w.publish(ctx, batch, w.out, w.res) || !w.afterDuplicates(ctx, batch) {
			return false
		}
		// What the output still calls a duplicate is a re-publish: a
		// forward past the window went again under an id of its own.
		for _, r := range w.res {
			if r.Duplicate {
				w.s.metrics.RepublishDuplicates.Inc()
			}
		}
	}
	claims := make([]state.Claim, 0, len(w.newIdx)+len(w.refreshIdx))
	idx := make([]int, 0, cap(claims)) // each claim's message in the batch
	for k, i := range w.newIdx {
		if err := w.res[k].Err; err != nil {
			w.deadLetter(&batch[i], deadletter.ReasonOutputRejected, "the output stream refused the forward: "+deadletter.Describe(err))
			continue
		}
		it := &batch[i]
		claims = append(claims, state.Claim{Key: it.key, Fingerprint: it.fp, Total: it.tot, Versioned: it.versioned, Version: it.version,
			OutputSeq: w.res[k].Seq, At: it.at})
		idx = append(idx, i)
	}
	forwarded := len(claims)
	for k, i := range w.refreshIdx {
		it := &batch[i]
		if len(w.refreshOut) > 0 && w.res[forwards+k].Err != nil {
			w.acks = append(w.acks, i) // a repeat all the same; without its changelog record, its window stays where it was
			continue
		}
		claims = append(claims, state.Claim{Key: it.key, Fingerprint: it.fp, Versioned: it.versioned, Version: it.version, At: it.at})
		idx = append(idx, i)
	}
	return w.commit(ctx, batch, claims, idx, forwarded)
}

// settleLaterCopies judges each later copy of a key new in this batch: a
// repeat of the copy forwarded, or a dead letter when the output refused
// that copy.
func (w *worker) settleLaterCopies(batch []item) {
	for _, c := range w.laterCopies {
		i, j := c[0], c[1]
		if k := w.indexOfNew(j); k >= 0 && w.res[k].Err != nil {
			w.deadLetter(&batch[i], deadletter.ReasonOutputRejected, "the output stream refused an earlier copy of this key in the same batch: "+deadletter.Describe(w.res[k].Err))
			continue
		}
		w.repeat(i, batch, state.Record{FirstSeen: batch[j].at, Fingerprint: batch[j].fp}, false)
	}
}

// publish forwards out, many in flight, and waits for every PubAck, whose
// results go to res (as long as out). Transient failures are retried with
// backoff (the same Nats-Msg-Id, so a publish that did land is dropped as
// a duplicate); permanent ones end in res. It returns false when ctx ended
// first.
func (w *worker) publish(ctx context.Context, batch []item, out []*nats.Msg, res []forward.Result) bool {
	s := w.s
	t := time.Now()
	o := forward.Options{
		Component: CompPublish,
		Retry:     w.retryOpts(batch, "output publish", nil),
		OnRetry: func(attempt, failed int, err error) {
			s.metrics.PublishRetries.Add(float64(failed))
			s.logs.Warn("output_publish_retry", "output publish failed, retrying", "partition", w.label, "messages", failed, "attempt", attempt, "err", err)
		},
		Atomic:     s.atomicOutput,
		BatchMax:   s.cfg.Output.BatchMax,
		AtomicMin:  s.cfg.Output.AtomicMinBatch,
		Inflight:   s.outputBatches,
		OnFallback: w.fallback,
		Fence:      w.owner.Fence(),
	}
	if err := forward.Batch(ctx, s.js, out, res, o); err != nil {
		if !retry.IsFenced(err) || !w.owner.Lost(ctx, err) {
			w.stopping(batch, err)
		}
		return false
	}
	s.metrics.PublishSeconds.Observe(time.Since(t).Seconds())
	return true
}

// fallback logs an atomic batch the output refused as a whole, which
// forward then publishes one message at a time.
// An id already in the duplicate window (after a crash between publish
// and commit, or a key forwarded again past the window W while the
// stream's window still holds it) is expected and logged at info; any
// other refusal is a warning.
func (w *worker) fallback(messages int, err error) {
	w.s.logs.Log(context.Background(), deadletter.FallbackLevel(err), "output_atomic_fallback", "output refused an atomic batch; publishing its messages one at a time",
		"partition", w.label, "messages", messages, "err", deadletter.Describe(err))
}

// commit claims the forwarded keys, claims[:forwarded], and the repeats
// whose window moves, claims[forwarded:], in one transaction (as the owner
// commits them, each at its input time), retrying
// transient failures, and queues their acks; idx[k] is claim k's message
// in the batch. When the store refuses the transaction permanently, each
// claim is tried alone and the ones it refuses are dead-lettered (a
// repeat's refusal only leaves its window where it was). It returns false
// when ctx ended first.
func (w *worker) commit(ctx context.Context, batch []item, claims []state.Claim, idx []int, forwarded int) bool {
	s := w.s
	if len(claims) == 0 {
		if len(w.res) > 0 {
			// The output refused every forward: none is in flight any more.
			// A failure leaves the partition in flight, which only holds
			// the watermark back.
			_, _ = w.owner.Claim(w.p, nil, w.res)
		}
		return true
	}
	t := time.Now()
	var results []state.ClaimResult
	err := retry.Do(ctx, CompCommit, func() (err error) {
		results, err = w.owner.Claim(w.p, claims, w.res)
		return err
	}, w.retryOpts(batch, "state commit", s.metrics.CommitRetries))
	if err != nil && (!retry.IsPermanent(err) || errors.Is(err, state.ErrClosed)) {
		w.stopping(batch, err)
		return false
	}
	if err != nil {
		s.logs.Error("commit_refused", "the state store refused a batch's claims; claiming them one by one", "partition", w.label, "claims", len(claims), "err", err)
		results = results[:0]
		for k, c := range claims {
			var r []state.ClaimResult
			err := retry.Do(ctx, CompCommit, func() (err error) {
				r, err = w.p.Claim([]state.Claim{c})
				return err
			}, w.retryOpts(batch, "state commit", s.metrics.CommitRetries))
			switch {
			case err == nil:
				if k < forwarded {
					results = append(results, r[0])
				}
				w.acks = append(w.acks, idx[k])
			case !retry.IsPermanent(err) || errors.Is(err, state.ErrClosed):
				w.stopping(batch, err)
				return false
			case k >= forwarded:
				w.acks = append(w.acks, idx[k]) // a repeat all the same; its window stays where it was
			default:
				w.deadLetter(&batch[idx[k]], deadletter.ReasonStateRejected,
					fmt.Sprintf("forwarded to the output, but the state store refused the claim of key %q: %v; a later copy of the key is forwarded again", c.Key, err))
			}
		}
	} else {
		results = results[:forwarded]
		w.acks = append(w.acks, idx...)
	}
	s.metrics.CommitSeconds.Observe(time.Since(t).Seconds())
	for k, r := range results {
		if !r.New {
			// Only this goroutine claims in this partition, so the lookup
			// above saw everything. Forwarded and recorded once all the
			// same; say so loudly.
			s.logs.Error("claim_not_new", "claim found a key the lookup did not", "partition", w.label, "key", string(claims[k].Key))
		}
	}
	w.newKeys.get().Add(float64(len(results)))
	return true
}

// indexOfNew returns the position in w.newIdx (and w.res) of batch index
// i, or -1.
func (w *worker) indexOfNew(i int) int {
	for k, j := range w.newIdx {
		if j == i {
			return k
		}
	}
	return -1
}

// stopping logs that the batch is left unacked because ctx ended (or the
// store closed) while an operation kept failing.
func (w *worker) stopping(batch []item, err error) {
	w.s.logs.Warn("batch_unfinished", "stopping with a batch unfinished; it stays unacked and comes back after ack_wait",
		"partition", w.label, "messages", len(batch), "err", err)
}

// deadLetter sends batch item it to the dead-letter worker; it acks it
// once stored.
func (w *worker) deadLetter(it *item, reason deadletter.Reason, detail string) {
	w.dlq <- w.fenced(deadletter.Letter{Msg: it.msg, Reason: reason, Partition: w.label, Detail: detail})
}

// fenced returns dl carrying the fence a dead letter decided now by this
// worker expects (ownership.Owner.DeadLetterFence), with the partition and the
// pin of the tenure that decided it; dl unchanged when there is none.
func (w *worker) fenced(dl deadletter.Letter) deadletter.Letter {
	if f, pin := w.owner.DeadLetterFence(); f != nil {
		dl.Fence, dl.P, dl.Pin = f, w.p.Index(), pin
	}
	return dl
}

// giveBack naks every message of batch without delay: they were
// delivered under a pin this instance gave up (or it stops), and the
// partition's next owner gets them at once instead of after ack_wait.
func giveBack(batch []item) {
	for i := range batch {
		_ = batch[i].msg.Nak() // a lost nak: the message comes back after ack_wait
	}
}

// repeat handles a message whose key the window holds at its input time
// (its age is the difference of the two input times): a stale one with
// key.version. With refresh, its ack waits for the commit that moves its
// key's window.
func (w *worker) repeat(i int, batch []item, rec state.Record, refresh bool) {
	s, it := w.s, &batch[i]
	age := s.win.Age(rec.WindowStart(), it.at)
	s.metrics.RepeatAge.Observe(age.Seconds())
	if s.win.Near(age) {
		s.metrics.NearWindowEnd.Inc()
	}
	if rec.Fingerprint != it.fp && (!it.versioned || rec.Version == it.version) {
		s.metrics.FingerprintMismatch.Inc()
		if !s.fpMismatchIsRepeat {
			w.deadLetter(it, deadletter.ReasonFingerprintMismatch,
				fmt.Sprintf("key %q first seen %s with payload fingerprint %016x; this payload has %016x: the key was reused for a different operation",
					it.key, rec.FirstSeen.UTC().Format(time.RFC3339Nano), rec.Fingerprint, it.fp))
			return
		}
		s.logs.Warn("fingerprint_mismatch", "fingerprint mismatch treated as a repeat", "key", string(it.key), "first_seen", rec.FirstSeen)
	}
	if it.versioned {
		w.stale.get().Inc()
	} else {
		w.repeats.get().Inc()
	}
	if refresh {
		w.refreshIdx = append(w.refreshIdx, i)
		if m := w.owner.RefreshRecord(it.key, rec, it.at); m != nil {
			w.refreshOut = append(w.refreshOut, m)
		}
		return
	}
	w.acks = append(w.acks, i)
}

// retryOpts are the retry options of the batch's operations: health
// reported for this partition, the batch kept from redelivery between
// attempts, what (for the logs) names the operation, and retries (nil:
// none) counts each retry.
func (w *worker) retryOpts(batch []item, what string, retries prometheus.Counter) retry.Options {
	return retry.Options{
		Reporter: w.health,
		Pause:    func() { w.keepAlive(batch) },
		OnRetry: func(attempt int, err error) {
			if retries != nil {
				retries.Inc()
			}
			w.s.logs.Warn(strings.ReplaceAll(what, " ", "_")+"_retry", what+" failed, retrying; nothing is acked meanwhile", "partition", w.label, "attempt", attempt, "err", err)
		},
	}
}

// keepAlive sends InProgress for the batch when it is due
// (batcher.Progress).
func (w *worker) keepAlive(batch []item) {
	if !w.progress.Due(w.s.ackWait) {
		return
	}
	for i := range batch {
		_ = batch[i].msg.InProgress()
	}
}

// Headers of a forwarded copy with key.version, whose Nats-Msg-Id is not
// the key alone (see outputID); changelog owns them.
const (
	// HeaderKey is the copy's key.
	HeaderKey = changelog.HeaderKey
	// HeaderVersion is the copy's version, in decimal.
	HeaderVersion = changelog.HeaderVersion
)

// outputID is the Nats-Msg-Id of it's forwarded copy: its key, or with
// key.version "<key>:v<version>", so that the output stream's duplicate
// window tells the versions of a key apart.
func outputID(it *item) string {
	if !it.versioned {
		return string(it.key)
	}
	return changelog.VersionedID(string(it.key), it.version)
}

// outCopy is a forwarded copy and the value of its Nats-Msg-Id header,
// allocated together.
type outCopy struct {
	msg nats.Msg
	id  [1]string
}

// outputMsg builds in c the forwarded copy of it and returns &c.msg: the
// input's subject under the output prefix, its headers and payload, and id
// (the key) as Nats-Msg-Id; a routed message's copy is its input's.
// The copy takes over the input's header map, deleting its publish
// directives (forward.IsDirective), the route step's headers and the
// headers a forward's id is read back with: only its dead letter reads
// them after this, and that leaves out every Nats- header.
func (s *Stage) outputMsg(it *item, id string, c *outCopy) *nats.Msg {
	h := it.msg.Headers()
	if h == nil {
		h = make(nats.Header, 1)
	}
	routed := it.subject != ""
	for k := range h {
		if forward.IsDirective(k) || (routed && s.src.copyHeader(k)) {
			delete(h, k)
		}
	}
	// Headers that change how a forward's id reads back (changelog.KeyOf)
	// are the stage's alone: an input that carries them (another stage's
	// output, say) loses them here, and forwardCopy sets its own.
	delete(h, changelog.HeaderForgotten)
	delete(h, changelog.HeaderAfter)
	c.id[0] = id
	h[jetstream.MsgIDHeader] = c.id[:]
	if it.versioned {
		changelog.AnnotateVersion(h, string(it.key), it.version)
	}
	c.msg = nats.Msg{Subject: s.cfg.Output.Subject(it.msg.Subject()), Header: h, Data: it.msg.Data()}
	return &c.msg
}

// reporter returns the health reporter of one unit of the components,
// a partition (unit "" reports the component itself), which logs
// recoveries.
func (s *Stage) reporter(unit string) retry.Reporter {
	var r retry.Reporter = s.status
	if unit != "" {
		r = unitReporter{st: s.status, name: unit}
	}
	return logRecovery{Reporter: r, logs: s.logs, unit: unit}
}

// quietReporter passes every failure on, and a success only when it ends
// failures (of the same component, passed on through it). The worker reports
// a success for every lookup, and passing each on would take the Health lock
// and build the unit's name per message to change nothing. It relies on
// being the only reporter of its components (one partition's), and is not
// safe for concurrent use: each partition's worker has its own.
type quietReporter struct {
	next    retry.Reporter
	failing map[string]bool // components that failed since their last success
}

func newQuietReporter(next retry.Reporter) *quietReporter {
	return &quietReporter{next: next, failing: map[string]bool{}}
}

// Failed implements retry.Reporter.
func (q *quietReporter) Failed(component string, err error) {
	q.failing[component] = true
	q.next.Failed(component, err)
}

// Succeeded implements retry.Reporter.
func (q *quietReporter) Succeeded(component string, retried bool) {
	if !retried && !q.failing[component] {
		return
	}
	delete(q.failing, component)
	q.next.Succeeded(component, retried)
}

// logRecovery logs when a component's operation succeeds after failures.
type logRecovery struct {
	retry.Reporter
	logs *lograte.Limiter // once per batch after failures: rate-limited
	unit string           // the partition, or "" for the component itself
}

// recovered are the log messages of recoveries, by component.
var recovered = map[string]string{
	CompPublish:    "output publishes recovered",
	CompDeadLetter: "dead-letter publishes recovered",
	CompLookup:     "state lookup recovered",
	CompCommit:     "state commit recovered",
}

// Succeeded implements retry.Reporter.
func (l logRecovery) Succeeded(component string, retried bool) {
	l.Reporter.Succeeded(component, retried)
	if retried {
		msg := recovered[component]
		if msg == "" {
			msg = component + " recovered"
		}
		l.logs.Info(component+"_recovered", msg, "partition", l.unit)
	}
}

// lazyCounter is one child of a CounterVec, looked up by its labels on first
// use instead of on every message (the series itself is exported at 0 from
// the start: Metrics.ZeroPartitions). It is not safe for concurrent use:
// each partition's worker has its own.
type lazyCounter struct {
	vec                *prometheus.CounterVec
	partition, outcome string
	c                  prometheus.Counter
}

// get returns the child, resolving it on first use.
func (l *lazyCounter) get() prometheus.Counter {
	if l.c == nil {
		l.c = l.vec.WithLabelValues(l.partition, l.outcome)
	}
	return l.c
}
