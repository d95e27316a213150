package state

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/window"
)

// TestOpensDataDirOf1380ad5: a data dir written by main 1380ad5 (records
// with a Badger TTL, a store-wide watermark, first-seen times from the
// host's clock; testdata/datadir-1380ad5.tar.gz, 400 keys over 4
// partitions, first seen a second apart from 2026-12-05T12:00:00Z with a
// window of 20 years and an hour) opens and keeps every key: each is a
// repeat of a copy within W of it, with its fingerprint and output
// sequence, and a new key is New.
func TestOpensDataDirOf1380ad5(t *testing.T) {
	dir := t.TempDir()
	untar(t, filepath.Join("testdata", "datadir-1380ad5.tar.gz"), dir)
	w, err := window.Derive([]window.Path{{Name: "long", Max: 20 * 365 * 24 * time.Hour}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	opts := DefaultOptions(dir, w)
	opts.Partitions = 4
	opts.MemoryBudget = 32 << 20
	opts.Filter.ExpectedKeys = 10000
	opts.Clock = brokenClock{t}
	s := openStore(t, opts)
	assertSources(t, s, SourceSnapshot)
	first := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for i := range 400 {
		k := []byte(fmt.Sprintf("key-%03d", i))
		r, err := s.Partition(PartitionOf(k, 4)).Lookup(k, first.Add(time.Duration(i)*time.Second+time.Hour))
		want := first.Add(time.Duration(i) * time.Second)
		if err != nil || !r.Found || !r.Record.FirstSeen.Equal(want) || r.Record.Fingerprint != uint64(i) || r.Record.OutputSeq != uint64(i+1) {
			t.Fatalf("Lookup(%s) = %+v, %v; want Found, first seen %v, fingerprint %d, output sequence %d", k, r, err, want, i, i+1)
		}
	}
	k := []byte("new key")
	res, err := s.Partition(PartitionOf(k, 4)).Claim([]Claim{{Key: k, At: first.Add(time.Hour)}})
	if err != nil || !res[0].New {
		t.Fatalf("Claim(new key) = %+v, %v; want New", res, err)
	}
}
