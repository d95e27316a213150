package scaleout

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/handover"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// ErrNotOwner means this instance does not own the partition (it holds no
// tenure, or another instance took the fence meanwhile): an operator's
// forget is the owner's to apply.
var ErrNotOwner = errors.New("scale-out: this instance does not own the partition")

// Forget forgets key for an operator (docs/admin.md), in the partition's
// turn: no batch runs meanwhile. When the partition holds the key, it
// publishes the forget's tombstone on the partition's key-state subject
// expecting the tenure's fence, so that a zombie owner's is refused and a
// new owner restores the forget, then marks its own record forgotten at
// the tombstone's time (state.Partition.ForgetAt). It returns ErrNotOwner
// without a tenure, or when the fence moved (the tenure then ends); any
// other failure leaves the key as it was, and the forget can be tried
// again.
func (o *Owner) Forget(ctx context.Context, key []byte) (state.Record, bool, error) {
	if o.tenure == nil {
		return state.Record{}, false, fmt.Errorf("forget %q in partition %d: %w", key, o.p.Index(), ErrNotOwner)
	}
	if !o.refreshFence(ctx) {
		if o.tenure == nil { // the fence moved
			return state.Record{}, false, fmt.Errorf("forget %q in partition %d: %w", key, o.p.Index(), ErrNotOwner)
		}
		return state.Record{}, false, fmt.Errorf("forget %q in partition %d: the partition's fence could not be written again; try again", key, o.p.Index())
	}
	rec, held, err := o.p.Held(key)
	if err != nil || !held {
		return rec, false, err
	}
	at := o.g.clock.Now()
	kr := keyRecord(key, rec)
	if rec.Refreshed.After(rec.FirstSeen) {
		kr.WindowStart = rec.Refreshed
	}
	m := handover.ForgetMsg(handover.KeyStateSubject(o.g.prefix, o.p.Index()), kr, at)
	res := make([]forward.Result, 1)
	err = forward.Batch(ctx, o.g.js, []*nats.Msg{m}, res, forward.Options{Component: "forget", Atomic: true, Fence: &o.tenure.fence})
	if err == nil {
		err = res[0].Err
	}
	switch {
	case retry.IsFenced(err):
		o.fenced(ctx, err)
		return state.Record{}, false, fmt.Errorf("forget %q in partition %d: %w: %w", key, o.p.Index(), ErrNotOwner, err)
	case err != nil:
		return state.Record{}, false, fmt.Errorf("forget %q: publish its tombstone: %w", key, err)
	}
	return o.p.ForgetAt(key, at)
}
