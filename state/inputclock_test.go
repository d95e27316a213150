package state

import (
	"context"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/window"
)

// brokenClock is a Clock that must not be read: every time in these tests
// is an input time passed in.
type brokenClock struct{ tb testing.TB }

func (c brokenClock) Now() time.Time {
	c.tb.Helper()
	c.tb.Errorf("the store read its clock; every call here carries an input time")
	return time.Now()
}

// TestInputClockJudges: whether a copy is a repeat depends on its own input
// time and the record's, never on a clock: a copy within W of the first is
// a repeat, one at W or later is not (and Ended names the window's end
// when the store was read; the filter may prove a copy long past W new),
// a copy stored before the first is a repeat, and a refreshed record
// counts from its refresh.
func TestInputClockJudges(t *testing.T) {
	filterOnAndOff(t, func(t *testing.T, opts Options, _ *window.ManualClock) {
		opts.Clock = brokenClock{t}
		p := openStore(t, opts).Partition(0)
		w := opts.Window.W
		t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
		claimOne(t, p, Claim{Key: []byte("k"), Fingerprint: 1, At: t0}, true)
		for _, tc := range []struct {
			name  string
			at    time.Time
			found bool
		}{
			{"just after", t0.Add(time.Nanosecond), true},
			{"just inside W", t0.Add(w - time.Nanosecond), true},
			{"at W", t0.Add(w), false},
			{"long after", t0.Add(100 * w), false},
			{"stored before the first copy", t0.Add(-time.Hour), true},
		} {
			r, err := p.Lookup([]byte("k"), tc.at)
			if err != nil || r.Found != tc.found {
				t.Errorf("%s: Lookup at first+%v = %+v, %v; want Found %v", tc.name, tc.at.Sub(t0), r, err, tc.found)
			}
			if !tc.found && r.StoreRead && !r.Ended.Equal(t0.Add(w)) {
				t.Errorf("%s: Ended = %v, want the window's end %v", tc.name, r.Ended, t0.Add(w))
			}
		}
		// A claim judges at its own time too: a copy W later is New.
		claimOne(t, p, Claim{Key: []byte("k"), Fingerprint: 1, At: t0.Add(w)}, true)
		if r, err := p.Lookup([]byte("k"), t0.Add(2*w-time.Second)); err != nil || !r.Found || !r.Record.FirstSeen.Equal(t0.Add(w)) {
			t.Fatalf("Lookup after the second forward = %+v, %v; want the record first seen at first+W", r, err)
		}
		if got := p.Newest(); !got.Equal(t0.Add(100 * w)) {
			t.Errorf("Newest = %v, want the newest input time given, %v", got, t0.Add(100*w))
		}
	})
}

// TestInputClockCopyTooOldForTheFilter: a copy redelivered long after newer
// ones moved the filter's ring past its key's generation reads the store
// (Stats.FilterBypassed) and is a repeat: the filter never decides for a
// copy it cannot answer for.
func TestInputClockCopyTooOldForTheFilter(t *testing.T) {
	opts := testOptions(t, t.TempDir(), 1)
	opts.Clock = brokenClock{t}
	p := openStore(t, opts).Partition(0)
	w := opts.Window.W
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	claimOne(t, p, Claim{Key: []byte("early"), Fingerprint: 1, At: t0}, true)
	// Newer copies, judged first, move the ring on by 2W.
	claimOne(t, p, Claim{Key: []byte("late"), Fingerprint: 2, At: t0.Add(2 * w)}, true)
	r, err := p.Lookup([]byte("early"), t0.Add(w/2))
	if err != nil || !r.Found {
		t.Fatalf("Lookup of a copy at first+W/2, judged after copies 2W newer = %+v, %v; want Found", r, err)
	}
	if st := p.Stats(); st.FilterBypassed == 0 {
		t.Errorf("FilterBypassed = 0; the filter cannot answer for that copy")
	}
	claimOne(t, p, Claim{Key: []byte("early"), Fingerprint: 1, At: t0.Add(w / 2)}, false)
}

// TestInputClockSurvivesDowntime: a store closed and opened again much
// later by the host's clock keeps every key, whether the filter comes from
// its snapshot or is rebuilt: time passes only with the input.
func TestInputClockSurvivesDowntime(t *testing.T) {
	for _, rebuild := range []bool{false, true} {
		t.Run(map[bool]string{false: "snapshot", true: "rebuild"}[rebuild], func(t *testing.T) {
			opts := testOptions(t, t.TempDir(), 2)
			opts.Clock = brokenClock{t}
			s, err := Open(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
			keys := testKeys("k", 200)
			for i, k := range keys {
				p := s.Partition(PartitionOf(k, 2))
				if _, err := p.Claim([]Claim{{Key: k, Fingerprint: uint64(i), At: t0.Add(time.Duration(i) * time.Millisecond)}}); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if rebuild {
				for i := range 2 {
					mustRemove(t, PartitionDir(opts.Dir, i)+"/"+SnapshotFile)
				}
			}
			s = openStore(t, opts)
			at := t0.Add(opts.Window.W - time.Second)
			for _, k := range keys {
				r, err := s.Partition(PartitionOf(k, 2)).Lookup(k, at)
				if err != nil || !r.Found {
					t.Fatalf("after the reopen, Lookup(%q) at first+W-1s = %+v, %v; want Found", k, r, err)
				}
			}
		})
	}
}

// TestExpire: a record leaves when its window ended at upTo and it was
// written at maxVersion or before; a refresh moves its end; nothing else
// is touched.
func TestExpire(t *testing.T) {
	opts := testOptions(t, t.TempDir(), 1)
	opts.Clock = brokenClock{t}
	opts.RefreshOnRepeat = true
	s := openStore(t, opts)
	p := s.Partition(0)
	w := opts.Window.W
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	claimOne(t, p, Claim{Key: []byte("a"), Fingerprint: 1, At: t0}, true)
	claimOne(t, p, Claim{Key: []byte("refreshed"), Fingerprint: 2, At: t0}, true)
	claimOne(t, p, Claim{Key: []byte("refreshed"), Fingerprint: 2, At: t0.Add(w / 2)}, false)
	v := p.Version()
	claimOne(t, p, Claim{Key: []byte("written later"), Fingerprint: 3, At: t0}, true)
	ctx := context.Background()

	if st, err := p.Expire(ctx, t0.Add(w-time.Nanosecond), 0); err != nil || st.Records != 0 {
		t.Fatalf("Expire just before W = %+v, %v; want nothing removed", st, err)
	}
	st, err := p.Expire(ctx, t0.Add(w), v)
	if err != nil || st.Records != 1 {
		t.Fatalf("Expire at first+W, up to the version before %q = %+v, %v; want 1 removed", "written later", st, err)
	}
	if _, _, found, err := s.Find([]byte("a")); err != nil || found {
		t.Errorf("Find(a) after Expire = %v, %v; want removed", found, err)
	}
	for _, k := range []string{"refreshed", "written later"} {
		if _, _, found, err := s.Find([]byte(k)); err != nil || !found {
			t.Errorf("Find(%s) after Expire = %v, %v; want kept", k, found, err)
		}
	}
	if st, err := p.Expire(ctx, t0.Add(w+w/2), 0); err != nil || st.Records != 2 {
		t.Fatalf("Expire at the refreshed end = %+v, %v; want both left removed", st, err)
	}
}
