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

// lookupRecord fails unless p holds an unexpired record of key equal to
// want.
func lookupRecord(t *testing.T, p *Partition, key []byte, want Record) {
	t.Helper()
	r, err := p.Lookup(key, time.Time{})
	if err != nil {
		t.Fatalf("Lookup(%q): %v", key, err)
	}
	if !r.Found || !r.Record.FirstSeen.Equal(want.FirstSeen) || r.Record.Fingerprint != want.Fingerprint {
		t.Errorf("Lookup(%q) = %+v, want Found with first seen %v, fingerprint %d", key, r, want.FirstSeen, want.Fingerprint)
	}
}

// TestClaimFirstSeen checks that a claim's FirstSeen, when given, is the
// stored first-seen time, which logical expiry counts from, and that a
// zero one keeps the clock's now.
func TestClaimFirstSeen(t *testing.T) {
	filterOnAndOff(t, func(t *testing.T, opts Options, clock *window.ManualClock) {
		p := openStore(t, opts).Partition(0)
		judged := clock.Now().Add(-3 * time.Second)
		res, err := p.Claim([]Claim{{Key: []byte("given"), Fingerprint: 1, At: judged}, {Key: []byte("now"), Fingerprint: 2}})
		if err != nil || !res[0].New || !res[1].New {
			t.Fatalf("Claim = %+v, %v; want both New", res, err)
		}
		lookupRecord(t, p, []byte("given"), Record{FirstSeen: judged, Fingerprint: 1})
		lookupRecord(t, p, []byte("now"), Record{FirstSeen: clock.Now(), Fingerprint: 2})
		clock.Advance(opts.Window.W - 3*time.Second) // now = judged + W
		if r, err := p.Lookup([]byte("given"), time.Time{}); err != nil || r.Found {
			t.Errorf("Lookup at given first seen + W = %+v, %v; want expired", r, err)
		}
		if r, err := p.Lookup([]byte("now"), time.Time{}); err != nil || !r.Found {
			t.Errorf("Lookup of the clock's key 3s before its end = %+v, %v; want Found", r, err)
		}
	})
}

// TestCursor checks the partition's cursor: 0 before any is stored; stored
// by ClaimWithCursor with the claims (and alone when every claim is a
// repeat), kept by Claim and by a cursor of 0; kept across a reopen; and
// never taken for a key: a filter rebuild scans exactly the keys, a
// snapshot needs no top-up after a cursor-only write, and the store finds
// no key for it.
func TestCursor(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions(t, dir, 1)
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	p := s.Partition(0)
	cursor := func(want uint64) {
		t.Helper()
		if got, err := p.Cursor(); err != nil || got != want {
			t.Fatalf("Cursor() = %d, %v; want %d", got, err, want)
		}
	}
	cursor(0)
	keys := testKeys("cursor", 100)
	claims := make([]Claim, len(keys))
	for i, k := range keys {
		claims[i] = Claim{Key: k, Fingerprint: uint64(i)}
	}
	if _, err := p.ClaimWithCursor(claims[:50], 70); err != nil {
		t.Fatal(err)
	}
	cursor(70)
	if _, err := p.Claim(claims[50:60]); err != nil {
		t.Fatal(err)
	}
	cursor(70)
	if _, err := p.ClaimWithCursor(claims[60:], 0); err != nil {
		t.Fatal(err)
	}
	cursor(70)
	res, err := p.ClaimWithCursor(claims[:10], 90) // all repeats
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.New {
			t.Fatalf("claim %d of a stored key: New", i)
		}
	}
	cursor(90)
	if st := p.Stats(); st.ClaimsNew != 100 {
		t.Errorf("ClaimsNew = %d, want 100 (the cursor is no claim)", st.ClaimsNew)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopen from the snapshot, write the cursor alone, reopen again: the
	// snapshot covers every record, so nothing is scanned.
	s = openStore(t, opts)
	p = s.Partition(0)
	cursor(90)
	if _, err := p.ClaimWithCursor(nil, 120); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	p = s.Partition(0)
	cursor(120)
	if b := p.FilterBuild(); b.Scanned != 0 {
		t.Errorf("filter build after a cursor-only write: %+v, want nothing scanned", b)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Rebuild from a full scan: exactly the keys.
	mustRemove(t, filepath.Join(PartitionDir(dir, 0), SnapshotFile))
	s = openStore(t, opts)
	p = s.Partition(0)
	cursor(120)
	if b := p.FilterBuild(); b.Source != SourceRebuild || b.Scanned != uint64(len(keys)) || b.Added != uint64(len(keys)) {
		t.Errorf("rebuild: %+v, want %d records scanned and added", b, len(keys))
	}
	if st := p.Stats(); st.FilterKeys != uint64(len(keys)) {
		t.Errorf("FilterKeys = %d, want %d", st.FilterKeys, len(keys))
	}
	assertAllSeen(t, s, keys)
	for _, k := range [][]byte{{prefixCursor}, {}, []byte("c")} {
		if _, _, found, err := s.Find(k); found {
			t.Errorf("Find(%q) found a record (err %v)", k, err)
		}
	}
}

// TestCursorWithASplitBatch stores a cursor with a batch too big for one
// Badger transaction: it is there, with every key.
func TestCursorWithASplitBatch(t *testing.T) {
	opts := testOptions(t, t.TempDir(), 1)
	opts.MemoryBudget = MinMemoryBudget // ~1600 writes per Badger txn
	s := openStore(t, opts)
	p := s.Partition(0)
	keys := testKeys("split", 5000)
	claims := make([]Claim, len(keys))
	for i, k := range keys {
		claims[i] = Claim{Key: k}
	}
	if _, err := p.ClaimWithCursor(claims, 5000); err != nil {
		t.Fatal(err)
	}
	if c, err := p.Cursor(); err != nil || c != 5000 {
		t.Errorf("Cursor() = %d, %v; want 5000", c, err)
	}
	assertAllSeen(t, s, keys)
}

// TestRestore restores records into a partition, with the filter on and
// off: every unexpired one is found with its own first-seen time and
// fingerprint, in the filter too; expired ones are not stored; restoring
// again changes nothing; a key already held keeps the later of the two
// first-seen times; the cursor is stored; and after a reopen that rebuilds
// the filter, everything is still there.
func TestRestore(t *testing.T) {
	filterOnAndOff(t, func(t *testing.T, opts Options, clock *window.ManualClock) {
		dir, disable := opts.Dir, opts.DisableFilter
		s, err := Open(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		p := s.Partition(0)
		now := clock.Now()
		w := opts.Window.W
		setInputClock(t, p, now)

		// Held locally before the restore: "older" first seen before
		// its restored copy, "newer" after.
		if _, err := p.Claim([]Claim{
			{Key: []byte("older"), Fingerprint: 100, At: now.Add(-w / 2)},
			{Key: []byte("newer"), Fingerprint: 200, At: now.Add(-time.Second)},
		}); err != nil {
			t.Fatal(err)
		}
		keys := testKeys("restored", 1000)
		recs := make([]Restored, 0, len(keys)+4)
		want := map[string]Record{}
		for i, k := range keys {
			r := Restored{Key: k, Fingerprint: uint64(i), FirstSeen: now.Add(-time.Duration(i) * w / 2000)}
			recs = append(recs, r)
			want[string(k)] = Record{FirstSeen: r.FirstSeen, Fingerprint: r.Fingerprint}
		}
		recs = append(recs,
			Restored{Key: []byte("expired"), Fingerprint: 1, FirstSeen: now.Add(-w)},
			Restored{Key: []byte("older"), Fingerprint: 101, FirstSeen: now.Add(-w / 4)},
			Restored{Key: []byte("newer"), Fingerprint: 201, FirstSeen: now.Add(-time.Minute)},
			Restored{Key: keys[0], Fingerprint: 999, FirstSeen: now.Add(-time.Hour / 2)}, // an earlier copy of a key in this call
		)
		want["older"] = Record{FirstSeen: now.Add(-w / 4), Fingerprint: 101}
		want["newer"] = Record{FirstSeen: now.Add(-time.Second), Fingerprint: 200}

		check := func() {
			t.Helper()
			for k, r := range want {
				lookupRecord(t, p, []byte(k), r)
			}
			if _, _, found, err := s.Find([]byte("expired")); err != nil || found {
				t.Errorf("Find(expired) = %v, %v; want not stored", found, err)
			}
			if c, err := p.Cursor(); err != nil || c != 4242 {
				t.Errorf("Cursor() = %d, %v; want 4242", c, err)
			}
		}
		if err := p.Restore(recs, 4242); err != nil {
			t.Fatal(err)
		}
		check()
		if err := p.Restore(recs, 4242); err != nil {
			t.Fatalf("restoring again: %v", err)
		}
		check()
		res, err := p.Claim([]Claim{{Key: keys[500], Fingerprint: 7}})
		if err != nil || res[0].New || res[0].Existing.Fingerprint != 500 {
			t.Errorf("claim of a restored key = %+v, %v; want a repeat of fingerprint 500", res, err)
		}
		if !disable {
			if st := p.Stats(); st.FilterKeys < uint64(len(keys)) {
				t.Errorf("FilterKeys = %d, want at least %d", st.FilterKeys, len(keys))
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(PartitionDir(dir, 0), SnapshotFile)); err != nil && !disable {
			t.Fatal(err)
		}
		s = openStore(t, opts)
		p = s.Partition(0)
		check()
		if b := p.FilterBuild(); !disable && b.Scanned != uint64(len(want)) {
			t.Errorf("rebuild scanned %d records, want %d (the keys, not the cursor)", b.Scanned, len(want))
		}
	})
}

func TestRestoreRefusesBadRecords(t *testing.T) {
	p := openStore(t, testOptions(t, t.TempDir(), 1)).Partition(0)
	for name, rec := range map[string]Restored{
		"no first seen":       {Key: []byte("k")},
		"a total, totals off": {Key: []byte("k"), FirstSeen: time.Now(), Total: Contribution{Group: "g", Value: 1}},
		"empty key":           {FirstSeen: time.Now()},
	} {
		err := p.Restore([]Restored{rec}, 1)
		if err == nil || !(errors.Is(err, ErrBadRestore) || errors.Is(err, ErrBadKey)) {
			t.Errorf("%s: Restore = %v, want ErrBadRestore or ErrBadKey", name, err)
		}
	}
	if c, err := p.Cursor(); err != nil || c != 0 {
		t.Errorf("Cursor() after refused restores = %d, %v; want 0", c, err)
	}
}

// TestRestoreTotals restores records that carry contributions, as a new
// owner of a partition does with totals on: a record inside the window
// adds its contribution once, however often it is restored; one outside
// the window still adds it while its bucket's total is kept (and stores
// the cursor at its sequence), but not when the partition still holds its
// key with that first-seen time, nor when its bucket's total is past
// TotalsKeep. A regain from the cursor adds what other owners counted to
// what the partition counted itself.
func TestRestoreTotals(t *testing.T) {
	filterOnAndOff(t, func(t *testing.T, opts Options, clock *window.ManualClock) {
		opts.TotalsBucket = time.Minute
		p := openStore(t, opts).Partition(0)
		now := clock.Now()
		w := opts.Window.W
		setInputClock(t, p, now)
		bNow := BucketOf(now, time.Minute)
		old := now.Add(-w - 90*time.Second) // outside the window, its bucket still open
		bOld := BucketOf(old, time.Minute)
		gone := now.Add(-w - opts.TotalsKeep - 3*time.Minute) // its bucket's total no longer kept
		bGone := BucketOf(gone, time.Minute)
		at := func(c Contribution, b time.Time) Contribution { c.Bucket = b; return c }

		recs := []Restored{
			{Key: []byte("in-1"), FirstSeen: now.Add(-time.Minute), Total: at(contrib("g", 2), bNow), Seq: 11},
			{Key: []byte("in-2"), FirstSeen: now.Add(-time.Second), Total: at(contrib("g", 3), bNow), Seq: 12},
			{Key: []byte("in-plain"), FirstSeen: now.Add(-time.Second), Seq: 13},
			{Key: []byte("old-1"), FirstSeen: old, Total: at(contrib("g", 5), bOld), Seq: 14},
			{Key: []byte("old-2"), FirstSeen: old, Total: at(contrib("h", 7), bOld), Seq: 15},
			{Key: []byte("gone"), FirstSeen: gone, Total: at(contrib("g", 100), bGone), Seq: 16},
		}
		if err := p.Restore(recs[:5], 0); err != nil {
			t.Fatal(err)
		}
		// The outside-window contributions stored the cursor with them.
		if c, err := p.Cursor(); err != nil || c != 15 {
			t.Errorf("Cursor() after a restore without one = %d, %v; want 15, the last outside-window record's", c, err)
		}
		if err := p.Restore(recs[5:], 16); err != nil {
			t.Fatal(err)
		}
		want := map[string]int64{"g@now": 5, "g@old": 5, "h@old": 7}
		checkTotals := func(when string) {
			t.Helper()
			for pair, v := range want {
				g, b := pair[:1], bNow
				if pair[2:] == "old" {
					b = bOld
				}
				if got, ok := mustTotal(t, p, g, b); !ok || got != v {
					t.Errorf("%s: total %s = %d, %v; want %d", when, pair, got, ok, v)
				}
			}
			if got, ok := mustTotal(t, p, "g", bGone); ok {
				t.Errorf("%s: a bucket past TotalsKeep got a total %d", when, got)
			}
		}
		checkTotals("restored")
		dirty, err := p.TakeDirtyTotals()
		if err != nil || len(dirty) != 3 {
			t.Errorf("TakeDirtyTotals after the restore = %v, %v; want the 3 restored pairs, to be flushed", dirty, err)
		}
		lookupRecord(t, p, []byte("in-2"), Record{FirstSeen: now.Add(-time.Second)})
		if _, found, _ := p.find([]byte("old-1")); found {
			t.Error("a record outside the window was stored")
		}

		// The inside-window records again: their keys are held, so their
		// contributions are counted already.
		if err := p.Restore(recs[:3], 16); err != nil {
			t.Fatal(err)
		}
		checkTotals("restored again")

		// The partition's own forwards, then a regain from its cursor: a
		// record of a key it claimed (a batch it claimed but whose cursor
		// did not commit) adds nothing, other owners' records add theirs.
		ownSeen := now
		res, err := p.ClaimWithCursor([]Claim{{Key: []byte("own"), At: ownSeen, Total: at(contrib("g", 10), bNow)}}, 20)
		if err != nil || !res[0].New {
			t.Fatalf("claim: %+v, %v", res, err)
		}
		clock.Advance(w + time.Second) // own is outside the window, still in Badger
		now = clock.Now()
		if err := p.Restore([]Restored{
			{Key: []byte("own"), FirstSeen: ownSeen, Total: at(contrib("g", 10), bNow), Seq: 20},
			{Key: []byte("other"), FirstSeen: now.Add(-time.Second), Total: at(contrib("g", 4), bNow), Seq: 21},
		}, 22); err != nil {
			t.Fatal(err)
		}
		want["g@now"] = 5 + 10 + 4
		checkTotals("regained")
	})
}

// TestRestoreCounted counts the keys a restore stores: all of them on an
// empty partition, none when restored again, and only the key held less
// early than the record restored.
func TestRestoreCounted(t *testing.T) {
	s := openStore(t, testOptions(t, t.TempDir(), 1))
	p := s.Partition(0)
	at := time.Now()
	recs := []Restored{{Key: []byte("a"), FirstSeen: at}, {Key: []byte("b"), FirstSeen: at}, {Key: []byte("a"), FirstSeen: at.Add(time.Second)}}
	if n, err := p.RestoreCounted(recs, 0); err != nil || n != 2 {
		t.Errorf("RestoreCounted on an empty partition = %d, %v; want 2", n, err)
	}
	if n, err := p.RestoreCounted(recs, 0); err != nil || n != 0 {
		t.Errorf("RestoreCounted again = %d, %v; want 0", n, err)
	}
	if _, err := p.Claim([]Claim{{Key: []byte("c"), At: at.Add(time.Second)}}); err != nil {
		t.Fatal(err)
	}
	more := []Restored{{Key: []byte("c"), FirstSeen: at}, {Key: []byte("b"), FirstSeen: at.Add(2 * time.Second)}}
	if n, err := p.RestoreCounted(more, 0); err != nil || n != 1 {
		t.Errorf("RestoreCounted of a key claimed later and a key held earlier = %d, %v; want 1", n, err)
	}
}

// setInputClock moves p's input clock (Partition.Newest) to at, as a copy
// judged at at does.
func setInputClock(tb testing.TB, p *Partition, at time.Time) {
	tb.Helper()
	if _, err := p.Lookup([]byte("input clock"), at); err != nil {
		tb.Fatal(err)
	}
}
