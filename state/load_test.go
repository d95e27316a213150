package state

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/window"
)

// loadRecords returns n records of sorted keys, as a snapshot holds them:
// every 10th first seen outside the window at now, the others inside it.
func loadRecords(now time.Time, w time.Duration, n int) []Restored {
	recs := make([]Restored, n)
	for i, k := range testKeys("loaded", n) {
		recs[i] = Restored{Key: k, Fingerprint: uint64(i) + 1, FirstSeen: now.Add(-time.Duration(i) * w / time.Duration(2*n))}
		if i%10 == 9 {
			recs[i].FirstSeen = now.Add(-w - time.Second)
		}
	}
	return recs
}

// loadAll loads recs into p in chunks of 512 and finishes with cursor.
func loadAll(t *testing.T, p *Partition, recs []Restored, cursor uint64) {
	t.Helper()
	ld, err := p.NewLoader()
	if err != nil {
		t.Fatalf("NewLoader: %v", err)
	}
	defer ld.Cancel()
	for start := 0; start < len(recs); start += 512 {
		if err := ld.Add(recs[start:min(len(recs), start+512)]); err != nil {
			t.Fatalf("Add: %v", err)
		}
	}
	if err := ld.Finish(cursor); err != nil {
		t.Fatalf("Finish: %v", err)
	}
}

// TestLoaderStoresWhatRestoreWould loads records into an empty partition
// and restores the same records into another: every key reads back the
// same from both (a record outside the window is stored by neither), the
// cursor is the one given, a loaded key is a repeat and a new key new, and
// so it stays across a reopen that loads the filter snapshot, one that
// rebuilds the filter, and one that finds the filter snapshot written
// before the load.
func TestLoaderStoresWhatRestoreWould(t *testing.T) {
	filterOnAndOff(t, func(t *testing.T, opts Options, clock *window.ManualClock) {
		now, w := clock.Now(), opts.Window.W
		recs := loadRecords(now, w, 3000)
		ref := openStore(t, func() Options { o := opts; o.Dir = t.TempDir(); return o }()).Partition(0)
		// The input's clock at now: a record whose window ended before it
		// is stored by neither.
		setInputClock(t, ref, now)
		if err := ref.Restore(recs, 777); err != nil {
			t.Fatal(err)
		}

		// A filter snapshot written before the load, at the store's
		// first version.
		s, err := Open(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		snap := filepath.Join(PartitionDir(opts.Dir, 0), SnapshotFile)
		before, err := os.ReadFile(snap)
		if err != nil && !opts.DisableFilter {
			t.Fatal(err)
		}
		s, err = Open(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		setInputClock(t, s.Partition(0), now)
		loadAll(t, s.Partition(0), recs, 777)

		check := func(p *Partition, when string) {
			t.Helper()
			for _, r := range recs {
				got, err := p.Lookup(r.Key, time.Time{})
				want, werr := ref.Lookup(r.Key, time.Time{})
				if err != nil || werr != nil || got.Found != want.Found || !got.Record.FirstSeen.Equal(want.Record.FirstSeen) || got.Record.Fingerprint != want.Record.Fingerprint {
					t.Fatalf("%s: Lookup(%q) = %+v, %v; Restore's partition says %+v, %v", when, r.Key, got, err, want, werr)
				}
			}
			if c, err := p.Cursor(); err != nil || c != 777 {
				t.Errorf("%s: Cursor() = %d, %v; want 777", when, c, err)
			}
		}
		check(s.Partition(0), "after the load")
		if _, _, found, err := s.Find(recs[9].Key); err != nil || found {
			t.Errorf("Find of a record outside the window = %v, %v; want not stored", found, err)
		}
		if !opts.DisableFilter {
			if st := s.Partition(0).Stats(); st.FilterKeys < 2700 {
				t.Errorf("FilterKeys = %d, want the 2700 keys inside the window", st.FilterKeys)
			}
		}
		res, err := s.Partition(0).Claim([]Claim{{Key: recs[500].Key, Fingerprint: 9}, {Key: []byte("fresh"), Fingerprint: 9}})
		if err != nil || res[0].New || res[0].Existing.Fingerprint != recs[500].Fingerprint || !res[1].New {
			t.Fatalf("Claim of a loaded key and a new one = %+v, %v; want a repeat of fingerprint %d, then New", res, err, recs[500].Fingerprint)
		}
		if _, err := ref.Claim([]Claim{{Key: []byte("fresh"), Fingerprint: 9}}); err != nil {
			t.Fatal(err)
		}
		for i, reopen := range []func(){
			func() {}, // the snapshot Close wrote
			func() { // none: the filter is rebuilt
				if err := os.Remove(snap); err != nil && !opts.DisableFilter {
					t.Fatal(err)
				}
			},
			func() { // the one written before the load
				if before != nil {
					if err := os.WriteFile(snap, before, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			},
		} {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			reopen()
			if s, err = Open(context.Background(), opts); err != nil {
				t.Fatal(err)
			}
			check(s.Partition(0), []string{"reopened", "reopened without a filter snapshot", "reopened with the filter snapshot from before the load"}[i])
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestLoaderRefuses: a partition that holds a key is not loaded in bulk;
// keys out of order, a record without FirstSeen or with a total are
// refused, and Cancel leaves the partition empty, to be loaded again,
// and the other partitions as they were.
func TestLoaderRefuses(t *testing.T) {
	opts := testOptions(t, t.TempDir(), 2)
	clock := window.NewManualClock(time.Now())
	opts.Clock = clock
	s := openStore(t, opts)
	now, w := clock.Now(), opts.Window.W

	held := s.Partition(1)
	if _, err := held.Claim([]Claim{{Key: []byte("held"), Fingerprint: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := held.NewLoader(); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("NewLoader of a partition holding a key: %v, want ErrNotEmpty", err)
	}
	if _, err := held.Claim([]Claim{{Key: []byte("held-too"), Fingerprint: 1}}); err != nil {
		t.Fatalf("Claim after a refused NewLoader: %v (the partition must be given back)", err)
	}

	p := s.Partition(0)
	recs := loadRecords(now, w, 100)
	for name, bad := range map[string][]Restored{
		"out of order":   {recs[5], recs[4]},
		"a key twice":    {recs[4], recs[4]},
		"no first seen":  {{Key: []byte("x"), Fingerprint: 1}},
		"a contribution": {{Key: []byte("x"), Fingerprint: 1, FirstSeen: now, Total: Contribution{Group: "g", Bucket: now.Truncate(time.Hour), Value: 1}}},
	} {
		ld, err := p.NewLoader()
		if err != nil {
			t.Fatalf("%s: NewLoader of an empty partition: %v", name, err)
		}
		if err := ld.Add(bad); !errors.Is(err, ErrBadRestore) {
			t.Errorf("%s: Add = %v, want ErrBadRestore", name, err)
		}
		if err := ld.Cancel(); err != nil {
			t.Fatalf("%s: Cancel: %v", name, err)
		}
		for _, r := range bad {
			if len(r.Key) == 0 {
				continue
			}
			if got, err := p.Lookup(r.Key, time.Time{}); err != nil || got.Found {
				t.Errorf("%s: Lookup(%q) after Cancel = %+v, %v; want not found", name, r.Key, got, err)
			}
		}
	}
	// Cancel drops the cancelled load's keyspace only: the partition that
	// shares the Badger instance keeps its keys.
	for _, k := range []string{"held", "held-too"} {
		if got, err := held.Lookup([]byte(k), time.Time{}); err != nil || !got.Found {
			t.Errorf("Lookup(%q) in the other partition after Cancels = %+v, %v; want found", k, got, err)
		}
	}
	loadAll(t, p, recs, 42)
	if c, err := p.Cursor(); err != nil || c != 42 {
		t.Errorf("Cursor() after a load that followed cancelled ones = %d, %v; want 42", c, err)
	}
	if got, err := p.Lookup(recs[0].Key, time.Time{}); err != nil || !got.Found {
		t.Errorf("Lookup of a loaded key = %+v, %v; want found", got, err)
	}
}
