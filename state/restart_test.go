package state

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// Restart safety: after any restart, no claimed, unexpired key may get a
// "definitely not" from its filter.

const restartKeys = 20_000

func TestRestartCleanClose(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions(t, dir, 4)
	keys := testKeys("clean", restartKeys)
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	claimAll(t, s, keys)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, opts)
	assertSources(t, s, SourceSnapshot)
	assertAllSeen(t, s, keys)
}

func TestRestartCopyWithoutClose(t *testing.T) {
	opts := testOptions(t, t.TempDir(), 4)
	opts.SyncWrites = true
	s := openStore(t, opts)
	keys := testKeys("crash", restartKeys)
	claimAll(t, s, keys)

	// The copy holds what a kill -9 leaves: no snapshot, the memtable only
	// in Badger's write-ahead log and a stale LOCK file. Badger locks with
	// flock on the directory and only rewrites LOCK (a pid file), so the
	// copy opens without removing it.
	copied := filepath.Join(t.TempDir(), "copy")
	copyDir(t, opts.Dir, copied)
	if _, err := os.Stat(filepath.Join(copied, BadgerDir, "LOCK")); err != nil {
		t.Fatalf("the copy has no stale LOCK file: %v", err)
	}
	copyOpts := opts
	copyOpts.Dir = copied
	c := openStore(t, copyOpts)
	assertSources(t, c, SourceRebuild)
	assertAllSeen(t, c, keys)
}

func TestRestartRebuild(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, snap string)
		reason string // in the warn line's err
	}{
		{
			name:   "snapshot deleted",
			damage: func(t *testing.T, snap string) { mustRemove(t, snap) },
			reason: "no such file",
		},
		{
			name: "snapshot byte flipped",
			damage: func(t *testing.T, snap string) {
				b, err := os.ReadFile(snap)
				if err != nil {
					t.Fatal(err)
				}
				b[len(b)/2] ^= 0x40
				if err := os.WriteFile(snap, b, 0o644); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "snapshot truncated",
			damage: func(t *testing.T, snap string) {
				if err := os.Truncate(snap, 10); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			opts := testOptions(t, dir, 4)
			keys := testKeys("rebuild", restartKeys)
			s, err := Open(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			claimAll(t, s, keys)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			for i := range 4 {
				tt.damage(t, filepath.Join(PartitionDir(dir, i), SnapshotFile))
			}
			rec := &logRecorder{}
			opts.Logger = slog.New(rec)
			s = openStore(t, opts)
			assertSources(t, s, SourceRebuild)
			if n := rec.count("WARN", "snapshot unusable", tt.reason); n != 4 {
				t.Errorf("%d warn lines about an unusable snapshot (with %q), want 4: %q", n, tt.reason, rec.records)
			}
			assertAllSeen(t, s, keys)
		})
	}
}

func TestRestartSnapshotMismatchedOptions(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions(t, dir, 2)
	keys := testKeys("mismatch", 2000)
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	claimAll(t, s, keys)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	opts.Filter.ExpectedKeys *= 2
	s = openStore(t, opts)
	assertSources(t, s, SourceRebuild)
	assertAllSeen(t, s, keys)
}

func TestRestartSnapshotTopUp(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions(t, dir, 4)
	opts.SyncWrites = true
	older := testKeys("older", restartKeys/2)
	newer := testKeys("newer", restartKeys/2)
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	claimAll(t, s, older)
	if err := s.Close(); err != nil { // writes the snapshots
		t.Fatal(err)
	}
	s = openStore(t, opts)
	assertSources(t, s, SourceSnapshot)
	claimAll(t, s, newer) // after the snapshot

	copied := filepath.Join(t.TempDir(), "copy")
	copyDir(t, dir, copied)
	copyOpts := opts
	copyOpts.Dir = copied
	c := openStore(t, copyOpts)
	assertSources(t, c, SourceSnapshotTopUp)
	var topped uint64
	for i := range 4 {
		topped += c.Partition(i).FilterBuild().Added
	}
	if topped != uint64(len(newer)) {
		t.Errorf("top-up added %d records, want exactly the %d written after the snapshot", topped, len(newer))
	}
	assertAllSeen(t, c, older)
	assertAllSeen(t, c, newer)
}

func TestRestartSnapshotAheadOfStore(t *testing.T) {
	// A snapshot that covers versions the store no longer has (writes lost
	// after it) cannot prove its top-up complete: it must be rebuilt.
	dir := t.TempDir()
	opts := testOptions(t, dir, 1)
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	claimAll(t, s, testKeys("early", 10))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Keep the partition before the next writes; put the later snapshot
	// over it.
	early := filepath.Join(t.TempDir(), "early")
	copyDir(t, dir, early)
	s, err = Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	claimAll(t, s, testKeys("late", 10))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	snap, err := os.ReadFile(filepath.Join(PartitionDir(dir, 0), SnapshotFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(PartitionDir(early, 0), SnapshotFile), snap, 0o644); err != nil {
		t.Fatal(err)
	}
	rec := &logRecorder{}
	earlyOpts := opts
	earlyOpts.Dir, earlyOpts.Logger = early, slog.New(rec)
	e := openStore(t, earlyOpts)
	assertSources(t, e, SourceRebuild)
	if n := rec.count("WARN", "store ends at version"); n != 1 {
		t.Errorf("%d warn lines about a snapshot ahead of the store, want 1: %q", n, rec.records)
	}
	assertAllSeen(t, e, testKeys("early", 10))
}

func mustRemove(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}
