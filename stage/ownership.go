package stage

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/ownership"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// soleOwner is the ownership.Owner of partition p of a single instance,
// a group of one: it owns every partition and holds no fence. As a
// group's owner does, it writes the partition's changelog in the output
// stream (the record each forward carries, the key-state records of a
// moved window and of a forget) and commits each batch's claims with the
// partition's cursor, so that a start restores the store from the output
// after each partition's cursor (singleSource.restore) on the one path a
// group's new owner takes.
type soleOwner struct {
	s *Stage
	p int
}

// soleOwner implements ownership.Owner.
var _ ownership.Owner = soleOwner{}

// Own implements ownership.Owner: every batch is this instance's.
func (soleOwner) Own(context.Context, string, int, func()) (func(), ownership.Verdict) {
	return nothingToRelease, ownership.Judge
}

// nothingToRelease is what soleOwner.Own holds.
func nothingToRelease() {}

// Annotate implements ownership.Owner: the copy carries its record
// (changelog.AnnotateFirstSeen: its input time; the fingerprint is its
// body's, which the copy carries unchanged) and its contribution to a
// total (changelog.AnnotateTotal), which a restore reads back.
func (soleOwner) Annotate(m *nats.Msg, _ string, _ uint64, tot state.Contribution, at time.Time) {
	changelog.AnnotateFirstSeen(m.Header, at)
	if tot.Group != "" {
		changelog.AnnotateTotal(m.Header, tot.Group, tot.Bucket, tot.Value)
	}
}

// RefreshRecord implements ownership.Owner: the partition's key-state
// record of the moved window (changelog.RefreshMsg), published with the
// batch's forwards.
func (o soleOwner) RefreshRecord(key []byte, rec state.Record, at time.Time) *nats.Msg {
	return changelog.RefreshMsg(changelog.KeyStateSubject(o.s.cfg.Output.SubjectPrefix, o.p), changelog.KeyRecord(key, rec), at)
}

// Publishing implements ownership.Owner: nothing to do, since the
// partition restores from its cursor.
func (soleOwner) Publishing() {}

// Fence implements ownership.Owner: there is no fence.
func (soleOwner) Fence() *forward.Fence { return nil }

// Lost implements ownership.Owner: with no fence, no error is a fence loss.
func (soleOwner) Lost(context.Context, error) bool { return false }

// Claim implements ownership.Owner: the claims, with the partition's
// cursor at the highest sequence the batch stored (forward.StoredUpTo), in
// one transaction.
func (soleOwner) Claim(p *state.Partition, claims []state.Claim, res []forward.Result) ([]state.ClaimResult, error) {
	return p.ClaimWithCursor(claims, forward.StoredUpTo(res))
}

// Forget implements ownership.Owner: the forget's key-state record (a
// tombstone, changelog.ForgetMsg) is published to the partition's
// changelog first, so that a restore keeps the key forgotten, then the
// record is marked at the same time.
func (o soleOwner) Forget(ctx context.Context, p *state.Partition, key []byte) (state.Record, bool, error) {
	rec, held, err := p.Held(key)
	if err != nil || !held {
		return rec, false, err
	}
	at := o.s.clock.Now()
	m := changelog.ForgetMsg(changelog.KeyStateSubject(o.s.cfg.Output.SubjectPrefix, o.p), changelog.KeyRecord(key, rec), at)
	res := make([]forward.Result, 1)
	err = forward.Batch(ctx, o.s.js, []*nats.Msg{m}, res, forward.Options{Component: "forget", Atomic: o.s.atomicOutput})
	if err == nil {
		err = res[0].Err
	}
	if err != nil {
		return state.Record{}, false, fmt.Errorf("forget %q: publish its tombstone: %w", key, err)
	}
	return p.ForgetAt(key, at)
}

// DeadLetterFence implements ownership.Owner: dead letters are not fenced.
func (soleOwner) DeadLetterFence() (*forward.Fence, string) { return nil, "" }
