package stage

import (
	"context"
	"errors"
	"fmt"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
	"github.com/dedupe-stage/dedupe-stage/internal/ownership"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// turns lets one batch or one operator action at a time work on each
// partition: a forget waits for the batch in flight and the next batch
// waits for the forget, so that it never races a batch judging the key.
type turns []chan struct{}

func newTurns(partitions int) turns {
	t := make(turns, partitions)
	for i := range t {
		t[i] = make(chan struct{}, 1)
	}
	return t
}

// take waits for partition p's turn and returns what ends it.
func (t turns) take(p int) func() {
	t[p] <- struct{}{}
	return func() { <-t[p] }
}

// wait is take that gives up when ctx ends first.
func (t turns) wait(ctx context.Context, p int) (func(), error) {
	select {
	case t[p] <- struct{}{}:
		return func() { <-t[p] }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for partition %d's batch in flight: %w", p, ctx.Err())
	}
}

// Forget makes the next copy of key (the full key as stored, with its
// scope prefix) be forwarded again: the owner of the key's partition marks
// its record forgotten between two of the partition's batches, and the
// forget holds after a restart (state.Partition.Forget). In a group the
// owner first writes a tombstone to the partition's changelog, expecting
// its fence, so that a new owner restores the forget (docs/admin.md). A
// key the stage does not hold is answered Held false; an instance of a
// group that does not own the key's partition answers Owner false.
func (s *Stage) Forget(ctx context.Context, key string) (admin.Forgot, error) {
	if err := checkAdminKey(key); err != nil {
		return admin.Forgot{}, err
	}
	out := admin.Forgot{Key: key, Owner: s.src.holds(-1)}
	lost := -1 // a partition whose tenure the forget found ended
	_, p, found, err := s.store.Find([]byte(key))
	if err != nil {
		return admin.Forgot{}, fmt.Errorf("forget %q: %w", key, err)
	}
	if found && s.src.holds(p) {
		done, err := s.turns.wait(ctx, p)
		if err != nil {
			return admin.Forgot{}, fmt.Errorf("forget %q: %w", key, err)
		}
		defer done()
		rec, held, err := s.owners[p].Forget(ctx, s.store.Partition(p), []byte(key))
		switch {
		case errors.Is(err, ownership.ErrNotOwner):
			out.Owner, lost = false, p
		case err != nil:
			return admin.Forgot{}, fmt.Errorf("forget %q: %w", key, err)
		default:
			out.Owner = true
		}
		if held {
			first := rec.FirstSeen.UTC()
			out.Held, out.Partition, out.FirstSeen, out.Applied = true, &p, &first, rec.Forgotten.UTC()
			out.Coverage = s.coverage(ctx, lost)
			s.log.Info("key forgotten by an operator; its next copy is forwarded", "key", key, "partition", p, "first_seen", first)
			return out, nil
		}
	}
	out.Applied = s.clock.Now().UTC()
	out.Coverage = s.coverage(ctx, lost)
	return out, nil
}

// coverage returns the partitions this instance owns now, leaving out
// lost, a partition whose tenure it found ended (-1: none), and, in a
// group, any whose fence is no longer this instance's (source.confirms).
// The admin client stops asking once the answers cover every partition,
// so a partition claimed here that another instance has taken would end
// an inspect or a forget before that instance, which holds the key,
// answers.
func (s *Stage) coverage(ctx context.Context, lost int) admin.Coverage {
	c := admin.Coverage{Partitions: s.store.Partitions(), Owned: []int{}}
	for p := range c.Partitions {
		if p != lost && s.src.confirms(ctx, p) {
			c.Owned = append(c.Owned, p)
		}
	}
	return c
}

// checkAdminKey refuses a key the store cannot hold, as admin.ErrBadInspectKey.
func checkAdminKey(key string) error {
	if key == "" || len(key) > state.MaxKeySize {
		return fmt.Errorf("%w: %d bytes, want 1 to %d", admin.ErrBadInspectKey, len(key), state.MaxKeySize)
	}
	return nil
}

// Inspect inspects key in the stage's store (Health.Inspect) and says
// whether this instance owns the key's partition, and which partitions it
// owns.
func (s *Stage) Inspect(ctx context.Context, key string) (admin.Answer, error) {
	if err := checkAdminKey(key); err != nil {
		return admin.Answer{}, err
	}
	in, err := s.status.Inspect(key)
	if err != nil {
		return admin.Answer{}, err
	}
	p := -1
	if in.Found {
		p = in.Partition
	}
	return admin.Answer{Inspection: in, Owner: s.src.holds(p), Coverage: s.coverage(ctx, -1)}, nil
}

// Status returns the instance's status, with what it has judged
// (Traffic) for `dedupe-stage top`.
func (s *Stage) Status() admin.InstanceStatus {
	owned := []int{} // as this instance has it, unconfirmed: status reads many partitions of many instances
	for p := range s.store.Partitions() {
		if s.src.holds(p) {
			owned = append(owned, p)
		}
	}
	st := admin.InstanceStatus{Ready: s.status.Ready(), Window: s.win.W.String(), Partitions: s.store.Partitions(),
		Restoring: s.status.Restoring(), KeysInFilters: s.store.Stats().FilterKeys, Owned: owned, Traffic: s.traffic()}
	if err := s.status.Healthy(); err != nil {
		st.Problem = err.Error()
	}
	return st
}
