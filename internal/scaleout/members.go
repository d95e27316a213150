package scaleout

import (
	"context"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/pcgroups"

	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
)

// members are this instance's consumers of the group's members, one per
// partition; balance stops and restarts them.
type members struct {
	g       *Group
	handler func(p int) func(jetstream.Msg)
	mu      sync.Mutex
	running map[int]*member // partition -> its member's consumer
	joining map[int]bool    // partitions whose join runs (ensure)
}

// ensure consumes partition p's member unless it does already or its
// join runs (join).
func (m *members) ensure(ctx context.Context, p int) {
	m.mu.Lock()
	if m.running[p] != nil || m.joining[p] {
		m.mu.Unlock()
		return
	}
	if m.joining == nil {
		m.joining = map[int]bool{}
	}
	m.joining[p] = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.joining, p)
		m.mu.Unlock()
	}()
	m.join(ctx, p)
}

// consuming reports whether partition p's member is consumed.
func (m *members) consuming(p int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.running[p] != nil
}

// member is one running consumer of a group member.
type member struct {
	consuming pcgroups.ConsumerGroupConsumeContext
	ended     chan struct{} // closed when the library reports it done
	// cancel ends the context the member was joined with, after Stop.
	cancel context.CancelFunc
}

// join consumes partition p's member, retrying until ctx is done. The
// member runs on a context of its own that leave cancels once it is
// stopped, since the library's watch loop spins from its context's end
// until Stop (docs/scale-out.md, "Code notes").
func (m *members) join(ctx context.Context, p int) {
	g := m.g
	b := retry.NewBackoff()
	for ctx.Err() == nil {
		mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		stopCancel := context.AfterFunc(ctx, cancel)
		consuming, err := pcgroups.StaticConsume(mctx, g.joinJS, g.inStream, g.name, layout.Member(p), m.handler(p), g.consumer)
		if !stopCancel() && err == nil { // ctx ended while joining
			consuming.Stop()
			err = ctx.Err()
		}
		if err != nil {
			cancel()
			if ctx.Err() == nil {
				g.log.Warn("scale-out: cannot consume member, retrying", "member", layout.Member(p), "err", err)
				b.Wait(ctx)
			}
			continue
		}
		mb := &member{consuming: consuming, ended: make(chan struct{}), cancel: cancel}
		go func() {
			defer close(mb.ended)
			if err := <-consuming.Done(); err != nil {
				g.log.Error("scale-out: the group stopped a member's consumer", "member", layout.Member(p), "err", err)
			}
		}()
		m.mu.Lock()
		m.running[p] = mb
		g.metrics.members.Set(float64(len(m.running)))
		m.mu.Unlock()
		return
	}
}

// leave stops consuming partition p's member.
func (m *members) leave(p int) {
	m.mu.Lock()
	mb := m.running[p]
	delete(m.running, p)
	m.g.metrics.members.Set(float64(len(m.running)))
	m.mu.Unlock()
	if mb != nil {
		mb.consuming.Stop()
		<-mb.ended
		mb.cancel()
	}
}

// leaveAll stops consuming every member.
func (m *members) leaveAll() {
	m.mu.Lock()
	all := make([]int, 0, len(m.running))
	for p := range m.running {
		all = append(all, p)
	}
	m.mu.Unlock()
	for _, p := range all {
		m.leave(p)
	}
}

// giveBackAll is a clean stop's release (docs/scale-out.md §7): what the
// members deliver from now on is kept aside, and the workers give back
// (nak) what they have not started judging; once each batch in flight has
// finished (the busy tokens), every owned partition is unpinned while the
// members still consume, so that nothing the client buffered is dropped,
// and watched until another pin or none holds (awaitHandOff); then the
// members stop and what was kept aside is given back.
func (g *Group) giveBackAll(m *members) {
	g.mu.Lock()
	g.givingBack = true
	if g.diverted == nil {
		g.diverted = make(map[int][]jetstream.Msg)
	}
	for p := range g.busy {
		g.diverted[p] = nil
	}
	g.mu.Unlock()
	for p := range g.busy {
		g.busy[p].Lock()
	}
	g.mu.Lock()
	pins := maps.Clone(g.owned)
	g.mu.Unlock()
	g.ReleaseAll()
	for p, pin := range pins {
		g.lose(p, pin)
	}
	for p := range g.busy {
		g.busy[p].Unlock()
	}
	// A member pinned again before it stops is unpinned once more
	// (awaitHandOff), every partition side by side.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var handOffs sync.WaitGroup
	for p, pin := range pins {
		handOffs.Go(func() { g.awaitHandOff(ctx, p, map[string]bool{pin: true}, "stop") })
	}
	handOffs.Wait()
	m.leaveAll()
	g.mu.Lock()
	kept := g.diverted
	g.diverted = nil
	g.mu.Unlock()
	for p, msgs := range kept {
		giveBackMsgs(msgs)
		g.metrics.stale.WithLabelValues(strconv.Itoa(p)).Add(float64(len(msgs)))
	}
}

// giveBackMsgs naks msgs without delay.
func giveBackMsgs(msgs []jetstream.Msg) {
	for _, msg := range msgs {
		_ = msg.Nak() // a lost nak: the message comes back after ack_wait
	}
}

// ReleaseAll unpins the partitions this instance owns, after its workers
// finished, so that their next owners get them at once instead of after
// the pin's TTL.
func (g *Group) ReleaseAll() {
	g.mu.Lock()
	owned := maps.Clone(g.owned)
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for p, pin := range owned {
		// A partition taken before traffic may be pinned here by now: it
		// is unpinned all the same, and an unpin of a partition nobody is
		// pinned to is no failure.
		if err := pcgroups.StaticMemberStepDown(ctx, g.js, g.inStream, g.name, layout.Member(p)); err != nil && pin != pretakePin {
			g.log.Warn("scale-out: unpin on stop failed; the partition moves after the pin's TTL", "partition", p, "err", err)
			continue
		}
		g.log.Info("scale-out: partition released", "partition", p)
	}
}

// divert keeps msg aside when partition p is being released, and reports
// whether it did.
func (g *Group) divert(p int, msg jetstream.Msg) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	ms, ok := g.diverted[p]
	if ok {
		g.diverted[p] = append(ms, msg)
	}
	return ok
}

// lastTake returns when this instance last took a partition it did not
// own (zero before the first).
func (g *Group) lastTake() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.took
}

// stopping reports whether the instance stops, so that its workers give
// back what they have not started judging.
func (g *Group) stopping() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.givingBack
}

// setOwned records that this instance owns partition p, under pin now,
// and when it took p if it did not own it.
func (g *Group) setOwned(p int, pin string) {
	g.mu.Lock()
	if _, had := g.owned[p]; !had {
		g.took = time.Now()
	}
	g.owned[p] = pin
	g.metrics.owned.Set(float64(len(g.owned)))
	g.mu.Unlock()
}
