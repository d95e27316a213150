package state

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/dedupe-stage/dedupe-stage/window"
)

// v1Fixture is a data dir written by the version that kept one Badger
// instance per partition directory (029551e): 2 partitions, 50 keys each
// ("p<partition>-key-<i>", fingerprint i, first seen 2026-12-01 10:00:<i>
// UTC), each claim adding 1 to group "g" in the hour bucket of 10:00, and
// cursors 100 and 101, written in one ClaimWithCursor per partition, then
// closed (tables, filter snapshots).
const v1Fixture = "testdata/v1-per-partition.tar.gz"

// v1Options are the options the fixture was written with: a window of a
// century, so its records stay inside it.
func v1Options(t *testing.T, dir string) Options {
	o := testOptions(t, dir, 2)
	o.Window = window.Window{W: 100 * 365 * 24 * time.Hour, NearFraction: 0.8}
	o.Filter.Window = 0 // the store's
	o.Filter.ExpectedKeys = 1000
	o.TotalsBucket = time.Hour
	return o
}

// untar extracts a .tar.gz into dir.
func untar(t *testing.T, path, dir string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(dst, 0o755)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(dst, b, 0o644)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// assertV1Content checks that s holds everything the fixture holds, and
// nothing of one partition in the other.
func assertV1Content(t *testing.T, s *Store) {
	t.Helper()
	bucket := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for p := range 2 {
		part := s.Partition(p)
		for i := range 50 {
			key := fmt.Appendf(nil, "p%d-key-%03d", p, i)
			got, err := part.Lookup(key, time.Time{})
			want := Record{FirstSeen: time.Date(2026, 12, 1, 10, 0, i, 0, time.UTC), Fingerprint: uint64(i)}
			if err != nil || !got.Found || !got.Record.FirstSeen.Equal(want.FirstSeen) || got.Record.Fingerprint != want.Fingerprint {
				t.Fatalf("partition %d: Lookup(%s) = %+v, %v; want the record %+v", p, key, got, err, want)
			}
			if got, err := s.Partition(1-p).Lookup(key, time.Time{}); err != nil || got.Found {
				t.Fatalf("partition %d: Lookup(%s) of the other partition's key = %+v, %v; want not found", 1-p, key, got, err)
			}
		}
		if c, err := part.Cursor(); err != nil || c != uint64(100+p) {
			t.Errorf("partition %d: Cursor() = %d, %v; want %d", p, c, err, 100+p)
		}
		if v, ok, err := part.Total("g", bucket); err != nil || !ok || v != 50 {
			t.Errorf("partition %d: Total(g, %v) = %d, %v, %v; want 50", p, bucket, v, ok, err)
		}
	}
}

// TestMigrateFromInstancePerPartition opens a data dir written with one
// Badger instance per partition: every record, cursor and total is in the
// shared instance, in its partition's keyspace; the old instances and
// their filter snapshots (which cover their versions) are gone, and the
// filters were rebuilt; the layout records the shared store, and a
// reopen finds the same.
func TestMigrateFromInstancePerPartition(t *testing.T) {
	dir := t.TempDir()
	untar(t, v1Fixture, dir)
	opts := v1Options(t, dir)

	s := openStore(t, opts)
	for p := range 2 {
		if b := s.Partition(p).FilterBuild(); b.Source != SourceRebuild || b.Added != 50 {
			t.Errorf("partition %d: filter build %+v, want a rebuild that added 50 keys", p, b)
		}
		entries, err := os.ReadDir(PartitionDir(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if isBadgerFile(e.Name()) || e.Name() == SnapshotFile {
				t.Errorf("partition %d: %s is still there after the move", p, e.Name())
			}
		}
	}
	assertV1Content(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, LayoutFile)); string(b) != "partitions 2\nstore one-badger\n" {
		t.Errorf("LAYOUT after the move = %q", b)
	}

	s = openStore(t, opts)
	for p := range 2 {
		if b := s.Partition(p).FilterBuild(); b.Source != SourceSnapshot {
			t.Errorf("partition %d: filter build after a reopen %+v, want the snapshot", p, b)
		}
	}
	assertV1Content(t, s)
}

// TestMigrateAfterACrash: a move that copied a partition and was killed
// before it removed the old instance copies it again on the next Open:
// the same keys, the same absolute totals (not twice the count), and
// leftovers of a removal cut short are cleared.
func TestMigrateAfterACrash(t *testing.T) {
	dir := t.TempDir()
	untar(t, v1Fixture, dir)
	opts := v1Options(t, dir)

	// Copy both partitions into the shared instance and stop there, as a
	// kill after the copy would: the old instances are still there, and
	// LAYOUT has no store line.
	db, err := openBadger(opts)
	if err != nil {
		t.Fatal(err)
	}
	for p := range 2 {
		if err := migratePartition(context.Background(), opts, db, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	s := openStore(t, opts)
	assertV1Content(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// A table left behind by a removal cut short after the manifest.
	stray := filepath.Join(PartitionDir(dir, 1), "000009.sst")
	if err := os.WriteFile(stray, []byte("left"), 0o644); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, opts)
	assertV1Content(t, s)
	if _, err := os.Stat(stray); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a Badger file left in a partition dir without a manifest is still there: %v", err)
	}
}

// TestMigrateRefusesALockedInstance: an old instance still held by a
// process of the version before is not moved, and Open says which dir is
// held.
func TestMigrateRefusesALockedInstance(t *testing.T) {
	dir := t.TempDir()
	untar(t, v1Fixture, dir)
	opts := v1Options(t, dir)
	held, err := badger.Open(badgerOptions(opts, PartitionDir(dir, 1), opts.Logger))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	_, err = Open(context.Background(), opts)
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), PartitionDir(dir, 1)) {
		t.Fatalf("Open while partition 1's old instance is held: %v, want ErrLocked naming its dir", err)
	}
}
