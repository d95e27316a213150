package scaleout

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Warm standbys (docs/scale-out.md §4.4): for each partition, the next k
// instances after its assigned owner in the partition's rendezvous ranking
// (rankScore) tail its changelog from the output stream into their own
// local store, so that when the owner dies the one that takes the
// partition over finds its local cursor near the output's end: the
// takeover's restore (path local) reads only the tail. A standby only
// reads; the fence decides who writes, as ever.

// standbyEvery is how often a standby tails its standby partitions.
const standbyEvery = 2 * time.Second

// standbySettle is how long the live instances must stay the same before
// an instance stands by for partitions: while a group starts or changes,
// balance moves partitions, and the standbys' reads would only add to the
// servers' load then (and be moved again).
const standbySettle = 5 * time.Second

// standbyStep is the most output sequences one tail step of a partition
// reads (changelog.Apply): the partition's busy token is held for one
// step at most, so that a takeover or a batch never waits on more.
const standbyStep = 50_000

// standbyStepsPerTick bounds the steps one partition's tail takes per
// interval, so that a partition far behind (a new standby of a large one)
// holds up the others' for at most that many.
const standbyStepsPerTick = 20

// standbyLastBound bounds how long a tail step asks for the last
// sequence on a partition's subjects, retries included.
const standbyLastBound = 10 * time.Second

// standbyPreferLocal is how far (in output sequences) a partition's
// snapshot may be ahead of the local cursor for a takeover to restore from
// the local store all the same (path local): a warm standby's cursor lags
// by one tail interval at most, and reading that tail is much cheaper than
// loading a snapshot of the whole partition.
const standbyPreferLocal = standbyStep

// standbysOf returns, for each partition p of want (each partition's
// assigned owner, assign), its k = min(standbys, len(live)-1) warm
// standbys: the instances of live (sorted by name) that rank highest for
// p by rankScore, the ranking the assignment is made from, leaving out p's
// owner. Every instance computes the same answer from the same live set,
// and a change of the live instances moves only the standbys of the
// partitions whose ranking it touches (rendezvous hashing). A partition
// with no assigned owner gets no standby.
func standbysOf(live, want []string, standbys int) [][]string {
	out := make([][]string, len(want))
	k := min(standbys, len(live)-1)
	if k <= 0 {
		return out
	}
	type ranked struct {
		inst  string
		score uint64
	}
	r := make([]ranked, 0, len(live))
	for p, owner := range want {
		if owner == "" {
			continue
		}
		r = r[:0]
		for _, inst := range live {
			if inst != owner {
				r = append(r, ranked{inst, rankScore(p, inst)})
			}
		}
		slices.SortFunc(r, func(a, b ranked) int {
			if c := cmp.Compare(b.score, a.score); c != 0 {
				return c
			}
			return cmp.Compare(a.inst, b.inst)
		})
		sb := make([]string, 0, k)
		for _, x := range r[:min(k, len(r))] {
			sb = append(sb, x.inst)
		}
		out[p] = sb
	}
	return out
}

// setStandbys records the partitions this instance is a warm standby of,
// given each partition's standbys (standbysOf). A partition this instance
// standBy sets the partitions this instance stands by for, given the live
// instances and each partition's assigned owner (want), once the live
// instances have stayed the same for standbySettle (same: how long they
// have); while the group moves partitions, none, so that no tail adds to
// its load.
func (g *Group) standBy(live, want []string, same time.Duration) {
	if same < standbySettle {
		g.setStandbys(nil)
		return
	}
	g.setStandbys(standbysOf(live, want, g.opts.Standbys))
}

// owns is never one.
func (g *Group) setStandbys(of [][]string) {
	mine := map[int]bool{}
	for p, sb := range of {
		if slices.Contains(sb, g.instance) {
			mine[p] = true
		}
	}
	g.mu.Lock()
	g.standby = mine
	g.mu.Unlock()
}

// setSuccessors records the partitions this instance is a successor of:
// their first max(scale_out.standbys, 1) instances after the owner in the
// ranking (standbysOf, on every pass, settled or not), the warm standbys
// when there are any. Only a successor pulls on a partition another
// instance owns (consume) and unpins it when its owner is gone
// (unpinGone): every instance pulling on every member made a group of
// 1,024 partitions and 16 instances join 16,384 members, and ask the
// server about each of them at every balance pass, and let the server
// pin a partition to an instance that does not stand by for it.
func (g *Group) setSuccessors(live, want []string) {
	mine := map[int]bool{}
	for p, sb := range standbysOf(live, want, max(g.opts.Standbys, 1)) {
		if slices.Contains(sb, g.instance) {
			mine[p] = true
		}
	}
	g.mu.Lock()
	g.successor = mine
	g.mu.Unlock()
}

// successorOf reports whether this instance is one of partition p's
// successors (setSuccessors).
func (g *Group) successorOf(p int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.successor[p]
}

// standbyOf reports whether this instance is a warm standby of partition p
// and does not own it.
func (g *Group) standbyOf(p int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, owns := g.owned[p]
	return g.standby[p] && !owns
}

// Keeps reports whether this instance keeps partition p's state up to
// date: it owns p, or is one of its warm standbys. The stage expires the
// records of the partitions it keeps.
func (g *Group) Keeps(p int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, owns := g.owned[p]
	return owns || g.standby[p]
}

// standbyPartitions returns the partitions this instance tails now, in
// order.
func (g *Group) standbyPartitions() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	var ps []int
	for p := range g.standby {
		if _, owns := g.owned[p]; !owns {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}

// runStandbys tails, every standbyEvery until ctx is done, the changelog
// of each partition this instance is a warm standby of into its local
// store (tailStandby), one partition at a time. A partition it stops
// standing by for (it took it, or the live instances changed) is no
// longer tailed; its local store stays as a released partition's does.
func (g *Group) runStandbys(ctx context.Context, store *state.Store) {
	if g.opts.Standbys <= 0 {
		return
	}
	t := time.NewTicker(standbyEvery)
	defer t.Stop()
	tailed := map[int]bool{} // partitions with a cursor gauge
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ps := g.standbyPartitions()
		g.metrics.sbPartitions.Set(float64(len(ps)))
		for p := range tailed {
			if !slices.Contains(ps, p) {
				g.metrics.sbCursor.DeleteLabelValues(strconv.Itoa(p))
				delete(tailed, p)
			}
		}
		for _, p := range ps {
			tailed[p] = true
			g.tailStandby(ctx, store.Partition(p))
		}
	}
}

// tailStandby brings partition sp's local store up to the end of its
// changelog, one tailStep of at most standbyStep sequences at a time (at
// most standbyStepsPerTick of them), while this instance stands by for
// it; a failure is logged (rate limited) and tried again at the next
// interval.
func (g *Group) tailStandby(ctx context.Context, sp *state.Partition) {
	for range standbyStepsPerTick {
		if ctx.Err() != nil {
			return
		}
		more, err := g.tailStep(ctx, sp)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, state.ErrClosed) {
				g.logs.Warn("standby_tail_failed", "scale-out: a warm standby's tail of the changelog failed; tried again shortly", "partition", sp.Index(), "err", err)
			}
			return
		}
		if !more {
			return
		}
	}
}

// tailStep applies to partition sp's local store the changelog records
// after its cursor, at most standbyStep sequences of the output stream,
// exactly as a takeover's restore applies them (changelog.Apply), under
// the partition's busy token, and reports whether more is left. It does
// nothing once this instance owns sp or stops standing by for it, and
// reads nothing the output stream no longer fully holds (checkChangelog,
// checkReach): the takeover then refuses the partition as it would
// without a standby.
func (g *Group) tailStep(ctx context.Context, sp *state.Partition) (more bool, err error) {
	p := sp.Index()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if !g.startTail(p, func() { cancel(errPreempted) }) {
		return false, nil
	}
	defer g.endTail(p)
	busy := &g.busy[p]
	busy.Lock()
	defer busy.Unlock()
	if !g.standbyOf(p) || g.stopping() {
		return false, nil
	}
	defer func() {
		if err != nil && errors.Is(context.Cause(ctx), errPreempted) {
			more, err = false, nil // a taker cancelled it: the cursor holds what it applied
		}
	}()
	cursor, err := sp.Cursor()
	if err != nil {
		return false, err
	}
	out, err := changelog.StreamState(ctx, g.js, g.outStream)
	if err != nil {
		return false, err
	}
	if cursor > out.State.LastSeq {
		return false, nil // a cursor of a stream since made again: the takeover reads it all
	}
	if g.tailedUpTo(p, 0) == out.State.LastSeq && cursor > 0 {
		return false, nil // the output has not moved since this partition's last check
	}
	// A step of a stream of many subjects reads without the server's
	// filters, as a takeover's tail does: at 10M subjects the server's
	// pass over them to start a filtered reader outlasted every attempt,
	// and a standby started empty never caught up.
	span := changelog.Span{Stream: g.outStream, Forwards: []string{changelog.PartitionFilter(g.prefix, p)},
		KeyState: changelog.KeyStateSubject(g.prefix, p), Fence: changelog.FenceSubject(g.prefix, p),
		ReadAllUnder: changelog.ReadAllUnderFor(out.State.NumSubjects)}
	last, err := g.lastOn(ctx, span.Forwards[0], span.KeyState, span.Fence)
	if err != nil {
		return false, err
	}
	label := strconv.Itoa(p)
	if last <= cursor {
		g.metrics.sbCursor.WithLabelValues(label).Set(float64(cursor))
		g.tailedUpTo(p, out.State.LastSeq)
		return false, nil
	}
	now := serverTime(out, g.clock)
	from, since := g.restoreStart(cursor, out.State.LastSeq, now)
	if err := g.checkChangelog(out.Config); err != nil {
		return false, err
	}
	if err := g.checkReach(out.State, p, from, now); err != nil {
		return false, err
	}
	if from == 0 {
		if from, err = changelog.StartSince(ctx, g.js, g.outStream, []string{span.Forwards[0], span.KeyState}, since); err != nil {
			return false, err
		}
	}
	span.From, span.UpTo = from, last
	if from > 0 && from <= last && last-from+1 > standbyStep {
		// Read ends at the first message at or past UpTo on the
		// partition's subjects: last is one, so the read ends.
		span.UpTo = from + standbyStep - 1
	}
	st, err := changelog.Apply(ctx, g.js, span, []changelog.Target{{P: sp, Cursor: cursor}}, changelog.ApplyOptions{
		Route: func(*changelog.Record, string) int { return 0 },
	})
	g.metrics.sbRecords.Add(float64(st.Applied[0]))
	if err != nil {
		return false, fmt.Errorf("tail partition %d from sequence %d: %w", p, from, err)
	}
	g.metrics.sbCursor.WithLabelValues(label).Set(float64(span.UpTo))
	return span.UpTo < last, nil
}

// errPreempted is the cause of a tail step's cancellation by a taker of
// its partition (preemptTail).
var errPreempted = errors.New("the partition is being taken")

// startTail registers the cancel of partition p's tail step, unless a
// taker waits for p's busy token (preemptTail): then it reports false and
// the step does not run.
func (g *Group) startTail(p int, cancel context.CancelFunc) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.taking[p] > 0 {
		return false
	}
	if g.tails == nil {
		g.tails = map[int]context.CancelFunc{}
	}
	g.tails[p] = cancel
	return true
}

// endTail unregisters partition p's tail step.
func (g *Group) endTail(p int) {
	g.mu.Lock()
	delete(g.tails, p)
	g.mu.Unlock()
}

// preemptTail is called by whoever is about to wait for partition p's
// busy token to judge or take it: a warm standby's tail step in flight is
// cancelled (what it applied stays, its cursor with it), and none starts
// until done is called, once the token is held. So a takeover waits for
// no tail.
func (g *Group) preemptTail(p int) (done func()) {
	return g.countIn(&g.taking, p, func() {
		if cancel := g.tails[p]; cancel != nil {
			cancel()
		}
	})
}

// holdBusy waits for partition p's busy token, cancelling a warm
// standby's tail step in flight (preemptTail), and returns what gives the
// token back.
func (g *Group) holdBusy(p int) (unlock func()) {
	done := g.preemptTail(p)
	g.busy[p].Lock()
	done()
	return g.busy[p].Unlock
}

// tailedUpTo returns the output's last sequence when partition p's tail
// last found nothing new, after setting it to seen when seen is not 0.
func (g *Group) tailedUpTo(p int, seen uint64) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.tailSeen == nil {
		g.tailSeen = map[int]uint64{}
	}
	if seen != 0 {
		g.tailSeen[p] = seen
	}
	return g.tailSeen[p]
}

// lastOn returns the highest sequence of a message on subjects (wildcards
// allowed) in the output stream, as its leader stores it: 0 when none.
func (g *Group) lastOn(ctx context.Context, subjects ...string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, standbyLastBound)
	defer cancel()
	return forward.LastSeqOn(ctx, g.js, g.outStream, subjects, changelog.RequestTimeout, "standby")
}
