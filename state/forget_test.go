package state

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/window"
)

// TestForget forgets a held key: its next claim is New again, a second
// forget and a forget of a key never seen say "not held", and the forget
// holds after a restart, with the filter loaded from its snapshot or
// rebuilt from the store.
func TestForget(t *testing.T) {
	filterOnAndOff(t, func(t *testing.T, opts Options, clock *window.ManualClock) {
		s, err := Open(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		p := s.Partition(0)
		key := []byte("order-1")
		first := clock.Now()
		if _, err := p.Claim([]Claim{{Key: key, Fingerprint: 7}}); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Minute)
		forgotten := clock.Now()
		rec, held, err := p.Forget(key)
		if err != nil || !held || !rec.FirstSeen.Equal(first) || rec.Fingerprint != 7 || !rec.Forgotten.Equal(forgotten) {
			t.Fatalf("Forget = %+v, held %v, %v; want the record first seen at %v, forgotten at %v, held", rec, held, err, first, forgotten)
		}
		for _, k := range []string{"order-1", "never-seen"} {
			if _, held, err := p.Forget([]byte(k)); err != nil || held {
				t.Errorf("Forget(%s) again = held %v, %v; want not held", k, held, err)
			}
		}
		assertForgotten(t, p, key, forgotten)

		// A restart keeps it: from the snapshot a clean close writes, and
		// rebuilt from the store without one.
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = openStore(t, opts)
		assertForgotten(t, s.Partition(0), key, forgotten)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(PartitionDir(opts.Dir, 0), SnapshotFile)); err != nil {
			t.Fatal(err)
		}
		s = openStore(t, opts)
		p = s.Partition(0)
		assertForgotten(t, p, key, forgotten)

		// A restore of the forward the forget undid does not bring the
		// record back; snapshots carry the forgotten record with its mark.
		if err := p.Restore([]Restored{{Key: key, Fingerprint: 7, FirstSeen: first, Seq: 1}}, 1); err != nil {
			t.Fatal(err)
		}
		assertForgotten(t, p, key, forgotten)
		var scanned []Record
		if err := p.ScanRecords(context.Background(), func(uint64) error { return nil }, func(_ []byte, r Record) error {
			scanned = append(scanned, r)
			return nil
		}); err != nil || len(scanned) != 1 || !scanned[0].Forgotten.Equal(forgotten) {
			t.Errorf("ScanRecords gave %+v, %v; want the record forgotten at %v", scanned, err, forgotten)
		}

		// The next copy is New and is held again.
		res, err := p.Claim([]Claim{{Key: key, Fingerprint: 8}})
		if err != nil || !res[0].New {
			t.Fatalf("claim after the forget = %+v, %v; want New", res, err)
		}
		if l, err := p.Lookup(key, time.Time{}); err != nil || !l.Found || l.Record.Fingerprint != 8 || !l.Forgotten.IsZero() {
			t.Errorf("Lookup after the new claim = %+v, %v; want Found with fingerprint 8", l, err)
		}
	})
}

// assertForgotten fails unless Lookup finds key not held and says when it
// was forgotten.
func assertForgotten(t *testing.T, p *Partition, key []byte, at time.Time) {
	t.Helper()
	l, err := p.Lookup(key, time.Time{})
	if err != nil || l.Found || !l.Forgotten.Equal(at) {
		t.Errorf("Lookup of a forgotten key = %+v, %v; want not Found, Forgotten %v", l, err, at)
	}
}

// TestForgottenRecordRoundTrip encodes and decodes a forgotten record.
func TestForgottenRecordRoundTrip(t *testing.T) {
	for _, r := range []Record{
		{FirstSeen: time.Unix(0, 12345), Fingerprint: 9},
		{FirstSeen: time.Unix(0, 12345), Fingerprint: 9, Forgotten: time.Unix(0, 67890)},
		{FirstSeen: time.Unix(0, 12345), Fingerprint: 9, Refreshed: time.Unix(0, 2e5), Version: 7, HasVersion: true, Forgotten: time.Unix(0, 3e5)},
	} {
		got, err := decodeRecord(encodeRecord(r))
		if err != nil || !got.FirstSeen.Equal(r.FirstSeen) || got.Fingerprint != r.Fingerprint || !got.Forgotten.Equal(r.Forgotten) ||
			!got.Refreshed.Equal(r.Refreshed) || got.Version != r.Version || got.HasVersion != r.HasVersion {
			t.Errorf("round trip of %+v = %+v, %v", r, got, err)
		}
	}
	if _, err := decodeRecord([]byte{recordVersion2, flagForgotten, 0, 0}); err == nil {
		t.Error("a short forgotten record decoded")
	}
}

// TestRestoreAppliesKeyState restores what a group's changelog holds
// besides forwards, in stream order: a refresh moves the key's window to
// the later start, and restores a record whose first-seen time is past the
// window; a forget marks the key's record, or stores the mark when no
// record is held, and a forward after it replaces the mark whatever its
// version.
func TestRestoreAppliesKeyState(t *testing.T) {
	w := testWindow(t).W
	open := func(t *testing.T) (*Partition, *window.ManualClock) {
		opts := testOptions(t, t.TempDir(), 1)
		clock := window.NewManualClock(time.Now())
		opts.Clock = clock
		return openStore(t, opts).Partition(0), clock
	}
	restore := func(t *testing.T, p *Partition, recs ...Restored) {
		t.Helper()
		if err := p.Restore(recs, 0); err != nil {
			t.Fatal(err)
		}
	}
	key := []byte("k")
	t.Run("refresh", func(t *testing.T) {
		p, clock := open(t)
		first := clock.Now()
		fwd := Restored{Key: key, FirstSeen: first, Fingerprint: 1}
		refresh := fwd
		refresh.Refreshed = first.Add(w / 2)
		restore(t, p, fwd, refresh, fwd) // the forward read again after it changes nothing
		clock.Advance(w + time.Second)
		if l, err := p.Lookup(key, time.Time{}); err != nil || !l.Found || !l.Record.WindowStart().Equal(refresh.Refreshed) {
			t.Fatalf("Lookup past first-seen + W = %+v, %v; want held, its window from the refresh", l, err)
		}
	})
	t.Run("refresh of a record past the window", func(t *testing.T) {
		p, clock := open(t)
		first := clock.Now()
		clock.Advance(w + time.Second)
		fwd := Restored{Key: key, FirstSeen: first, Fingerprint: 1}
		restore(t, p, fwd)
		if l, _ := p.Lookup(key, time.Time{}); l.Found {
			t.Fatal("a record past the window is held")
		}
		refresh := fwd
		refresh.Refreshed = first.Add(w / 2)
		restore(t, p, refresh)
		if l, err := p.Lookup(key, time.Time{}); err != nil || !l.Found || !l.Record.FirstSeen.Equal(first) {
			t.Fatalf("Lookup after the refresh = %+v, %v; want held, first seen %v", l, err, first)
		}
	})
	t.Run("forget", func(t *testing.T) {
		p, clock := open(t)
		first := clock.Now()
		fwd := Restored{Key: key, FirstSeen: first, Fingerprint: 1, Version: 5, HasVersion: true}
		tomb := fwd
		tomb.Forgotten = first.Add(time.Second)
		restore(t, p, fwd, tomb, fwd)
		assertForgotten(t, p, key, tomb.Forgotten)
		clock.Advance(2 * time.Second)
		after := Restored{Key: key, FirstSeen: clock.Now(), Fingerprint: 2, Version: 3, HasVersion: true}
		restore(t, p, after, tomb)
		if l, err := p.Lookup(key, time.Time{}); err != nil || !l.Found || l.Record.Version != 3 || !l.Forgotten.IsZero() {
			t.Fatalf("Lookup after a forward after the forget = %+v, %v; want held at version 3", l, err)
		}
	})
	t.Run("forget with no record held", func(t *testing.T) {
		p, clock := open(t)
		tomb := Restored{Key: key, FirstSeen: clock.Now(), Fingerprint: 1, Forgotten: clock.Now().Add(time.Second)}
		restore(t, p, tomb)
		assertForgotten(t, p, key, tomb.Forgotten)
	})
}
