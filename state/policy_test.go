package state

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/window"
)

// TestRefreshOnRepeat: with Options.RefreshOnRepeat, repeats every W/2
// keep a key a repeat long past FirstSeen+W, and W after the last repeat
// it is new again; without it, the key is new at FirstSeen+W.
func TestRefreshOnRepeat(t *testing.T) {
	filterOnAndOff(t, func(t *testing.T, opts Options, clock *window.ManualClock) {
		opts.RefreshOnRepeat = true
		s := openStore(t, opts)
		p := s.Partition(0)
		key := []byte("retried")
		w := opts.Window.W
		start := clock.Now()
		if res, err := p.Claim([]Claim{{Key: key, Fingerprint: 1}}); err != nil || !res[0].New {
			t.Fatalf("first Claim = %+v, %v; want New", res, err)
		}
		for i := range 5 {
			clock.Advance(w / 2)
			res, err := p.Claim([]Claim{{Key: key, Fingerprint: 1}, {Key: key, Fingerprint: 1}})
			if err != nil || res[0].New || !res[0].Refreshed || res[1].New || res[1].Refreshed {
				t.Fatalf("repeat %d at first seen + %v = %+v, %v; want a refreshed repeat, then a plain one", i, clock.Now().Sub(start), res, err)
			}
			if !res[0].Existing.FirstSeen.Equal(start) {
				t.Fatalf("repeat %d: existing FirstSeen %v, want %v", i, res[0].Existing.FirstSeen, start)
			}
		}
		last := clock.Now()
		clock.Advance(w - time.Nanosecond)
		if r, err := p.Lookup(key, time.Time{}); err != nil || !r.Found || !r.Record.Refreshed.Equal(last) || (!opts.DisableFilter && !r.FilterSaidMaybe) {
			t.Fatalf("Lookup just inside the last repeat + W = %+v, %v; want Found, refreshed at %v, filter maybe", r, err, last)
		}
		clock.Advance(time.Nanosecond)
		if r, err := p.Lookup(key, time.Time{}); err != nil || r.Found {
			t.Fatalf("Lookup at the last repeat + W = %+v, %v; want not Found", r, err)
		}
		if res, err := p.Claim([]Claim{{Key: key, Fingerprint: 2}}); err != nil || !res[0].New {
			t.Fatalf("Claim at the last repeat + W = %+v, %v; want New", res, err)
		}
		if st := p.Stats(); st.ClaimsNew != 2 {
			t.Errorf("Stats ClaimsNew = %d, want 2 (a refresh is not new)", st.ClaimsNew)
		}
	})
}

func TestNoRefreshByDefault(t *testing.T) {
	opts := testOptions(t, t.TempDir(), 1)
	clock := window.NewManualClock(time.Now())
	opts.Clock = clock
	p := openStore(t, opts).Partition(0)
	key := []byte("k")
	claimOne(t, p, Claim{Key: key}, true)
	clock.Advance(opts.Window.W / 2)
	if res := claimOne(t, p, Claim{Key: key}, false); res.Refreshed {
		t.Fatalf("repeat refreshed with RefreshOnRepeat off: %+v", res)
	}
	clock.Advance(opts.Window.W / 2)
	claimOne(t, p, Claim{Key: key}, true)
}

// TestRefreshSurvivesRestart: a refreshed key is still a repeat at
// FirstSeen+W+ε after a restart, whether the filter is loaded from its
// snapshot or rebuilt from the store, and its first generation has
// rotated out of the filter by then.
func TestRefreshSurvivesRestart(t *testing.T) {
	for _, rebuild := range []bool{false, true} {
		t.Run(map[bool]string{false: "snapshot", true: "rebuild"}[rebuild], func(t *testing.T) {
			opts := testOptions(t, t.TempDir(), 1)
			opts.RefreshOnRepeat = true
			clock := window.NewManualClock(time.Now())
			opts.Clock = clock
			w := opts.Window.W
			key := []byte("retried")
			s, err := Open(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			claimOne(t, s.Partition(0), Claim{Key: key}, true)
			clock.Advance(w * 3 / 4)
			if res := claimOne(t, s.Partition(0), Claim{Key: key}, false); !res.Refreshed {
				t.Fatalf("repeat not refreshed: %+v", res)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if rebuild {
				mustRemove(t, filepath.Join(PartitionDir(opts.Dir, 0), SnapshotFile))
			}
			clock.Advance(w/4 + time.Second) // first seen + W + 1s
			s = openStore(t, opts)
			if r, err := s.Partition(0).Lookup(key, time.Time{}); err != nil || !r.Found || !r.FilterSaidMaybe {
				t.Fatalf("Lookup at first seen + W + 1s after a restart = %+v, %v; want Found with the filter saying maybe", r, err)
			}
		})
	}
}

// TestVersionWins: versions 1, 3, 2, 3, 4 of one key are New, New, Stale,
// Stale, New, claimed one at a time or in one batch; the record keeps the
// greatest version.
func TestVersionWins(t *testing.T) {
	versions := []uint64{1, 3, 2, 3, 4}
	wantNew := []bool{true, true, false, false, true}
	filterOnAndOff(t, func(t *testing.T, opts Options, clock *window.ManualClock) {
		p := openStore(t, opts).Partition(0)
		for i, v := range versions {
			res := claimOne(t, p, Claim{Key: []byte("one"), Fingerprint: v, Versioned: true, Version: v}, wantNew[i])
			if res.Stale == wantNew[i] {
				t.Errorf("version %d: Stale %v, want %v", v, res.Stale, !wantNew[i])
			}
			clock.Advance(time.Second)
		}
		batch := make([]Claim, len(versions))
		for i, v := range versions {
			batch[i] = Claim{Key: []byte("batch"), Fingerprint: v, Versioned: true, Version: v}
		}
		res, err := p.Claim(batch)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.New != wantNew[i] || r.Stale == wantNew[i] {
				t.Errorf("batch claim of version %d = %+v, want New %v", versions[i], r, wantNew[i])
			}
		}
		for _, k := range []string{"one", "batch"} {
			r, err := p.Lookup([]byte(k), time.Time{})
			if err != nil || !r.Found || !r.Record.HasVersion || r.Record.Version != 4 || r.Record.Fingerprint != 4 {
				t.Errorf("Lookup(%s) = %+v, %v; want version 4", k, r, err)
			}
		}
		// A key recorded without a version takes any version.
		claimOne(t, p, Claim{Key: []byte("plain")}, true)
		claimOne(t, p, Claim{Key: []byte("plain"), Versioned: true, Version: 0}, true)
	})
}

// TestRestoreKeepsTheGreaterVersion: records read back from a changelog
// out of order never replace a greater version.
func TestRestoreKeepsTheGreaterVersion(t *testing.T) {
	opts := testOptions(t, t.TempDir(), 1)
	clock := window.NewManualClock(time.Now())
	opts.Clock = clock
	p := openStore(t, opts).Partition(0)
	now := clock.Now()
	rec := func(v uint64, at time.Duration) Restored {
		return Restored{Key: []byte("k"), Fingerprint: v, FirstSeen: now.Add(at), Version: v, HasVersion: true}
	}
	if err := p.Restore([]Restored{rec(1, 0), rec(3, time.Second)}, 0); err != nil {
		t.Fatal(err)
	}
	if err := p.Restore([]Restored{rec(2, 2*time.Second)}, 0); err != nil {
		t.Fatal(err)
	}
	if r, err := p.Lookup([]byte("k"), time.Time{}); err != nil || r.Record.Version != 3 {
		t.Fatalf("Lookup = %+v, %v; want version 3", r, err)
	}
	claimOne(t, p, Claim{Key: []byte("k"), Versioned: true, Version: 3}, false)
	claimOne(t, p, Claim{Key: []byte("k"), Versioned: true, Version: 4}, true)
}

// claimOne claims c alone and fails unless its New is wantNew.
func claimOne(tb testing.TB, p *Partition, c Claim, wantNew bool) ClaimResult {
	tb.Helper()
	res, err := p.Claim([]Claim{c})
	if err != nil || res[0].New != wantNew {
		tb.Fatalf("Claim(%q version %d) = %+v, %v; want New %v", c.Key, c.Version, res, err, wantNew)
	}
	return res[0]
}

// TestOutputSeqKept: a record keeps the output sequence of its key's
// forward through a repeat that moves its window, is replaced with a newer
// version's, and survives a restore of a key-state record that carries
// none (the record of the same forward keeps its own).
func TestOutputSeqKept(t *testing.T) {
	opts := testOptions(t, t.TempDir(), 1)
	clock := window.NewManualClock(time.Now())
	opts.Clock = clock
	opts.RefreshOnRepeat = true
	p := openStore(t, opts).Partition(0)
	seqOf := func(key string) uint64 {
		t.Helper()
		r, err := p.Lookup([]byte(key), time.Time{})
		if err != nil || !r.Found {
			t.Fatalf("Lookup(%s) = %+v, %v", key, r, err)
		}
		return r.Record.OutputSeq
	}
	claimOne(t, p, Claim{Key: []byte("a"), OutputSeq: 41}, true)
	clock.Advance(time.Second)
	if res := claimOne(t, p, Claim{Key: []byte("a"), OutputSeq: 99}, false); !res.Refreshed {
		t.Fatalf("the repeat did not move the window: %+v", res)
	}
	if got := seqOf("a"); got != 41 {
		t.Errorf("after a refreshed repeat: output seq %d, want 41, the forward's", got)
	}
	claimOne(t, p, Claim{Key: []byte("v"), Versioned: true, Version: 1, OutputSeq: 50}, true)
	claimOne(t, p, Claim{Key: []byte("v"), Versioned: true, Version: 2, OutputSeq: 60}, true)
	if got := seqOf("v"); got != 60 {
		t.Errorf("after version 2: output seq %d, want 60, version 2's forward", got)
	}

	first := clock.Now()
	if err := p.Restore([]Restored{{Key: []byte("r"), FirstSeen: first, Fingerprint: 1, OutputSeq: 7}}, 0); err != nil {
		t.Fatal(err)
	}
	if err := p.Restore([]Restored{{Key: []byte("r"), FirstSeen: first, Fingerprint: 1, Refreshed: first.Add(time.Second)}}, 0); err != nil {
		t.Fatal(err)
	}
	if r, err := p.Lookup([]byte("r"), time.Time{}); err != nil || r.Record.OutputSeq != 7 || !r.Record.Refreshed.Equal(first.Add(time.Second)) {
		t.Errorf("after a refresh without an output seq: %+v, %v; want the refresh applied and output seq 7 kept", r, err)
	}
}
