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

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/ownership"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Owner is one partition's ownership in a scale-out group: the
// partition's tenure in this instance (nil while it does not own the
// partition), and the last pins it lost, whose messages are left to the
// new owner. It is the group's ownership.Owner. An Owner belongs to the
// partition's worker and is not safe for concurrent use.
type Owner struct {
	g        *Group
	p        *state.Partition
	label    string
	tenure   *tenure
	lostPins []string
}

// Owner implements ownership.Owner.
var _ ownership.Owner = (*Owner)(nil)

// Owner returns the ownership of partition p, for p's worker.
func (g *Group) Owner(p *state.Partition) *Owner {
	return &Owner{g: g, p: p, label: strconv.Itoa(p.Index())}
}

// Own is called before a batch of n messages is judged; pin is the pin
// its last message was delivered under (HeaderPinID), or LocalPin when
// the route step handed it over (Run's local), and keepAlive tells
// the server the batch is in progress, which Own does while a takeover
// restores the partition. Own takes the partition's busy token (a planned
// release waits for the batch; a warm standby's tail step in flight is
// cancelled, preemptTail), gives the batch back when the instance
// stops, and otherwise makes sure this instance owns the partition (own).
// release is called once the batch is finished, whatever the verdict.
func (o *Owner) Own(ctx context.Context, pin string, n int, keepAlive func()) (release func(), v ownership.Verdict) {
	unlock := o.g.holdBusy(o.p.Index())
	if o.g.stopping() {
		return unlock, ownership.GiveBack // the instance stops: the next owner gets it at once
	}
	return unlock, o.own(ctx, pin, n, keepAlive)
}

// Annotate makes m, a forwarded copy, what the partition's changelog
// needs: the subject names the partition (subject is the input's), and
// the headers carry the record (at, the copy's input time, and fp, the
// body's fingerprint) and tot, what it adds to a total, for a new owner to
// restore.
func (o *Owner) Annotate(m *nats.Msg, subject string, fp uint64, tot state.Contribution, at time.Time) {
	m.Subject = changelog.PartitionSubject(o.g.prefix, o.p.Index(), subject)
	changelog.Annotate(m.Header, at, fp)
	if tot.Group != "" {
		changelog.AnnotateTotal(m.Header, tot.Group, tot.Bucket, tot.Value)
	}
}

// RefreshRecord returns the key-state record of a repeat that moves the
// window of key, whose record is rec, to at: published with the batch's
// forwards, expecting the tenure's fence, so that a new owner restores
// the moved window (changelog.RefreshMsg).
func (o *Owner) RefreshRecord(key []byte, rec state.Record, at time.Time) *nats.Msg {
	return changelog.RefreshMsg(changelog.KeyStateSubject(o.g.prefix, o.p.Index()), changelog.KeyRecord(key, rec), at)
}

// Publishing implements ownership.Owner: nothing to do, since a group's
// partitions restore from their cursors in the changelog.
func (*Owner) Publishing() {}

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

// Claim commits claims, the batch's forwarded keys (each at its input
// time, which its forward carries), in p, and with them the partition's
// cursor: the highest output sequence the batch stored, not counting
// duplicates, whose record may be another owner's (docs/scale-out.md,
// "Code notes").
func (o *Owner) Claim(p *state.Partition, claims []state.Claim, res []forward.Result) ([]state.ClaimResult, error) {
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
func (o *Owner) own(ctx context.Context, pin string, n int, keepAlive func()) ownership.Verdict {
	g := o.g
	o.catchUp()
	if pin == LocalPin {
		// Handed over by the route step (Run's local), under no pin: only
		// a tenure held already judges it; a takeover comes from the
		// member's deliveries.
		if o.tenure == nil {
			return ownership.GiveBack
		}
		if !o.refreshFence(ctx) {
			return ownership.Leave
		}
		return ownership.Judge
	}
	if o.tenure != nil {
		if !o.tenure.pins[pin] {
			// A new pin of the tenure (the first of a partition taken
			// before any message, or the server pinned this instance
			// again): the fence is written again now, after the pin,
			// so that status sees the pin's owner confirmed.
			o.tenure.written = time.Time{}
			o.tenure.pins[pin] = true
			o.tenure.pin = pin
			g.setOwned(o.p.Index(), pin)
		}
		if !o.refreshFence(ctx) {
			return ownership.Leave
		}
		return ownership.Judge
	}
	if slices.Contains(o.lostPins, pin) && !o.recheckLost(ctx, pin) {
		g.metrics.stale.WithLabelValues(o.label).Add(float64(n))
		return ownership.GiveBack
	}
	defer g.startTake(o.p.Index())() // until the partition is owned, or the take failed
	t, err := o.takeOver(ctx, keepAlive, pin)
	if err != nil {
		if r := refusedReason(err); r != "" {
			g.metrics.refused.WithLabelValues(o.label, r).Inc()
			o.g.logs.Error("partition_refused", "scale-out: partition refused; its batch stays unacked and comes back", "partition", o.label, "err", err)
		} else if ctx.Err() == nil {
			o.g.logs.Warn("take_over_failed", "scale-out: taking the partition failed; its batch stays unacked and comes back", "partition", o.label, "err", err)
		}
		return ownership.Leave
	}
	o.tenure = t
	g.setOwned(o.p.Index(), pin)
	return ownership.Judge
}

// catchUp brings the tenure up to what the group did to the partition
// since the worker's last batch: a release for balance, or a pin that
// moved, ends it (takeLost); a takeover before any message (pretake)
// starts one, newer than any tenure held.
func (o *Owner) catchUp() {
	g := o.g
	if lost := g.takeLost(o.p.Index()); lost != "" {
		// What still comes under the tenure's pins is the next owner's.
		if o.tenure != nil && o.tenure.pins[lost] {
			o.endTenure(true)
		} else {
			o.rememberLost(lost)
		}
	}
	if t := g.takePre(o.p.Index()); t != nil {
		o.tenure = t
	}
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
	fenceSubj := changelog.FenceSubject(g.prefix, p)
	// The output stream may have been edited, or purged, since the start: a
	// changelog that no longer keeps what a restore reads would restore the
	// partition short, so the partition is not taken (its batch comes back,
	// and the check runs again).
	out, err := changelog.StreamState(ctx, g.js, g.outStream)
	if err != nil {
		return nil, fmt.Errorf("read the output stream's configuration: %w", err)
	}
	// A local store ahead of the output (a server that lost forwards it
	// had acknowledged) drops what the output lost first.
	a, ahead, err := changelog.CheckAhead(ctx, g.js, g.outStream, o.p, out.State.LastSeq)
	if err != nil {
		return nil, fmt.Errorf("check the partition's store against the output stream: %w", err)
	}
	cursor := a.Cursor
	if ahead {
		cursor = a.Kept
		if g.ahead != nil {
			g.ahead(a)
		}
	}
	now := serverTime(out, g.clock)
	from, since := g.restoreStart(cursor, out.State.LastSeq, now)
	if err := g.checkChangelog(out.Config); err != nil {
		return nil, err
	}
	if err := g.checkReach(out.State, p, from, now); err != nil {
		return nil, err
	}
	f, err := changelog.Take(ctx, g.js, g.outStream, fenceSubj, g.instance)
	if err != nil {
		return nil, err
	}
	// The dead letters' fence, after the output's: an instance that took
	// this one has taken the output's first.
	dlFenceSubj := changelog.FenceSubject(g.dlSubject, p)
	dlWritten := time.Now()
	dlf, err := changelog.Take(ctx, g.js, g.dlStream, dlFenceSubj, g.instance)
	if err != nil {
		return nil, fmt.Errorf("take the dead-letter fence: %w", err)
	}
	fenced := time.Since(start) // the stream's state, the checks and both fences
	restoring := g.metrics.restoring.WithLabelValues(o.label)
	restoring.Set(1)
	defer restoring.Set(0)
	g.restoring(p, 0, true)
	defer g.restoring(p, 0, false)
	r, err := o.restoreUpTo(ctx, keepAlive, out, cursor, from, since, f)
	if err != nil {
		return nil, err
	}
	took := time.Since(start)
	g.metrics.takeovers.WithLabelValues(o.label).Inc()
	g.metrics.restoreDur.WithLabelValues(r.path).Observe(took.Seconds())
	g.log.Info("scale-out: partition taken", "partition", p, "path", r.path, "fence", f, "cursor", r.cursor, "from_sequence", r.from,
		"from_snapshot", r.loaded, "restored", r.total, "readers_replaced", r.reopens, "took", took.Round(time.Millisecond),
		"fenced_after", fenced.Round(time.Millisecond))
	g.recordHandOver(ctx, p, changelog.HandOver{Instance: g.instance, At: start.UTC(), Fence: f, Path: r.path,
		Records: r.loaded + r.total, RestoreSeconds: took.Seconds()})
	return &tenure{pin: pin, pins: map[string]bool{pin: true}, fence: forward.Fence{Subject: fenceSubj, Seq: f},
		written: start, refresh: fenceRefresh(out.Config.MaxAge),
		dlFence: forward.Fence{Subject: dlFenceSubj, Seq: dlf}, dlWritten: dlWritten}, nil
}

// restoreRun is what a takeover's restore did: its path (restoreSnapshot,
// restoreLocal or restoreFull), the output sequence the changelog was
// read from, the cursor it started at (the snapshot's when it loaded one),
// the records the snapshot loaded and the changelog restored, and the
// changelog readers it replaced (changelog.RestoreStats).
type restoreRun struct {
	path          string
	from, cursor  uint64
	loaded, total int
	reopens       int // changelog readers replaced after a silent spell
}

// restoreUpTo restores the partition up to f, its new fence (restore),
// unless the output's leader holds none of the partition's forwards and
// key-state records: then there is nothing to restore, and the takeover
// of an empty partition costs the fence and one request per subject
// instead of a snapshot lookup and a reader (path restoreEmpty). A
// partition whose records this instance holds (cursor > 0: a warm
// standby's, or its own from an earlier tenure) is restored without the
// question, which costs the server a pass over the partition's subjects
// (30-90 ms at a million).
func (o *Owner) restoreUpTo(ctx context.Context, keepAlive func(), out *jetstream.StreamInfo, cursor, from uint64, since time.Time, f uint64) (restoreRun, error) {
	g := o.g
	p := o.p.Index()
	if cursor > 0 {
		return o.restore(ctx, keepAlive, out, cursor, from, since, f)
	}
	holds, err := changelog.Holds(ctx, g.js, g.outStream, changelog.PartitionFilter(g.prefix, p), changelog.KeyStateSubject(g.prefix, p))
	if err != nil {
		return restoreRun{}, err
	}
	if !holds {
		g.snaps.metrics.paths.WithLabelValues(restoreEmpty).Inc()
		return restoreRun{path: restoreEmpty, cursor: cursor}, nil
	}
	return o.restore(ctx, keepAlive, out, cursor, from, since, f)
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
	// A snapshot covers at most the output's last sequence, so where that
	// is within preferLocal of the local cursor no snapshot can be loaded
	// (checkSnapshot: errSnapshotBehind), and it is not opened: opening
	// one starts the transfer of the whole object, about a second at 1M
	// keys, which a warm standby's takeover would wait for.
	if g.snaps.load && r.cursor > 0 && r.cursor <= out.State.LastSeq && out.State.LastSeq <= r.cursor+g.preferLocal() {
		g.log.Info("scale-out: restoring the partition without its snapshot", "partition", p, "path", r.path,
			"reason", fmt.Sprintf("not opened: the output's last sequence %d is within %d of the local cursor %d", out.State.LastSeq, g.preferLocal(), r.cursor))
	} else if g.snaps.load {
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
	sp := changelog.Span{Stream: g.outStream, Forwards: []string{changelog.PartitionFilter(g.prefix, p)},
		KeyState: changelog.KeyStateSubject(g.prefix, p), Fence: changelog.FenceSubject(g.prefix, p), From: r.from, Since: since, UpTo: f,
		ReadAllUnder: changelog.ReadAllUnderFor(out.State.NumSubjects)}
	st, err := changelog.Apply(ctx, g.js, sp, []changelog.Target{{P: o.p, Cursor: r.cursor}}, changelog.ApplyOptions{
		Route: func(*changelog.Record, string) int { return 0 },
		Progress: func(_, n int) {
			g.restoring(p, n, true)
		},
		KeepAlive: keepAlive,
	})
	r.total = st.Applied[0]
	g.metrics.restored.WithLabelValues(o.label).Add(float64(r.total))
	r.reopens = st.Reopens
	g.metrics.reopens.WithLabelValues(o.label).Add(float64(st.Reopens))
	return r, err
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
