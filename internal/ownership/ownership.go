// Package ownership declares what a partition's worker asks of the
// ownership of its partition while it judges a batch, once for both modes:
// the Owner interface and its Verdict. A single instance owns every
// partition and its Owner holds no fence; a scale-out group's is
// internal/scaleout's *Owner, which takes the partition's fence and
// restores it before the first batch it judges. The worker reads the same
// with either: it asks Own before it judges a batch, Annotate for each
// forward, Fence for the publish, Claim for the commit.
//
//	release, v := owner.Own(ctx, pin, len(batch), keepAlive)
//	defer release()
//	if v != ownership.Judge { ... } // give back or leave the batch
//
// It is a leaf of the module: it imports the store's and the publish's
// types, and nothing that implements it.
package ownership

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Verdict is what an Owner decides of a batch before it is judged.
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

// ErrNotOwner means this instance does not own the partition (it holds no
// tenure, or another instance took the fence meanwhile): an operator's
// forget is the owner's to apply.
var ErrNotOwner = errors.New("this instance does not own the partition")

// Owner is what a partition's worker asks of its partition's ownership
// while it judges a batch. An Owner belongs to one worker and is not safe
// for concurrent use.
type Owner interface {
	// Own is called before a batch of n messages is judged; pin is the
	// pin its last message came under, and keepAlive tells the server the
	// batch is in progress. The batch is judged, given back or left
	// unacked as v says. release is called once the batch is finished,
	// whatever v is.
	Own(ctx context.Context, pin string, n int, keepAlive func()) (release func(), v Verdict)
	// Annotate makes m, the forwarded copy of a message that came on the
	// input subject subject at input time at, with body fingerprint fp
	// and contribution tot to a total, what the partition's changelog
	// needs to restore its record: the record's headers (at its
	// first-seen time) and the contribution; in a group, also the
	// partition's subject.
	Annotate(m *nats.Msg, subject string, fp uint64, tot state.Contribution, at time.Time)
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
	// Claim commits claims, the batch's forwarded keys (each at its input
	// time, Claim.At), in p; res are the batch's publish results.
	Claim(p *state.Partition, claims []state.Claim, res []forward.Result) ([]state.ClaimResult, error)
	// Forget forgets key in p for an operator, in the partition's turn
	// (state.Partition.Forget): a single instance marks its record; a
	// group's owner first writes the forget to the partition's changelog.
	// It returns an error wrapping ErrNotOwner when this instance does not
	// own the partition.
	Forget(ctx context.Context, p *state.Partition, key []byte) (rec state.Record, held bool, err error)
	// DeadLetterFence returns the fence a dead letter decided now expects
	// and the pin of the tenure that decides it (nil and "" for none).
	DeadLetterFence() (*forward.Fence, string)
}
