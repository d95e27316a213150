package state

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestWatermark stores the watermark with claims and alone: it is read
// back after a reopen that rebuilds every filter, it is no record of any
// partition, and a load cancelled in the last partition (DropPrefix of its
// keyspace) leaves it.
func TestWatermark(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions(t, dir, 4)
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	watermark := func(s *Store, want uint64, wantOK bool) {
		t.Helper()
		if got, ok, err := s.Watermark(); err != nil || got != want || ok != wantOK {
			t.Fatalf("Watermark() = %d, %v, %v; want %d, %v", got, ok, err, want, wantOK)
		}
	}
	watermark(s, 0, false)
	keys := testKeys("wm", 200)
	claims := make([][]Claim, s.Partitions())
	for i, k := range keys {
		p := PartitionOf(k, s.Partitions())
		claims[p] = append(claims[p], Claim{Key: k, Fingerprint: uint64(i)})
	}
	if _, err := s.Partition(0).ClaimWithWatermark(claims[0], 40); err != nil {
		t.Fatal(err)
	}
	watermark(s, 40, true)
	if _, err := s.Partition(1).ClaimWithWatermark(claims[1], 0); err != nil {
		t.Fatal(err)
	}
	watermark(s, 40, true) // 0 leaves it
	if _, err := s.Partition(2).Claim(claims[2]); err != nil {
		t.Fatal(err)
	}
	watermark(s, 40, true)
	if _, err := s.Partition(3).ClaimWithWatermark(claims[3], 30); err != nil {
		t.Fatal(err)
	}
	watermark(s, 30, true) // blind: an older value landing later stands
	if err := s.SetWatermark(75); err != nil {
		t.Fatal(err)
	}
	watermark(s, 75, true)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Watermark(); err != ErrClosed {
		t.Errorf("Watermark() on a closed store: %v, want ErrClosed", err)
	}

	// A reopen that rebuilds every filter from a full scan: exactly the
	// keys, and the watermark as stored.
	for i := range opts.Partitions {
		mustRemove(t, filepath.Join(PartitionDir(dir, i), SnapshotFile))
	}
	s = openStore(t, opts)
	watermark(s, 75, true)
	var scanned uint64
	for i := range s.Partitions() {
		b := s.Partition(i).FilterBuild()
		if b.Source != SourceRebuild {
			t.Errorf("partition %d: filter from %v, want a rebuild", i, b.Source)
		}
		scanned += b.Scanned
	}
	if scanned != uint64(len(keys)) {
		t.Errorf("rebuilds scanned %d records, want %d", scanned, len(keys))
	}
	assertAllSeen(t, s, keys)
	if _, _, found, err := s.Find(watermarkKey); found || err != nil {
		t.Errorf("Find found the watermark as a record (err %v)", err)
	}
	last := s.Partition(s.Partitions() - 1) // the keyspace next to the store's
	n := 0
	if err := last.ScanRecords(context.Background(), func(uint64) error { return nil }, func([]byte, Record) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if want := len(claims[s.Partitions()-1]); n != want {
		t.Errorf("the last partition's scan saw %d records, want %d", n, want)
	}
	watermark(s, 75, true)
}

// TestWatermarkSurvivesACancelledLoad cancels a load of the last
// partition, which drops its keyspace (DropPrefix): the store's
// watermark, in a keyspace of its own, stays.
func TestWatermarkSurvivesACancelledLoad(t *testing.T) {
	s := openStore(t, testOptions(t, t.TempDir(), 4))
	if err := s.SetWatermark(9); err != nil {
		t.Fatal(err)
	}
	l, err := s.Partition(3).NewLoader()
	if err != nil {
		t.Fatalf("NewLoader on a store holding only the watermark: %v", err)
	}
	if err := l.Add([]Restored{{Key: []byte("k"), FirstSeen: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Cancel(); err != nil {
		t.Fatal(err)
	}
	if w, ok, err := s.Watermark(); err != nil || !ok || w != 9 {
		t.Errorf("Watermark() after a cancelled load = %d, %v, %v; want 9", w, ok, err)
	}
}

// TestWatermarkConcurrentClaims claims in every partition at once, each
// claim storing the watermark: no commit conflicts with another, every key
// is stored, and the watermark is one of the values written.
func TestWatermarkConcurrentClaims(t *testing.T) {
	const partitions, batches, perBatch = 8, 50, 20
	s := openStore(t, testOptions(t, t.TempDir(), partitions))
	var wg sync.WaitGroup
	errs := make(chan error, partitions)
	var all [][]byte
	for p := range partitions {
		keys := make([][]byte, 0, batches*perBatch)
		for b := range batches {
			for i := range perBatch {
				keys = append(keys, fmt.Appendf(nil, "p%d-b%d-%d", p, b, i))
			}
		}
		all = append(all, keys...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			part := s.Partition(p)
			for b := range batches {
				claims := make([]Claim, perBatch)
				for i := range claims {
					claims[i] = Claim{Key: keys[b*perBatch+i]}
				}
				res, err := part.ClaimWithWatermark(claims, uint64(1+p*batches+b))
				if err != nil {
					errs <- fmt.Errorf("partition %d batch %d: %w", p, b, err)
					return
				}
				for i, r := range res {
					if !r.New {
						errs <- fmt.Errorf("partition %d batch %d claim %d: not New", p, b, i)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, k := range all {
		rec, _, found, err := s.Find(k)
		if err != nil || !found || rec.FirstSeen.IsZero() {
			t.Fatalf("Find(%q) = %+v, %v, %v; want the record", k, rec, found, err)
		}
	}
	w, ok, err := s.Watermark()
	if err != nil || !ok || w < 1 || w > partitions*batches {
		t.Errorf("Watermark() = %d, %v, %v; want one of the values written, 1..%d", w, ok, err, partitions*batches)
	}
}
