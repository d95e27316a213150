package state

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/window"
)

func TestLookupHitAndMiss(t *testing.T) {
	for _, disable := range []bool{false, true} {
		name := "filter=on"
		if disable {
			name = "filter=off"
		}
		t.Run(name, func(t *testing.T) {
			opts := testOptions(t, t.TempDir(), 1)
			opts.DisableFilter = disable
			clock := window.NewManualClock(time.Now())
			opts.Clock = clock
			s := openStore(t, opts)
			p := s.Partition(0)

			res, err := p.Claim([]Claim{{Key: []byte("hit"), Fingerprint: 42}})
			if err != nil || len(res) != 1 || !res[0].New {
				t.Fatalf("Claim(hit) = %+v, %v; want one New", res, err)
			}
			hit, err := p.Lookup([]byte("hit"), time.Time{})
			if err != nil {
				t.Fatalf("Lookup(hit): %v", err)
			}
			want := Record{FirstSeen: clock.Now(), Fingerprint: 42}
			if !hit.Found || !hit.Record.FirstSeen.Equal(want.FirstSeen) || hit.Record.Fingerprint != want.Fingerprint || !hit.StoreRead {
				t.Errorf("Lookup(hit) = %+v, want Found with %+v and a store read", hit, want)
			}
			if hit.FilterSaidMaybe == disable {
				t.Errorf("Lookup(hit).FilterSaidMaybe = %v with DisableFilter=%v", hit.FilterSaidMaybe, disable)
			}

			miss, err := p.Lookup([]byte("miss"), time.Time{})
			if err != nil {
				t.Fatalf("Lookup(miss): %v", err)
			}
			if miss.Found {
				t.Errorf("Lookup(miss) = %+v, want not Found", miss)
			}
			// With one key in a filter sized for 100k, a false positive is
			// practically impossible: the miss must not read the store.
			if miss.StoreRead != disable {
				t.Errorf("Lookup(miss).StoreRead = %v with DisableFilter=%v", miss.StoreRead, disable)
			}

			st := p.Stats()
			wantReads := uint64(1)
			if disable {
				wantReads = 2
			}
			if st.Lookups != 2 || st.StoreReads != wantReads || st.Claims != 1 || st.ClaimsNew != 1 || st.FalsePositives != 0 {
				t.Errorf("Stats = %+v, want 2 lookups, %d store reads, 1 claim, 1 new, 0 false positives", st, wantReads)
			}
			if !disable && (st.FilterPositives != 1 || st.FilterNegatives != 1 || st.FilterKeys != 1 || st.FilterBytes == 0) {
				t.Errorf("Stats = %+v, want 1 filter positive, 1 negative, 1 filter key, filter bytes > 0", st)
			}
		})
	}
}

func TestLogicalExpiry(t *testing.T) {
	opts := testOptions(t, t.TempDir(), 1)
	start := time.Now()
	clock := window.NewManualClock(start)
	opts.Clock = clock
	s := openStore(t, opts)
	p := s.Partition(0)
	key := []byte("expiring")

	if res, err := p.Claim([]Claim{{Key: key, Fingerprint: 1}}); err != nil || !res[0].New {
		t.Fatalf("first Claim = %+v, %v; want New", res, err)
	}
	clock.Advance(opts.Window.W - time.Nanosecond)
	if r, err := p.Lookup(key, time.Time{}); err != nil || !r.Found {
		t.Fatalf("Lookup just inside W = %+v, %v; want Found", r, err)
	}
	if res, err := p.Claim([]Claim{{Key: key, Fingerprint: 2}}); err != nil || res[0].New || res[0].Existing.Fingerprint != 1 {
		t.Fatalf("Claim just inside W = %+v, %v; want a repeat of fingerprint 1", res, err)
	}

	clock.Advance(time.Nanosecond) // now == FirstSeen + W: outside
	if r, err := p.Lookup(key, time.Time{}); err != nil || r.Found {
		t.Fatalf("Lookup at FirstSeen+W = %+v, %v; want not Found", r, err)
	}
	// Badger still holds it (physical expiry lags).
	if rec, _, found, err := s.Find(key); err != nil || !found || !rec.FirstSeen.Equal(start) {
		t.Fatalf("Find at FirstSeen+W = %+v, %v, %v; want the old record still stored", rec, found, err)
	}
	res, err := p.Claim([]Claim{{Key: key, Fingerprint: 3}})
	if err != nil || !res[0].New {
		t.Fatalf("Claim after expiry = %+v, %v; want New", res, err)
	}
	r, err := p.Lookup(key, time.Time{})
	if err != nil || !r.Found || !r.Record.FirstSeen.Equal(clock.Now()) || r.Record.Fingerprint != 3 {
		t.Fatalf("Lookup after re-claim = %+v, %v; want FirstSeen %v fingerprint 3", r, err, clock.Now())
	}
}

func TestClaimBatchCopies(t *testing.T) {
	filterOnAndOff(t, func(t *testing.T, opts Options, clock *window.ManualClock) {
		s := openStore(t, opts)
		p := s.Partition(0)

		batch := []Claim{
			{Key: []byte("a"), Fingerprint: 1},
			{Key: []byte("b"), Fingerprint: 2},
			{Key: []byte("a"), Fingerprint: 3},
			{Key: []byte("c"), Fingerprint: 4},
			{Key: []byte("a"), Fingerprint: 5},
			{Key: []byte("b"), Fingerprint: 6},
		}
		wantNew := []bool{true, true, false, true, false, false}
		wantFP := []uint64{0, 0, 1, 0, 1, 2}
		res, err := p.Claim(batch)
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		for i, r := range res {
			if r.New != wantNew[i] || r.Existing.Fingerprint != wantFP[i] {
				t.Errorf("claim %d (%s): %+v, want New=%v existing fingerprint %d", i, batch[i].Key, r, wantNew[i], wantFP[i])
			}
			if !r.New && !r.Existing.FirstSeen.Equal(clock.Now()) {
				t.Errorf("claim %d: existing FirstSeen %v, want %v", i, r.Existing.FirstSeen, clock.Now())
			}
		}

		clock.Advance(time.Minute)
		res, err = p.Claim(batch)
		if err != nil {
			t.Fatalf("second Claim: %v", err)
		}
		for i, r := range res {
			first := map[string]uint64{"a": 1, "b": 2, "c": 4}[string(batch[i].Key)]
			if r.New || r.Existing.Fingerprint != first {
				t.Errorf("second claim %d (%s): %+v, want a repeat of fingerprint %d", i, batch[i].Key, r, first)
			}
		}
		if st := p.Stats(); st.Claims != 12 || st.ClaimsNew != 3 {
			t.Errorf("Stats claims = %d, new = %d; want 12, 3", st.Claims, st.ClaimsNew)
		}
	})
}

func TestClaimSplitsTooBigTxn(t *testing.T) {
	opts := testOptions(t, t.TempDir(), 1)
	opts.MemoryBudget = MinMemoryBudget // 1 MiB memtable: ~1600 writes per Badger txn
	s := openStore(t, opts)
	p := s.Partition(0)
	if n := p.db.MaxBatchCount(); n > 3000 {
		t.Fatalf("Badger max batch count is %d; the test needs a batch beyond it", n)
	}
	keys := testKeys("split", 5000)
	claims := make([]Claim, 0, len(keys)+10)
	for i, k := range keys {
		claims = append(claims, Claim{Key: k, Fingerprint: uint64(i)})
	}
	for i := range 10 { // copies of early keys at the end, across the split
		claims = append(claims, Claim{Key: keys[i], Fingerprint: 99})
	}
	res, err := p.Claim(claims)
	if err != nil {
		t.Fatalf("Claim of %d: %v", len(claims), err)
	}
	nNew := 0
	for i, r := range res {
		if r.New {
			nNew++
		}
		if i >= len(keys) && (r.New || r.Existing.Fingerprint != uint64(i-len(keys))) {
			t.Errorf("copy %d: %+v, want a repeat of fingerprint %d", i, r, i-len(keys))
		}
	}
	if nNew != len(keys) {
		t.Fatalf("%d New, want %d", nNew, len(keys))
	}
	res, err = p.Claim(claims)
	if err != nil {
		t.Fatalf("second Claim: %v", err)
	}
	for i, r := range res {
		if r.New {
			t.Fatalf("second claim %d: New, want a repeat", i)
		}
	}
	assertAllSeen(t, s, keys)
}

func TestBadKeys(t *testing.T) {
	s := openStore(t, testOptions(t, t.TempDir(), 1))
	p := s.Partition(0)
	for _, key := range [][]byte{nil, {}, bytes.Repeat([]byte("x"), MaxKeySize+1)} {
		if _, err := p.Lookup(key, time.Time{}); !errors.Is(err, ErrBadKey) {
			t.Errorf("Lookup(%d bytes) error = %v, want ErrBadKey", len(key), err)
		}
		if _, err := p.Claim([]Claim{{Key: []byte("ok")}, {Key: key}}); !errors.Is(err, ErrBadKey) {
			t.Errorf("Claim(%d bytes) error = %v, want ErrBadKey", len(key), err)
		}
	}
	if r, err := p.Lookup([]byte("ok"), time.Time{}); err != nil || r.Found {
		t.Errorf("Lookup(ok) after a rejected batch = %+v, %v; want nothing stored", r, err)
	}
	if _, err := p.Claim([]Claim{{Key: bytes.Repeat([]byte("x"), MaxKeySize)}}); err != nil {
		t.Errorf("Claim of a MaxKeySize key: %v", err)
	}
}

func TestClosed(t *testing.T) {
	s, err := Open(context.Background(), testOptions(t, t.TempDir(), 2))
	if err != nil {
		t.Fatal(err)
	}
	p := s.Partition(1)
	if _, err := p.Claim([]Claim{{Key: []byte("k")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := p.Lookup([]byte("k"), time.Time{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Lookup after Close: %v, want ErrClosed", err)
	}
	if _, err := p.Claim([]Claim{{Key: []byte("k")}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Claim after Close: %v, want ErrClosed", err)
	}
	if _, _, _, err := s.Find([]byte("k")); !errors.Is(err, ErrClosed) {
		t.Errorf("Find after Close: %v, want ErrClosed", err)
	}
	if st := s.Stats(); st.ClaimsNew != 1 {
		t.Errorf("Stats after Close: ClaimsNew %d, want 1", st.ClaimsNew)
	}
}

func TestFind(t *testing.T) {
	s := openStore(t, testOptions(t, t.TempDir(), 4))
	keys := testKeys("find", 100)
	claimAll(t, s, keys)
	for i, k := range keys {
		rec, part, found, err := s.Find(k)
		if err != nil || !found || part != PartitionOf(k, 4) || rec.Fingerprint != uint64(i) {
			t.Fatalf("Find(%q) = %+v, %d, %v, %v; want fingerprint %d in partition %d", k, rec, part, found, err, i, PartitionOf(k, 4))
		}
	}
	if _, _, found, err := s.Find([]byte("absent")); err != nil || found {
		t.Errorf("Find(absent) = found %v, %v", found, err)
	}
}

func TestPartitionOf(t *testing.T) {
	const p = 8
	counts := make([]int, p)
	for _, k := range testKeys("route", 80_000) {
		i := PartitionOf(k, p)
		if i != PartitionOf(k, p) {
			t.Fatalf("PartitionOf(%q) is not stable", k)
		}
		counts[i]++
	}
	for i, c := range counts {
		if c < 9_000 || c > 11_000 {
			t.Errorf("partition %d got %d of 80000 keys, want about 10000", i, c)
		}
	}
	if got := PartitionOf([]byte("any"), 1); got != 0 {
		t.Errorf("PartitionOf(_, 1) = %d", got)
	}
}

func TestLocked(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, testOptions(t, dir, 2))
	_, err := Open(context.Background(), testOptions(t, dir, 2))
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open of %s: %v, want ErrLocked", dir, err)
	}
	if !strings.Contains(err.Error(), dir) {
		t.Errorf("error %q does not name the dir %s", err, dir)
	}
	// The failed open must leave the first store working.
	if res, err := s.Partition(0).Claim([]Claim{{Key: []byte("still")}}); err != nil || !res[0].New {
		t.Fatalf("Claim on the first store after a failed second Open = %+v, %v", res, err)
	}
}

func TestUnusableDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{file, filepath.Join(file, "data")} {
		_, err := Open(context.Background(), testOptions(t, dir, 2))
		if err == nil {
			t.Fatalf("Open(%s) succeeded, want an error", dir)
		}
		if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "not usable") {
			t.Errorf("Open(%s) error %q does not say the dir is not usable", dir, err)
		}
	}
}

func TestLayout(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(context.Background(), testOptions(t, dir, 2))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, LayoutFile)); err != nil || string(b) != "partitions 2\nstore one-badger\n" {
		t.Fatalf("LAYOUT = %q, %v; want \"partitions 2\\nstore one-badger\\n\"", b, err)
	}
	for _, p := range []int{1, 3} {
		if _, err := Open(context.Background(), testOptions(t, dir, p)); !errors.Is(err, ErrLayout) {
			t.Errorf("Open with %d partitions over a 2-partition store: %v, want ErrLayout", p, err)
		}
	}
	// Without LAYOUT, the partition directories still tell.
	if err := os.Remove(filepath.Join(dir, LayoutFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(context.Background(), testOptions(t, dir, 4)); !errors.Is(err, ErrLayout) {
		t.Errorf("Open with 4 partitions over 2 partition dirs and no LAYOUT: %v, want ErrLayout", err)
	}
	if err := os.WriteFile(filepath.Join(dir, LayoutFile), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(context.Background(), testOptions(t, dir, 2)); !errors.Is(err, ErrLayout) {
		t.Errorf("Open with an unreadable LAYOUT: %v, want ErrLayout", err)
	}
}

func TestCorruptRecord(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions(t, dir, 1)
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("bad")
	if err := s.Partition(0).db.Update(func(txn *badger.Txn) error {
		return txn.Set(keyspaceOf(0).record(key), []byte("junk"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The record was written behind the filter's back, so the snapshot
	// does not hold it: drop the snapshot. The rebuild reads the record and
	// cannot decode it; the filter must still say maybe, and the lookup
	// must report the corruption instead of "not seen".
	mustRemove(t, filepath.Join(PartitionDir(dir, 0), SnapshotFile))
	s = openStore(t, opts)
	r, err := s.Partition(0).Lookup(key, time.Time{})
	if !errors.Is(err, ErrCorruptRecord) || !r.StoreRead {
		t.Fatalf("Lookup of a corrupt record = %+v, %v; want StoreRead and ErrCorruptRecord", r, err)
	}
	if _, err := s.Partition(0).Claim([]Claim{{Key: key}}); !errors.Is(err, ErrCorruptRecord) {
		t.Fatalf("Claim of a corrupt record: %v, want ErrCorruptRecord", err)
	}
}

func TestConcurrentUse(t *testing.T) {
	opts := testOptions(t, t.TempDir(), 2)
	opts.SnapshotInterval = 5 * time.Millisecond
	opts.GCInterval = 5 * time.Millisecond
	s := openStore(t, opts)
	keys := testKeys("conc", 4000)
	var wg sync.WaitGroup
	for part := range 2 {
		wg.Add(1)
		go func() { // the owner of partition part
			defer wg.Done()
			p := s.Partition(part)
			for i := 0; i < len(keys); i += 100 {
				var batch []Claim
				for _, k := range keys[i : i+100] {
					if PartitionOf(k, 2) == part {
						batch = append(batch, Claim{Key: k})
					}
				}
				if _, err := p.Claim(batch); err != nil {
					t.Errorf("Claim: %v", err)
					return
				}
			}
		}()
	}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Add(1)
	go func() { // inspection from elsewhere
		defer readers.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, _, err := s.Find(keys[i%len(keys)]); err != nil {
				t.Errorf("Find: %v", err)
				return
			}
			_ = s.Stats()
			if err := s.Snapshot(); err != nil {
				t.Errorf("Snapshot: %v", err)
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	readers.Wait()
	if st := s.Stats(); st.ClaimsNew != uint64(len(keys)) {
		t.Fatalf("ClaimsNew = %d, want %d", st.ClaimsNew, len(keys))
	}
	assertAllSeen(t, s, keys)
}

func TestOpenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := t.TempDir()
	if _, err := Open(ctx, testOptions(t, dir, 2)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Open with a cancelled context: %v, want context.Canceled", err)
	}
	// Nothing is left locked.
	openStore(t, testOptions(t, dir, 2))
}

func TestSnapshotSkipsWhenUnchanged(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, testOptions(t, dir, 1))
	snap := filepath.Join(PartitionDir(dir, 0), SnapshotFile)
	claimAll(t, s, testKeys("a", 10))
	if err := s.Snapshot(); err != nil {
		t.Fatal(err)
	}
	first, err := os.Stat(snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshot(); err != nil {
		t.Fatal(err)
	}
	again, err := os.Stat(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(first, again) {
		t.Errorf("snapshot rewritten although nothing was claimed")
	}
	claimAll(t, s, testKeys("b", 1))
	if err := s.Snapshot(); err != nil {
		t.Fatal(err)
	}
	later, err := os.Stat(snap)
	if err != nil {
		t.Fatal(err)
	}
	if os.SameFile(first, later) {
		t.Errorf("snapshot not rewritten after a claim")
	}
}

func TestPeriodicSnapshot(t *testing.T) {
	opts := testOptions(t, t.TempDir(), 2)
	opts.SnapshotInterval = 10 * time.Millisecond
	s := openStore(t, opts)
	keys := testKeys("periodic", 1000)
	claimAll(t, s, keys)
	want := make([]uint64, 2)
	for i := range want {
		want[i] = lastVersion(t, s.Partition(i))
	}
	// Wait until both partitions have a snapshot covering every claim:
	// the partitions share Badger's versions, so a partition's snapshot
	// covers at least its own last commit.
	for i := range 2 {
		natstest.Poll(t, 10*time.Second, 5*time.Millisecond, fmt.Sprintf("a periodic snapshot of partition %d covering version %d", i, want[i]), func() (bool, error) {
			s.Partition(i).snapMu.Lock()
			defer s.Partition(i).snapMu.Unlock()
			return s.Partition(i).snapOnDisk && s.Partition(i).snapVersion >= want[i], nil
		})
	}
	copied := filepath.Join(t.TempDir(), "copy")
	copyDir(t, opts.Dir, copied)
	copyOpts := opts
	copyOpts.Dir = copied
	c := openStore(t, copyOpts)
	assertSources(t, c, SourceSnapshot)
	assertAllSeen(t, c, keys)
}
