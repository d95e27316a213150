package stage

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// errNotOwner means this instance does not own the key's partition: the
// forget is the owner's to apply, and this instance answers Owner false.
var errNotOwner = errors.New("stage: not the partition's owner")

// Forgot is what Stage.Forget did.
type Forgot struct {
	// Key is the key forgotten, as stored (with its scope prefix).
	Key string `json:"key"`
	// Held is true when the stage held the key (a record inside the
	// window, not forgotten before) and forgot it; false means nothing
	// changed.
	Held bool `json:"held"`
	// Owner is true when this instance owns the key's partition and so
	// decided the forget: always for a single instance; in a group, when
	// the key was found in a partition this instance holds now. Another
	// instance's answer changes nothing.
	Owner bool `json:"owner"`
	// Partition is the key's partition, when Held.
	Partition *int `json:"partition,omitempty"`
	// FirstSeen is when the forgotten record's key was first seen, when
	// Held.
	FirstSeen *time.Time `json:"first_seen,omitempty"`
	// Applied is when the forget was applied (the stage's clock): the
	// first copy judged after it is forwarded.
	Applied time.Time `json:"applied_at"`
	Coverage
}

// Coverage says which partitions an instance owned when it answered, so
// that a client asking every instance of a group knows when the owners of
// all partitions have answered: once they have, and none holds the key,
// no instance does (admin.Client).
type Coverage struct {
	// Partitions is the partition count; 0 from an instance that does not
	// say (an older version).
	Partitions int `json:"partitions"`
	// Owned lists the partitions this instance owned when it answered: all
	// of them for a single instance, none for an instance of a group that
	// owns nothing yet.
	Owned []int `json:"owned"`
}

// Forget makes the next copy of key (the full key as stored, with its
// scope prefix) be forwarded again: the owner of the key's partition marks
// its record forgotten between two of the partition's batches, and the
// forget holds after a restart (state.Partition.Forget). In a group the
// owner first writes a tombstone to the partition's changelog, expecting
// its fence, so that a new owner restores the forget (docs/admin.md). A
// key the stage does not hold is answered Held false; an instance of a
// group that does not own the key's partition answers Owner false.
func (s *Stage) Forget(ctx context.Context, key string) (Forgot, error) {
	if err := checkAdminKey(key); err != nil {
		return Forgot{}, err
	}
	out := Forgot{Key: key, Owner: s.src.holds(-1)}
	lost := -1 // a partition whose tenure the forget found ended
	_, p, found, err := s.store.Find([]byte(key))
	if err != nil {
		return Forgot{}, fmt.Errorf("forget %q: %w", key, err)
	}
	if found && s.src.holds(p) {
		done, err := s.turns.wait(ctx, p)
		if err != nil {
			return Forgot{}, fmt.Errorf("forget %q: %w", key, err)
		}
		defer done()
		rec, held, err := s.owners[p].Forget(ctx, s.store.Partition(p), []byte(key))
		switch {
		case errors.Is(err, errNotOwner):
			out.Owner, lost = false, p
		case err != nil:
			return Forgot{}, fmt.Errorf("forget %q: %w", key, err)
		default:
			out.Owner = true
		}
		if held {
			first := rec.FirstSeen.UTC()
			out.Held, out.Partition, out.FirstSeen, out.Applied = true, &p, &first, rec.Forgotten.UTC()
			out.Coverage = s.coverage(lost)
			s.log.Info("key forgotten by an operator; its next copy is forwarded", "key", key, "partition", p, "first_seen", first)
			return out, nil
		}
	}
	out.Applied = s.clock.Now().UTC()
	out.Coverage = s.coverage(lost)
	return out, nil
}

// coverage returns the partitions this instance owns now, leaving out
// lost, a partition whose tenure it found ended (-1: none).
func (s *Stage) coverage(lost int) Coverage {
	c := Coverage{Partitions: s.store.Partitions(), Owned: []int{}}
	for p := range c.Partitions {
		if p != lost && s.src.holds(p) {
			c.Owned = append(c.Owned, p)
		}
	}
	return c
}

// checkAdminKey refuses a key the store cannot hold, as ErrBadInspectKey.
func checkAdminKey(key string) error {
	if key == "" || len(key) > state.MaxKeySize {
		return fmt.Errorf("%w: %d bytes, want 1 to %d", ErrBadInspectKey, len(key), state.MaxKeySize)
	}
	return nil
}

// Answer is one instance's answer about a key: the inspection of its store,
// whether it owns the key's partition, and which partitions it owns.
type Answer struct {
	Inspection
	// Owner is true when this instance owns the key's partition: always
	// for a single instance; in a group, when the key was found in a
	// partition this instance holds now.
	Owner bool `json:"owner"`
	Coverage
}

// Inspect inspects key in the stage's store (Health.Inspect) and says
// whether this instance owns the key's partition, and which partitions it
// owns.
func (s *Stage) Inspect(key string) (Answer, error) {
	if err := checkAdminKey(key); err != nil {
		return Answer{}, err
	}
	in, err := s.status.Inspect(key)
	if err != nil {
		return Answer{}, err
	}
	p := -1
	if in.Found {
		p = in.Partition
	}
	return Answer{Inspection: in, Owner: s.src.holds(p), Coverage: s.coverage(-1)}, nil
}

// InstanceStatus is an instance's status as the admin service reports it.
type InstanceStatus struct {
	// Ready is true once every filter is ready, while the stage runs.
	Ready bool `json:"ready"`
	// Problem lists what keeps failing; "" when healthy.
	Problem string `json:"problem,omitempty"`
	// Window is the dedupe window W.
	Window string `json:"window"`
	// Partitions is the partition count.
	Partitions int `json:"partitions"`
	// Owned lists the partitions this instance owns now: all of them for a
	// single instance.
	Owned []int `json:"owned"`
	// Restoring maps partitions being restored to the records read back.
	Restoring map[int]int `json:"restoring,omitempty"`
	// KeysInFilters is how many keys the filters hold.
	KeysInFilters uint64 `json:"keys_in_filters"`
}

// Status returns the instance's status.
func (s *Stage) Status() InstanceStatus {
	c := s.coverage(-1)
	st := InstanceStatus{Ready: s.status.Ready(), Window: s.win.W.String(), Partitions: c.Partitions,
		Restoring: s.status.Restoring(), KeysInFilters: s.store.Stats().FilterKeys, Owned: c.Owned}
	if err := s.status.Healthy(); err != nil {
		st.Problem = err.Error()
	}
	return st
}
