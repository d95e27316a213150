package stage

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/handover"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// verdict is what an ownership decides of a batch before it is judged.
type verdict int

const (
	// judgeBatch: this instance owns the partition, and the batch is
	// judged.
	judgeBatch verdict = iota
	// giveBackBatch: the batch is not this instance's to judge; its
	// messages are given back (nak) so that the owner gets them at once.
	giveBackBatch
	// leaveBatch: the batch is left unacked and comes back after ack_wait.
	leaveBatch
)

// ownership is what a partition's worker asks of its partition's ownership
// while it judges a batch, so the worker reads the same with one instance or
// many: soleOwner owns every partition and does nothing, groupOwner
// (group.go) is one partition of a scale-out group. An ownership belongs to
// one worker and is not safe for concurrent use.
type ownership interface {
	// Own is called before a batch of n messages is judged; pin is the
	// pin its last message came under, and keepAlive tells the server the
	// batch is in progress. The batch is judged, given back or left
	// unacked as v says. release is called once the batch is finished,
	// whatever v is.
	Own(ctx context.Context, pin string, n int, keepAlive func()) (release func(), v verdict)
	// Annotate makes m, the forwarded copy of a message that came on the
	// input subject subject, with body fingerprint fp and contribution tot
	// to a total, what the owner's changelog needs: nothing for a single
	// instance; the partition's subject and the record's headers in a
	// group.
	Annotate(m *nats.Msg, subject string, fp uint64, tot state.Contribution, now time.Time)
	// RefreshRecord returns the changelog record of a repeat that moves
	// the window of key, whose record is rec, to at
	// (window.refresh_on_repeat), for the batch's output publish: nil for
	// a single instance; in a group, a key-state record, so that a new
	// owner restores the moved window.
	RefreshRecord(key []byte, rec state.Record, at time.Time) *nats.Msg
	// Publishing is called before the batch's output publish: from then
	// until its Claim returns without error, the batch's forwards may be
	// in the output and not in the store.
	Publishing()
	// Fence is the fence the batch's output publish expects, nil for none.
	Fence() *forward.Fence
	// Lost handles a publish refused because the partition's fence moved
	// and reports whether it did; false means err is no fence this owner
	// holds, and the batch stops as for any other error.
	Lost(ctx context.Context, err error) bool
	// Claim commits claims, the batch's forwarded keys, in p; res are the
	// batch's publish results and now the time the forwarded records say.
	Claim(p *state.Partition, claims []state.Claim, res []forward.Result, now time.Time) ([]state.ClaimResult, error)
	// Forget forgets key in p for an operator, in the partition's turn
	// (state.Partition.Forget): a single instance marks its record; a
	// group's owner first writes the forget to the partition's changelog.
	// It returns an error wrapping errNotOwner when this instance does not
	// own the partition.
	Forget(ctx context.Context, p *state.Partition, key []byte) (rec state.Record, held bool, err error)
	// DeadLetterFence returns the fence a dead letter decided now expects
	// and the pin of the tenure that decides it (nil and "" for none).
	DeadLetterFence() (*forward.Fence, string)
}

// soleOwner is the ownership of partition p of a single instance: it
// owns every partition, adds to a forwarded copy only its contribution to
// a total, and holds no fence. It tracks the store's watermark in wm,
// which the source's prepare made before any ownership, and stores it with
// each commit (docs/state.md, "The watermark").
type soleOwner struct {
	p  int
	wm *watermark
}

// Own implements ownership: every batch is this instance's.
func (soleOwner) Own(context.Context, string, int, func()) (func(), verdict) {
	return nothingToRelease, judgeBatch
}

// nothingToRelease is what soleOwner.Own holds.
func nothingToRelease() {}

// Annotate implements ownership: with a contribution to a total (totals
// on), the copy carries it as a group's forward does
// (handover.AnnotateTotal), for the read-back at start to add it with the
// key it restores; otherwise the copy is left as it is.
func (soleOwner) Annotate(m *nats.Msg, _ string, _ uint64, tot state.Contribution, _ time.Time) {
	if tot.Group != "" {
		handover.AnnotateTotal(m.Header, tot.Group, tot.Bucket, tot.Value)
	}
}

// RefreshRecord implements ownership: a single instance has no changelog.
func (soleOwner) RefreshRecord([]byte, state.Record, time.Time) *nats.Msg { return nil }

// Publishing implements ownership: the partition's batch is in flight
// until its claims commit.
func (o soleOwner) Publishing() { o.wm.publishing(o.p) }

// Fence implements ownership: there is no fence.
func (soleOwner) Fence() *forward.Fence { return nil }

// Lost implements ownership: with no fence, no error is a fence loss.
func (soleOwner) Lost(context.Context, error) bool { return false }

// Claim implements ownership: the claims, with the store's watermark,
// in one transaction.
func (o soleOwner) Claim(p *state.Partition, claims []state.Claim, res []forward.Result, _ time.Time) ([]state.ClaimResult, error) {
	r, err := p.ClaimWithWatermark(claims, o.wm.next(o.p, res))
	if err == nil {
		o.wm.commit(o.p, res)
	}
	return r, err
}

// Forget implements ownership: the record alone is marked.
func (soleOwner) Forget(_ context.Context, p *state.Partition, key []byte) (state.Record, bool, error) {
	return p.Forget(key)
}

// DeadLetterFence implements ownership: dead letters are not fenced.
func (soleOwner) DeadLetterFence() (*forward.Fence, string) { return nil, "" }
