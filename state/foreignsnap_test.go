package state

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// claimInCommits claims keys prefix-0..n-1 on partition 0, one Badger
// commit per key, so that the store's versions run up to about n.
func claimInCommits(tb testing.TB, opts Options, prefix string, n int) [][]byte {
	tb.Helper()
	s, err := Open(context.Background(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	var keys [][]byte
	for i := range n {
		k := fmt.Appendf(nil, "%s-%d", prefix, i)
		if _, err := s.Partition(0).Claim([]Claim{{Key: k, Fingerprint: 1}}); err != nil {
			tb.Fatal(err)
		}
		keys = append(keys, k)
	}
	if err := s.Close(); err != nil { // writes the snapshot
		tb.Fatal(err)
	}
	return keys
}

// An intact snapshot of another partition or store, covering a version the
// store has reached, passes every check on its own; its top-up adds only
// the records written after that version, so the records before it would
// be "definitely not seen". The faults package's snapshot test found this
// by swapping partitions' snapshots.
func TestRestartSnapshotOfAnotherStore(t *testing.T) {
	ours := testOptions(t, t.TempDir(), 1)
	keys := claimInCommits(t, ours, "ours", 300)
	theirs := testOptions(t, t.TempDir(), 1)
	claimInCommits(t, theirs, "theirs", 200)

	snap, err := os.ReadFile(filepath.Join(PartitionDir(theirs.Dir, 0), SnapshotFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(PartitionDir(ours.Dir, 0), SnapshotFile), snap, 0o644); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, ours)
	assertSources(t, s, SourceRebuild)
	if r := s.Partition(0).FilterBuild().Reason; !strings.Contains(r, "not this partition's") {
		t.Errorf("rebuild reason %q, want it to say the snapshot is not this partition's", r)
	}
	assertAllSeen(t, s, keys)
}
