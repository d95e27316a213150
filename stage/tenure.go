package stage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/handover"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// groupOwner is one partition's ownership in a scale-out group: the
// partition's tenure in this instance (nil while it does not own the
// partition), and the last pins it lost, whose messages are left to the
// new owner.
type groupOwner struct {
	w        *worker
	group    *scaleOut
	tenure   *tenure
	lostPins []string
}

// Own implements ownership: it takes the partition's busy token (a
// planned release waits for the batch), gives the batch back when the
// instance stops, and otherwise makes sure this instance owns the
// partition (own).
func (o *groupOwner) Own(ctx context.Context, batch []item) (func(), bool) {
	busy := &o.group.busy[o.w.p.Index()]
	busy.Lock()
	if o.group.stopping() {
		giveBack(batch) // the instance stops: the next owner gets it at once
		return busy.Unlock, false
	}
	return busy.Unlock, o.own(ctx, batch)
}

// Annotate implements ownership: the output is the partition's
// changelog, so the subject names the partition and the headers carry the
// record and what it adds to a total, for a new owner to restore.
func (o *groupOwner) Annotate(m *nats.Msg, it *item, now time.Time) {
	m.Subject = handover.PartitionSubject(o.group.prefix, o.w.p.Index(), it.inputSubject())
	handover.Annotate(m.Header, now, it.fp)
	if it.tot.Group != "" {
		handover.AnnotateTotal(m.Header, it.tot.Group, it.tot.Bucket, it.tot.Value)
	}
}

// Fence implements ownership: the tenure's fence in the output stream.
func (o *groupOwner) Fence() *forward.Fence {
	if o.tenure == nil {
		return nil
	}
	return &o.tenure.fence
}

// Lost implements ownership: the tenure ends (fenced).
func (o *groupOwner) Lost(ctx context.Context, err error) bool {
	if o.tenure == nil {
		return false
	}
	o.fenced(ctx, err)
	return true
}

// Claim implements ownership: each claim's first-seen time is now, as the
// forwarded record says, and the claims commit with the partition's
// cursor: the highest output sequence of the batch, up to which the
// partition's changelog is in the store (this instance alone has written
// it since its fence, batch after batch).
func (o *groupOwner) Claim(p *state.Partition, claims []state.Claim, res []forward.Result, now time.Time) ([]state.ClaimResult, error) {
	for i := range claims {
		claims[i].FirstSeen = now
	}
	if o.tenure == nil {
		return p.Claim(claims)
	}
	var cursor uint64
	for _, r := range res {
		cursor = max(cursor, r.Seq)
	}
	return p.ClaimWithCursor(claims, cursor)
}

// FenceDeadLetter implements ownership: while the partition is owned, dl
// carries the tenure's dead-letter fence, so that it is stored only while
// no other instance has taken the partition since.
func (o *groupOwner) FenceDeadLetter(dl deadLetter) deadLetter {
	if t := o.tenure; t != nil && t.dlFence.Subject != "" {
		f := t.dlFence
		dl.fence, dl.p, dl.pin = &f, o.w.p.Index(), t.pin
	}
	return dl
}

// tenure is one partition owned by this instance: the fence its batches
// expect, and the pins the server delivered its messages under meanwhile.
// The fence, not the pin, is what makes the tenure: a tenure outlives a
// new pin of this same instance (the server re-pins a client whose pin's
// TTL passed), since another owner in between would have moved the fence
// and the next batch would be refused.
type tenure struct {
	pin   string          // the newest pin seen in the tenure
	pins  map[string]bool // every pin seen in the tenure
	fence forward.Fence
	// written is when the fence was last written (at most), refresh how
	// often it is written again (refreshFence).
	written time.Time
	refresh time.Duration
	// dlFence is the partition's fence in the dead-letter stream, taken
	// after the output's, and dlWritten when it was last written: every
	// dead letter the tenure decides expects it (fenceDeadLetter).
	dlFence   forward.Fence
	dlWritten time.Time
}

// maxLostPins bounds how many lost pins a worker remembers: a message
// still arriving under one is left for the partition's new owner.
const maxLostPins = 16

// own makes sure the worker owns its partition, taking the fence and
// restoring the partition when it does not. It returns false when the
// batch must be left unacked: it came under a pin of a tenure this
// instance lost while it owns none, or the takeover did not finish.
func (o *groupOwner) own(ctx context.Context, batch []item) bool {
	g := o.group
	pin := batch[len(batch)-1].pin
	if lost := g.takeLost(o.w.p.Index()); lost != "" {
		// Released for balance, or the pin moved: what still comes under
		// the tenure's pins is the next owner's.
		if o.tenure != nil && o.tenure.pins[lost] {
			o.endTenure(true)
		} else {
			o.rememberLost(lost)
		}
	}
	if o.tenure != nil {
		if !o.tenure.pins[pin] {
			o.tenure.pins[pin] = true
			o.tenure.pin = pin
			g.setOwned(o.w.p.Index(), pin)
		}
		return o.refreshFence(ctx)
	}
	if slices.Contains(o.lostPins, pin) && !o.recheckLost(ctx, pin) {
		g.metrics.stale.WithLabelValues(o.w.label).Add(float64(len(batch)))
		giveBack(batch)
		return false
	}
	t, err := o.takeOver(ctx, batch, pin)
	if err != nil {
		if r := refusedReason(err); r != "" {
			g.metrics.refused.WithLabelValues(o.w.label, r).Inc()
			o.w.s.logs.Error("partition_refused", "scale-out: partition refused; its batch stays unacked and comes back", "partition", o.w.label, "err", err)
		} else if ctx.Err() == nil {
			o.w.s.logs.Warn("take_over_failed", "scale-out: taking the partition failed; its batch stays unacked and comes back", "partition", o.w.label, "err", err)
		}
		return false
	}
	o.tenure = t
	g.setOwned(o.w.p.Index(), pin)
	return true
}

// rememberLost adds pin to the pins whose messages are left unacked for
// the partition's new owner, forgetting the oldest past maxLostPins.
func (o *groupOwner) rememberLost(pin string) {
	if slices.Contains(o.lostPins, pin) {
		return
	}
	o.lostPins = append(o.lostPins, pin)
	if len(o.lostPins) > maxLostPins {
		o.lostPins = slices.Delete(o.lostPins, 0, len(o.lostPins)-maxLostPins)
	}
}

// takeOver takes the partition's fence and restores the partition from
// the output stream up to it: from the local cursor when this instance's
// store has one, else from now minus the output's retention.
func (o *groupOwner) takeOver(ctx context.Context, batch []item, pin string) (*tenure, error) {
	s, g := o.w.s, o.group
	p := o.w.p.Index()
	start := time.Now()
	fenceSubj := handover.FenceSubject(g.prefix, p)
	// The output stream may have been edited, or purged, since the start: a
	// changelog that no longer keeps what a restore reads would restore the
	// partition short, so the partition is not taken (its batch comes back,
	// and the check runs again).
	out, err := g.outputState(ctx, s.js)
	if err != nil {
		return nil, err
	}
	cursor, err := o.w.p.Cursor()
	if err != nil {
		return nil, fmt.Errorf("read the partition's cursor: %w", err)
	}
	now := s.clock.Now()
	from, since := g.restoreStart(cursor, out.State.LastSeq, now)
	if err := g.checkChangelog(out.Config); err != nil {
		return nil, err
	}
	if err := g.checkReach(out.State, p, from, now); err != nil {
		return nil, err
	}
	f, err := handover.Take(ctx, s.js, g.outStream, fenceSubj, g.instance)
	if err != nil {
		return nil, err
	}
	// The dead letters' fence, after the output's: an instance that took
	// this one has taken the output's first.
	dlFenceSubj := handover.FenceSubject(g.dlSubject, p)
	dlWritten := time.Now()
	dlf, err := handover.Take(ctx, s.js, g.dlStream, dlFenceSubj, g.instance)
	if err != nil {
		return nil, fmt.Errorf("take the dead-letter fence: %w", err)
	}
	restoring := g.metrics.restoring.WithLabelValues(o.w.label)
	restoring.Set(1)
	defer restoring.Set(0)
	s.status.setRestoring(p, 0, true)
	defer s.status.setRestoring(p, 0, false)
	r, err := o.restore(ctx, batch, out, cursor, from, since, f)
	if err != nil {
		return nil, err
	}
	took := time.Since(start)
	g.metrics.takeovers.WithLabelValues(o.w.label).Inc()
	g.metrics.restoreDur.WithLabelValues(o.w.label).Set(took.Seconds())
	s.log.Info("scale-out: partition taken", "partition", p, "path", r.path, "fence", f, "cursor", r.cursor, "from_sequence", r.from,
		"from_snapshot", r.loaded, "restored", r.total, "took", took.Round(time.Millisecond))
	s.recordHandOver(ctx, p, handover.HandOver{Instance: g.instance, At: start.UTC(), Fence: f, Path: r.path,
		Records: r.loaded + r.total, RestoreSeconds: took.Seconds()})
	return &tenure{pin: pin, pins: map[string]bool{pin: true}, fence: forward.Fence{Subject: fenceSubj, Seq: f},
		written: start, refresh: fenceRefresh(out.Config.MaxAge),
		dlFence: forward.Fence{Subject: dlFenceSubj, Seq: dlf}, dlWritten: dlWritten}, nil
}

// restoreRun is what a takeover's restore did: its path (restoreSnapshot,
// restoreLocal or restoreFull), the output sequence the changelog was
// read from, the cursor it started at (the snapshot's when it loaded one),
// and the records the snapshot loaded and the changelog restored.
type restoreRun struct {
	path          string
	from, cursor  uint64
	loaded, total int
}

// restore restores the partition up to f, its new fence in the output
// stream: from its newest snapshot when that is usable (snapshots.load),
// then the changelog from from (or from since, with from 0); cursor is the
// local store's. out is the output stream as read before the fence was
// taken. It keeps the batch alive meanwhile and reports the records
// restored in the status and the metrics.
func (o *groupOwner) restore(ctx context.Context, batch []item, out *jetstream.StreamInfo, cursor, from uint64, since time.Time, f uint64) (restoreRun, error) {
	s, g := o.w.s, o.group
	p := o.w.p.Index()
	r := restoreRun{path: restoreFull, from: from, cursor: cursor}
	if from > 0 {
		r.path = restoreLocal
	}
	if g.snaps.load {
		seq, n, err := o.w.loadSnapshot(ctx, out, r.cursor, batch)
		switch {
		case err == nil:
			r.path, r.from, since, r.cursor, r.loaded = restoreSnapshot, seq+1, time.Time{}, seq, n
		case !errors.Is(err, errSnapshotUnusable):
			return r, err
		default:
			level := slog.LevelWarn
			if errors.Is(err, jetstream.ErrObjectNotFound) || errors.Is(err, errSnapshotBehind) {
				level = slog.LevelInfo
			}
			s.log.Log(ctx, level, "scale-out: restoring the partition without its snapshot", "partition", p, "path", r.path, "reason", err)
		}
	}
	g.snaps.metrics.paths.WithLabelValues(r.path).Inc()
	recs := make([]state.Restored, 0, restoreChunk)
	flush := func(upTo uint64) error {
		if err := o.w.p.Restore(recs, upTo); err != nil {
			return err
		}
		r.total += len(recs)
		g.metrics.restored.WithLabelValues(o.w.label).Add(float64(len(recs)))
		s.status.setRestoring(p, r.total, true)
		recs = recs[:0]
		o.w.keepAlive(batch)
		return nil
	}
	_, err := handover.Restore(ctx, s.js, g.outStream, handover.PartitionFilter(g.prefix, p), handover.FenceSubject(g.prefix, p), r.from, since, f,
		func(rec handover.Record, seq uint64) error {
			recs = append(recs, state.Restored{Key: rec.Key, FirstSeen: rec.FirstSeen, Fingerprint: rec.Fingerprint,
				Total: state.Contribution{Group: rec.Group, Bucket: rec.Bucket, Value: rec.Value}, Seq: seq})
			if len(recs) == restoreChunk {
				return flush(seq)
			}
			return nil
		})
	if err != nil {
		return r, err
	}
	if r.cursor != f {
		if err := flush(f); err != nil { // the rest, and the cursor at the fence
			return r, err
		}
	}
	return r, nil
}

// fenced handles an output batch the server refused because the
// partition's fence moved. The batch stays unacked and the tenure ends.
// When the server still pins this instance under one of the tenure's pins
// (another instance took the fence without the pin, or a retried write
// moved it), the next batch takes the fence again; otherwise the tenure's
// pins are lost, and what was delivered under them is left for the new
// owner.
func (o *groupOwner) fenced(ctx context.Context, err error) {
	s, g := o.w.s, o.group
	g.metrics.refusals.WithLabelValues(o.w.label).Inc()
	now, ierr := s.pinOf(ctx, o.w.p.Index())
	still := ierr == nil && o.tenure.pins[now]
	level := slog.LevelWarn
	if ierr != nil {
		level = slog.LevelError
	}
	s.logs.Log(ctx, level, "partition_lost", "scale-out: partition lost: another instance took its fence; the batch is left unacked",
		"partition", o.w.label, "still_pinned", still, "pin_check_err", ierr, "err", err)
	o.endTenure(!still)
}

// endTenure ends the worker's tenure; with lost, the tenure's pins are
// remembered as lost.
func (o *groupOwner) endTenure(lost bool) {
	g := o.group
	if lost {
		for pin := range o.tenure.pins {
			o.rememberLost(pin)
		}
	}
	o.tenure = nil
	g.mu.Lock()
	delete(g.owned, o.w.p.Index())
	g.metrics.owned.Set(float64(len(g.owned)))
	g.mu.Unlock()
}
