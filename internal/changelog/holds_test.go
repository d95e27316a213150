package changelog_test

import (
	"context"
	"testing"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
)

// TestHoldsSeesAPartitionsRecords: Holds answers false for a partition
// with nothing in the output, though its fence and other partitions'
// records are there, and true once the partition has a forward (matched
// by the wildcard filter) or a key-state record.
func TestHoldsSeesAPartitionsRecords(t *testing.T) {
	js := outStream(t)
	ctx := context.Background()
	holds := func(p int) bool {
		t.Helper()
		ok, err := changelog.Holds(ctx, js, "OUT", changelog.PartitionFilter(prefix, p), changelog.KeyStateSubject(prefix, p))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if holds(1) {
		t.Fatal("an empty stream holds partition 1's records")
	}
	if _, err := changelog.Take(ctx, js, "OUT", changelog.FenceSubject(prefix, 1), "a"); err != nil {
		t.Fatal(err)
	}
	if who, err := changelog.FenceHolder(ctx, js, "OUT", changelog.FenceSubject(prefix, 1)); err != nil || who != "a" {
		t.Errorf("partition 1's fence holder: %q, %v; want a", who, err)
	}
	publishRecords(t, js, 2, 0, 3)
	if holds(1) {
		t.Error("partition 1 holds records with only its fence and partition 2's records in the stream")
	}
	if !holds(2) {
		t.Error("partition 2 holds no records after three forwards")
	}
	if _, err := js.Publish(ctx, changelog.KeyStateSubject(prefix, 3), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if !holds(3) {
		t.Error("partition 3 holds no records after a key-state record")
	}
}
