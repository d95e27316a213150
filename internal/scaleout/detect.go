package scaleout

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/synadia-io/orbit.go/pcgroups"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
)

// Detection of a gone owner (docs/scale-out.md §4.3): the server moves a
// partition from an owner that stopped pulling only when its pin's TTL
// (input.ack_wait, 10 s by default) has passed. Every instance puts its
// presence key every heartbeatEvery; a standby that has heard nothing
// from a partition's fence holder for ownerGoneAfter, while it hears its
// own puts (its watch is live), unpins the partition, so that the server
// pins a standby's pull at once. The fence is unchanged: an owner that
// was only paused finds its next batch refused, as after the pin's TTL.

// heartbeatEvery is how often an instance puts its presence key for
// detection.
const heartbeatEvery = time.Second

// ownerGoneAfter is how long a standby hears nothing from a partition's
// fence holder before it unpins the partition: three heartbeats, so that
// one late or lost put is no takeover, and well under the default pin
// TTL (10 s). A wrong guess (an owner paused for longer, a slow watch)
// costs a move, never a duplicate: the fence decides who writes.
const ownerGoneAfter = 3 * heartbeatEvery

// repinAfter is how long a pin given after the owner went silent may hold
// without the fence moving before a standby unpins it again: the server
// may have given it to a pull the gone owner left waiting (it expires
// after ack_wait / 2), while a live instance pinned takes the fence within
// it. It is also the least time between two unpins of one partition.
const repinAfter = 2 * heartbeatEvery

// detects reports whether detection shortens the hand-over for a pin TTL
// of pinTTL: only when ownerGoneAfter is well under it.
func detects(pinTTL time.Duration) bool { return 2*ownerGoneAfter <= pinTTL }

// pinTTL is the member consumers' pin TTL, as pcgroups sets it: the
// consumers' ack wait, at least a second.
func (g *Group) pinTTL() time.Duration { return max(g.opts.AckWait, time.Second) }

// heartbeat puts this instance's presence key every heartbeatEvery and
// unpins the partitions whose owner is gone (unpinGone), until ctx is
// done; it does nothing where detection would not shorten the hand-over
// (detects).
func (g *Group) heartbeat(ctx context.Context, pr *presence, m *members) {
	if !detects(g.pinTTL()) {
		return
	}
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	unpinned := map[int]time.Time{} // partition -> when this instance last unpinned it here
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := pr.put(ctx); err != nil {
			continue // balance's refresh says why
		}
		g.unpinGone(ctx, pr, m, unpinned)
	}
}

// unpinGone unpins each partition another instance holds, assigned to a
// gone instance or to this one, whose fence holder is gone
// (presence.gone), when the pin is older than the holder's last put, or
// has held repinAfter without the fence moving: a pin the server gave
// since is the next owner's until then. unpinned keeps each partition
// from being unpinned again within repinAfter.
func (g *Group) unpinGone(ctx context.Context, pr *presence, m *members, unpinned map[int]time.Time) {
	gone := pr.gone(ownerGoneAfter)
	if len(gone) == 0 {
		return
	}
	now := time.Now()
	for p := range g.opts.Partitions {
		// A partition this instance owns, or is taking (its fence may be
		// this instance's already, its pin is), is left alone.
		if g.holds(p) || g.takingOver(p) || now.Sub(unpinned[p]) < repinAfter {
			continue
		}
		// Only the partitions assigned to this instance, or to a gone
		// one that this instance succeeds, are asked about.
		to := g.assignedTo(p)
		if to != g.instance {
			if _, isGone := gone[to]; !isGone || !g.successorOf(p) {
				continue
			}
		}
		holder, err := changelog.FenceHolder(ctx, g.js, g.outStream, changelog.FenceSubject(g.prefix, p))
		if err != nil {
			continue
		}
		owner, last, isGone := goneOwner(g.instance, to, holder, gone)
		if !isGone {
			continue
		}
		pin, at, age, err := g.pinSince(ctx, p)
		if err != nil {
			continue
		}
		switch onPin(pin, at, age, last) {
		case pinLeave:
			continue
		case pinPull:
			// Nobody is pinned: the first pull is, so this instance
			// pulls (a successor that released it for balance may not).
			m.ensure(ctx, p)
			continue
		}
		// This instance pulls on p before the unpin, so that the server
		// has its pull to pin: balance joins a standby's member only at
		// its next pass, which may be up to a refresh after a release.
		m.ensure(ctx, p)
		if g.holds(p) || g.takingOver(p) {
			continue // taken here meanwhile: the pin is this instance's
		}
		if err := pcgroups.StaticMemberStepDown(ctx, g.js, g.inStream, g.name, layout.Member(p)); err != nil {
			g.logs.Warn("gone_unpin_failed", "scale-out: unpinning the partition of a gone owner failed; it moves after the pin's TTL", "partition", p, "owner", owner, "err", err)
			continue
		}
		unpinned[p] = now
		g.metrics.goneUnpins.WithLabelValues(strconv.Itoa(p)).Inc()
		g.log.Info("scale-out: partition unpinned: its owner is gone", "partition", p, "owner", owner,
			"silent_for", now.Sub(pr.heardOf(owner)).Round(time.Millisecond), "pin_ttl", g.pinTTL())
	}
}

// goneOwner returns the owner of a partition whose fence holder is
// holder and whose assigned owner (balance's) is to, when it was last
// heard (gone's time), and whether it is gone. The holder is the owner;
// but where this instance (self) holds the fence, it released the
// partition for balance and the owner is the instance it went to, which
// may have died before it took the fence: the pin, if any, is that one's.
func goneOwner(self, to, holder string, gone map[string]time.Time) (string, time.Time, bool) {
	owner := holder
	if holder == self {
		owner = to
	}
	last, ok := gone[owner]
	return owner, last, ok
}

// pinAction is what unpinGone does with the pin of a partition whose
// owner is gone (onPin).
type pinAction int

const (
	pinLeave pinAction = iota // the pin is the next owner's: left alone
	pinPull                   // nobody is pinned: pulling is enough
	pinUnpin                  // the gone owner's pin: pull, then unpin
)

// onPin decides what to do with a partition's pin (pin, "" for none,
// given at at, age old on the server's clock) when its owner, gone, was
// last heard at last: a pin given after the owner's last put (a
// heartbeat's slack allowed) is the next owner's until it has held
// repinAfter without the fence moving.
func onPin(pin string, at time.Time, age time.Duration, last time.Time) pinAction {
	switch {
	case pin == "":
		return pinPull
	case at.After(last.Add(heartbeatEvery)) && age < repinAfter:
		return pinLeave
	default:
		return pinUnpin
	}
}

// pinSince returns partition p's pin, when the server pinned it and how
// long ago (both the server's clock); "" when nobody is pinned.
func (g *Group) pinSince(ctx context.Context, p int) (string, time.Time, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := g.js.Consumer(ctx, g.inStream, layout.MemberConsumer(g.name, p))
	if err != nil {
		return "", time.Time{}, 0, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return "", time.Time{}, 0, err
	}
	for _, pg := range info.PriorityGroups {
		if pg.Group == pcgPriorityGroup && pg.PinnedClientID != "" {
			return pg.PinnedClientID, pg.PinnedTS, info.TimeStamp.Sub(pg.PinnedTS), nil
		}
	}
	return "", time.Time{}, 0, nil
}

// put puts this instance's presence key.
func (pr *presence) put(ctx context.Context) error {
	v, err := json.Marshal(ownPresence(time.Now().UTC()))
	if err != nil {
		return err
	}
	_, err = pr.kv.Put(ctx, pr.self, v)
	return err
}

// gone returns the instances (but this one) whose last put the watch
// heard more than after ago, with the server's time of that put, while
// the watch runs and heard this instance's own put within after: a watch
// that fell behind makes nobody gone. An instance that left deleted its
// key, and is not gone but absent.
func (pr *presence) gone(after time.Duration) map[string]time.Time {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	now := time.Now()
	if !pr.watching || !pr.synced || now.Sub(pr.heard[pr.self]) > after {
		return nil
	}
	var gone map[string]time.Time
	for k, at := range pr.heard {
		if k != pr.self && now.Sub(at) > after && now.Sub(at) < pr.ttl {
			if gone == nil {
				gone = map[string]time.Time{}
			}
			gone[k] = pr.seen[k]
		}
	}
	return gone
}

// assignedTo returns partition p's assigned owner as balance last
// computed it, "" before.
func (g *Group) assignedTo(p int) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p < len(g.assigned) {
		return g.assigned[p]
	}
	return ""
}

// heardOf returns when the watch last heard instance's put.
func (pr *presence) heardOf(instance string) time.Time {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.heard[instance]
}
