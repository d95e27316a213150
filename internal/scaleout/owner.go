package scaleout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/handover"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Verdict is what Own decides of a batch.
type Verdict int

const (
	// Judge: this instance owns the partition, and the batch is judged.
	Judge Verdict = iota
	// GiveBack: the batch is not this instance's to judge (the instance
	// stops, or the batch came under a pin it lost): every message of it
	// is given back (nak) at once, for the partition's owner.
	GiveBack
	// Leave: the batch is left unacked (a takeover did not finish, or a
	// fence could not be refreshed); it comes back after ack_wait.
	Leave
)

// Owner is one partition's ownership in a scale-out group: the
// partition's tenure in this instance (nil while it does not own the
// partition), and the last pins it lost, whose messages are left to the
// new owner. An Owner belongs to the partition's worker and is not safe
// for concurrent use.
type Owner struct {
	g        *Group
	p        *state.Partition
	label    string
	tenure   *tenure
	lostPins []string
}

// Owner returns the ownership of partition p, for p's worker.
func (g *Group) Owner(p *state.Partition) *Owner {
	return &Owner{g: g, p: p, label: strconv.Itoa(p.Index())}
}

// Own is called before a batch of n messages is judged; pin is the pin
// its last message was delivered under (HeaderPinID), or LocalPin when
// the route step handed it over (Run's local), and keepAlive tells
// the server the batch is in progress, which Own does while a takeover
// restores the partition. Own takes the partition's busy token (a planned
// release waits for the batch), gives the batch back when the instance
// stops, and otherwise makes sure this instance owns the partition (own).
// release is called once the batch is finished, whatever the verdict.
func (o *Owner) Own(ctx context.Context, pin string, n int, keepAlive func()) (release func(), v Verdict) {
	busy := &o.g.busy[o.p.Index()]
	busy.Lock()
	if o.g.stopping() {
		return busy.Unlock, GiveBack // the instance stops: the next owner gets it at once
	}
	return busy.Unlock, o.own(ctx, pin, n, keepAlive)
}

// Annotate makes m, a forwarded copy, what the partition's changelog
// needs: the subject names the partition (subject is the input's), and
// the headers carry the record (now, fp, the body's fingerprint) and tot,
// what it adds to a total, for a new owner to restore.
func (o *Owner) Annotate(m *nats.Msg, subject string, fp uint64, tot state.Contribution, now time.Time) {
	m.Subject = handover.PartitionSubject(o.g.prefix, o.p.Index(), subject)
	handover.Annotate(m.Header, now, fp)
	if tot.Group != "" {
		handover.AnnotateTotal(m.Header, tot.Group, tot.Bucket, tot.Value)
	}
}

// RefreshRecord returns the key-state record of a repeat that moves the
// window of key, whose record is rec, to at: published with the batch's
// forwards, expecting the tenure's fence, so that a new owner restores
// the moved window (handover.RefreshMsg).
func (o *Owner) RefreshRecord(key []byte, rec state.Record, at time.Time) *nats.Msg {
	return handover.RefreshMsg(handover.KeyStateSubject(o.g.prefix, o.p.Index()), keyRecord(key, rec), at)
}

// keyRecord is the changelog record a key-state record carries of key,
// whose state record is rec: what a restore needs to store the key when it
// holds no record of it.
func keyRecord(key []byte, rec state.Record) handover.Record {
	return handover.Record{Key: key, FirstSeen: rec.FirstSeen, Fingerprint: rec.Fingerprint, Version: rec.Version,
		HasVersion: rec.HasVersion, OutputSeq: rec.OutputSeq}
}

// Fence is the fence the batch's output publish expects: the tenure's fence in the output stream.
func (o *Owner) Fence() *forward.Fence {
	if o.tenure == nil {
		return nil
	}
	return &o.tenure.fence
}

// Lost handles a publish refused because the partition's fence moved,
// and reports whether it was: the tenure ends (fenced). With no tenure,
// err is no fence this owner holds.
func (o *Owner) Lost(ctx context.Context, err error) bool {
	if o.tenure == nil {
		return false
	}
	o.fenced(ctx, err)
	return true
}

// Claim commits claims, the batch's forwarded keys, in p with first-seen
// time now, and with them the partition's cursor: the highest output
// sequence the batch stored, not counting duplicates, whose record may be
// another owner's (docs/scale-out.md, "Code notes").
func (o *Owner) Claim(p *state.Partition, claims []state.Claim, res []forward.Result, now time.Time) ([]state.ClaimResult, error) {
	for i := range claims {
		claims[i].FirstSeen = now
	}
	if o.tenure == nil {
		return p.Claim(claims)
	}
	return p.ClaimWithCursor(claims, forward.StoredUpTo(res)) // 0: the cursor stays as it was
}

// DeadLetterFence returns the fence a dead letter decided now expects,
// and the pin of the tenure it is decided in: while the partition is
// owned, the tenure's dead-letter fence, so that the dead letter is
// stored only while no other instance has taken the partition since; nil
// otherwise.
func (o *Owner) DeadLetterFence() (*forward.Fence, string) {
	if t := o.tenure; t != nil && t.dlFence.Subject != "" {
		f := t.dlFence
		return &f, t.pin
	}
	return nil, ""
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
// restoring the partition when it does not. A batch that came under a pin
// of a tenure this instance lost, while it owns none, is given back; one
// whose takeover or fence refresh did not finish is left unacked.
func (o *Owner) own(ctx context.Context, pin string, n int, keepAlive func()) Verdict {
	g := o.g
	if lost := g.takeLost(o.p.Index()); lost != "" {
		// Released for balance, or the pin moved: what still comes under
		// the tenure's pins is the next owner's.
		if o.tenure != nil && o.tenure.pins[lost] {
			o.endTenure(true)
		} else {
			o.rememberLost(lost)
		}
	}
	if pin == LocalPin {
		// Handed over by the route step (Run's local), under no pin: only
		// a tenure held already judges it; a takeover comes from the
		// member's deliveries.
		if o.tenure == nil {
			return GiveBack
		}
		if !o.refreshFence(ctx) {
			return Leave
		}
		return Judge
	}
	if o.tenure != nil {
		if !o.tenure.pins[pin] {
			o.tenure.pins[pin] = true
			o.tenure.pin = pin
			g.setOwned(o.p.Index(), pin)
		}
		if !o.refreshFence(ctx) {
			return Leave
		}
		return Judge
	}
	if slices.Contains(o.lostPins, pin) && !o.recheckLost(ctx, pin) {
		g.metrics.stale.WithLabelValues(o.label).Add(float64(n))
		return GiveBack
	}
	t, err := o.takeOver(ctx, keepAlive, pin)
	if err != nil {
		if r := refusedReason(err); r != "" {
			g.metrics.refused.WithLabelValues(o.label, r).Inc()
			o.g.logs.Error("partition_refused", "scale-out: partition refused; its batch stays unacked and comes back", "partition", o.label, "err", err)
		} else if ctx.Err() == nil {
			o.g.logs.Warn("take_over_failed", "scale-out: taking the partition failed; its batch stays unacked and comes back", "partition", o.label, "err", err)
		}
		return Leave
	}
	o.tenure = t
	g.setOwned(o.p.Index(), pin)
	return Judge
}

// rememberLost adds pin to the pins whose messages are left unacked for
// the partition's new owner, forgetting the oldest past maxLostPins.
func (o *Owner) rememberLost(pin string) {
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
func (o *Owner) takeOver(ctx context.Context, keepAlive func(), pin string) (*tenure, error) {
	g := o.g
	p := o.p.Index()
	start := time.Now()
	fenceSubj := handover.FenceSubject(g.prefix, p)
	// The output stream may have been edited, or purged, since the start: a
	// changelog that no longer keeps what a restore reads would restore the
	// partition short, so the partition is not taken (its batch comes back,
	// and the check runs again).
	out, err := handover.StreamState(ctx, g.js, g.outStream)
	if err != nil {
		return nil, fmt.Errorf("read the output stream's configuration: %w", err)
	}
	cursor, err := o.p.Cursor()
	if err != nil {
		return nil, fmt.Errorf("read the partition's cursor: %w", err)
	}
	now := g.clock.Now()
	from, since := g.restoreStart(cursor, out.State.LastSeq, now)
	if err := g.checkChangelog(out.Config); err != nil {
		return nil, err
	}
	if err := g.checkReach(out.State, p, from, now); err != nil {
		return nil, err
	}
	f, err := handover.Take(ctx, g.js, g.outStream, fenceSubj, g.instance)
	if err != nil {
		return nil, err
	}
	// The dead letters' fence, after the output's: an instance that took
	// this one has taken the output's first.
	dlFenceSubj := handover.FenceSubject(g.dlSubject, p)
	dlWritten := time.Now()
	dlf, err := handover.Take(ctx, g.js, g.dlStream, dlFenceSubj, g.instance)
	if err != nil {
		return nil, fmt.Errorf("take the dead-letter fence: %w", err)
	}
	restoring := g.metrics.restoring.WithLabelValues(o.label)
	restoring.Set(1)
	defer restoring.Set(0)
	g.restoring(p, 0, true)
	defer g.restoring(p, 0, false)
	r, err := o.restore(ctx, keepAlive, out, cursor, from, since, f)
	if err != nil {
		return nil, err
	}
	took := time.Since(start)
	g.metrics.takeovers.WithLabelValues(o.label).Inc()
	g.metrics.restoreDur.WithLabelValues(r.path).Observe(took.Seconds())
	g.log.Info("scale-out: partition taken", "partition", p, "path", r.path, "fence", f, "cursor", r.cursor, "from_sequence", r.from,
		"from_snapshot", r.loaded, "restored", r.total, "readers_replaced", r.reopens, "took", took.Round(time.Millisecond))
	g.recordHandOver(ctx, p, handover.HandOver{Instance: g.instance, At: start.UTC(), Fence: f, Path: r.path,
		Records: r.loaded + r.total, RestoreSeconds: took.Seconds()})
	return &tenure{pin: pin, pins: map[string]bool{pin: true}, fence: forward.Fence{Subject: fenceSubj, Seq: f},
		written: start, refresh: fenceRefresh(out.Config.MaxAge),
		dlFence: forward.Fence{Subject: dlFenceSubj, Seq: dlf}, dlWritten: dlWritten}, nil
}

// restoreRun is what a takeover's restore did: its path (restoreSnapshot,
// restoreLocal or restoreFull), the output sequence the changelog was
// read from, the cursor it started at (the snapshot's when it loaded one),
// the records the snapshot loaded and the changelog restored, and the
// changelog readers it replaced (handover.RestoreStats).
type restoreRun struct {
	path          string
	from, cursor  uint64
	loaded, total int
	reopens       int // changelog readers replaced after a silent spell
}

// restore restores the partition up to f, its new fence in the output
// stream: from its newest snapshot when that is usable (snapshots.load),
// then the changelog from from (or from since, with from 0); cursor is the
// local store's. out is the output stream as read before the fence was
// taken. It keeps the batch alive meanwhile and reports the records
// restored in the status and the metrics.
func (o *Owner) restore(ctx context.Context, keepAlive func(), out *jetstream.StreamInfo, cursor, from uint64, since time.Time, f uint64) (restoreRun, error) {
	g := o.g
	p := o.p.Index()
	r := restoreRun{path: restoreFull, from: from, cursor: cursor}
	if from > 0 {
		r.path = restoreLocal
	}
	if g.snaps.load {
		seq, n, err := o.loadSnapshot(ctx, out, r.cursor, keepAlive)
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
			g.log.Log(ctx, level, "scale-out: restoring the partition without its snapshot", "partition", p, "path", r.path, "reason", err)
		}
	}
	g.snaps.metrics.paths.WithLabelValues(r.path).Inc()
	recs := make([]state.Restored, 0, restoreChunk)
	flush := func(upTo uint64) error {
		if err := o.p.Restore(recs, upTo); err != nil {
			return err
		}
		r.total += len(recs)
		g.metrics.restored.WithLabelValues(o.label).Add(float64(len(recs)))
		g.restoring(p, r.total, true)
		recs = recs[:0]
		keepAlive()
		return nil
	}
	st, err := handover.Restore(ctx, g.js, g.outStream, handover.PartitionFilter(g.prefix, p), handover.FenceSubject(g.prefix, p),
		handover.KeyStateSubject(g.prefix, p), r.from, since, f,
		func(rec handover.Record, seq uint64) error {
			recs = append(recs, restored(rec, seq))
			if len(recs) == restoreChunk {
				return flush(seq)
			}
			return nil
		})
	r.reopens = st.Reopens
	g.metrics.reopens.WithLabelValues(o.label).Add(float64(st.Reopens))
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

// restored is the state record of rec, read back from the changelog at
// sequence seq: a forward's record, a refresh's (its record with the
// window start it moved to) or a forget's (its record marked forgotten).
func restored(rec handover.Record, seq uint64) state.Restored {
	return state.Restored{Key: rec.Key, FirstSeen: rec.FirstSeen, Fingerprint: rec.Fingerprint,
		Total: state.Contribution{Group: rec.Group, Bucket: rec.Bucket, Value: rec.Value}, Seq: seq,
		Refreshed: rec.WindowStart, Version: rec.Version, HasVersion: rec.HasVersion, Forgotten: rec.Forgotten,
		OutputSeq: rec.OutputSeq}
}

// fenced handles an output batch the server refused because the
// partition's fence moved. The batch stays unacked and the tenure ends.
// When the server still pins this instance under one of the tenure's pins
// (another instance took the fence without the pin, or a retried write
// moved it), the next batch takes the fence again; otherwise the tenure's
// pins are lost, and what was delivered under them is left for the new
// owner.
func (o *Owner) fenced(ctx context.Context, err error) {
	g := o.g
	g.metrics.refusals.WithLabelValues(o.label).Inc()
	now, ierr := g.pinOf(ctx, o.p.Index())
	still := ierr == nil && o.tenure.pins[now]
	level := slog.LevelWarn
	if ierr != nil {
		level = slog.LevelError
	}
	g.logs.Log(ctx, level, "partition_lost", "scale-out: partition lost: another instance took its fence; the batch is left unacked",
		"partition", o.label, "still_pinned", still, "pin_check_err", ierr, "err", err)
	o.endTenure(!still)
}

// endTenure ends the worker's tenure; with lost, the tenure's pins are
// remembered as lost.
func (o *Owner) endTenure(lost bool) {
	g := o.g
	if lost {
		for pin := range o.tenure.pins {
			o.rememberLost(pin)
		}
	}
	o.tenure = nil
	g.mu.Lock()
	delete(g.owned, o.p.Index())
	g.metrics.owned.Set(float64(len(g.owned)))
	g.mu.Unlock()
}
