package scaleout

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/ownership"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Forget forgets key in p, the owner's partition, for an operator
// (docs/admin.md), in the partition's turn: no batch runs meanwhile. When
// the partition holds the key, it publishes the forget's tombstone on the
// partition's key-state subject expecting the tenure's fence, so that a
// zombie owner's is refused and a new owner restores the forget, then
// marks its own record forgotten at the tombstone's time
// (state.Partition.ForgetAt). It returns an error wrapping
// ownership.ErrNotOwner without a tenure, or when the fence moved (the
// tenure then ends); any other failure leaves the key as it was, and the
// forget can be tried again. Like a batch, it holds the partition's busy
// token and first catches up with a tenure taken before any message
// (catchUp), which a partition released here for balance has until its
// first batch.
func (o *Owner) Forget(ctx context.Context, p *state.Partition, key []byte) (state.Record, bool, error) {
	defer o.g.holdBusy(o.p.Index())()
	o.catchUp()
	if o.tenure == nil {
		return state.Record{}, false, fmt.Errorf("forget %q in partition %d: %w", key, p.Index(), ownership.ErrNotOwner)
	}
	if !o.refreshFence(ctx) {
		if o.tenure == nil { // the fence moved
			return state.Record{}, false, fmt.Errorf("forget %q in partition %d: %w", key, p.Index(), ownership.ErrNotOwner)
		}
		return state.Record{}, false, fmt.Errorf("forget %q in partition %d: the partition's fence could not be written again; try again", key, p.Index())
	}
	rec, held, err := p.Held(key)
	if err != nil || !held {
		return rec, false, err
	}
	at := o.g.clock.Now()
	kr := changelog.KeyRecord(key, rec)
	m := changelog.ForgetMsg(changelog.KeyStateSubject(o.g.prefix, p.Index()), kr, at)
	res := make([]forward.Result, 1)
	err = forward.Batch(ctx, o.g.js, []*nats.Msg{m}, res, forward.Options{Component: "forget", Atomic: true, Fence: &o.tenure.fence})
	if err == nil {
		err = res[0].Err
	}
	switch {
	case retry.IsFenced(err):
		o.fenced(ctx, err)
		return state.Record{}, false, fmt.Errorf("forget %q in partition %d: %w: %w", key, p.Index(), ownership.ErrNotOwner, err)
	case err != nil:
		return state.Record{}, false, fmt.Errorf("forget %q: publish its tombstone: %w", key, err)
	}
	return p.ForgetAt(key, at)
}
