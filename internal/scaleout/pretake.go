package scaleout

import (
	"context"
	"strconv"

	"github.com/dedupe-stage/dedupe-stage/state"
)

// pretakePin is the pin a partition taken before any message is owned
// under (g.owned) until its first message comes under the server's pin.
// No message carries it.
const pretakePin = "pretaken"

// pretake takes partition p, assigned to this instance, before any message
// comes (docs/scale-out.md §4.2), in the background, unless it runs
// already: the fence, and a restore up to it, which for a partition the
// output holds no record of is the fence alone. The partition's next
// batch, whatever pin it comes under, adopts the tenure (takePre). A
// partition pinned to a client by now is left to its messages: it is
// this instance's when the pin is, and is released to it when not.
func (g *Group) pretake(ctx context.Context, store *state.Store, p int) {
	g.mu.Lock()
	if g.pretaking[p] {
		g.mu.Unlock()
		return
	}
	g.pretaking[p] = true
	g.mu.Unlock()
	g.pretakes.Go(func() {
		defer func() {
			g.mu.Lock()
			delete(g.pretaking, p)
			g.mu.Unlock()
		}()
		defer g.holdBusy(p)() // no batch of p runs meanwhile, nor a warm standby's tail step
		// The live instances may have changed since the pretake was
		// asked for: a partition no longer assigned here is left to the
		// instance it is assigned to.
		if g.holds(p) || g.stopping() || ctx.Err() != nil || !g.assignedHere(p) {
			return
		}
		if pin, err := g.pinOf(ctx, p); err != nil || pin != "" {
			return
		}
		o := &Owner{g: g, p: store.Partition(p), label: strconv.Itoa(p)}
		defer g.startTake(p)() // until the partition is owned, or the take failed
		t, err := o.takeOver(ctx, func() {}, pretakePin)
		if err != nil {
			if ctx.Err() == nil {
				g.logs.Warn("pretake_failed", "scale-out: taking an assigned partition before traffic failed; its first message takes it", "partition", p, "err", err)
			}
			return
		}
		g.mu.Lock()
		g.pre[p] = t
		g.owned[p] = pretakePin
		g.metrics.owned.Set(float64(len(g.owned)))
		g.mu.Unlock()
	})
}

// takePre returns the tenure of partition p taken before any message
// (pretake), once, or nil.
func (g *Group) takePre(p int) *tenure {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.pre[p]
	delete(g.pre, p)
	return t
}

// setAssigned records each partition's assigned owner (assign), for
// pretake.
func (g *Group) setAssigned(want []string) {
	g.mu.Lock()
	g.assigned = want
	g.mu.Unlock()
}

// assignedHere reports whether balance last assigned partition p to this
// instance.
func (g *Group) assignedHere(p int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return p < len(g.assigned) && g.assigned[p] == g.instance
}
