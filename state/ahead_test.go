package state

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dedupe-stage/dedupe-stage/window"
)

// TestDropAfter drops the records whose forwards are past an output
// sequence, as after a server that lost acknowledged writes: their keys
// are New again, the others (and one without an output sequence) stay
// repeats, the cursor comes down, and all of it holds after a restart
// with the filter loaded or rebuilt.
func TestDropAfter(t *testing.T) {
	filterOnAndOff(t, func(t *testing.T, opts Options, _ *window.ManualClock) {
		ctx := context.Background()
		s, err := Open(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		p := s.Partition(0)
		claims := []Claim{
			{Key: []byte("a"), Fingerprint: 1, OutputSeq: 3},
			{Key: []byte("b"), Fingerprint: 2, OutputSeq: 5},
			{Key: []byte("c"), Fingerprint: 3, OutputSeq: 9},
			{Key: []byte("d"), Fingerprint: 4, OutputSeq: 12},
			{Key: []byte("old"), Fingerprint: 5}, // no output sequence: kept
		}
		if _, err := p.ClaimWithCursor(claims, 12); err != nil {
			t.Fatal(err)
		}
		if seqs, err := p.OutputSeqs(ctx, 9); err != nil || !slices.Equal(seqs, []uint64{3, 5, 9}) {
			t.Fatalf("OutputSeqs(9) = %v, %v; want [3 5 9]", seqs, err)
		}
		if n, err := p.DropAfter(ctx, 5); err != nil || n != 2 {
			t.Fatalf("DropAfter(5) = %d, %v; want 2 records dropped", n, err)
		}
		if n, err := p.DropAfter(ctx, 5); err != nil || n != 0 {
			t.Fatalf("DropAfter(5) again = %d, %v; want 0", n, err)
		}
		check := func(p *Partition) {
			t.Helper()
			if c, err := p.Cursor(); err != nil || c != 5 {
				t.Errorf("Cursor = %d, %v; want 5", c, err)
			}
			if seqs, err := p.OutputSeqs(ctx, 100); err != nil || !slices.Equal(seqs, []uint64{3, 5}) {
				t.Errorf("OutputSeqs(100) = %v, %v; want [3 5]", seqs, err)
			}
			for _, k := range []string{"a", "b", "old"} {
				if _, held, err := p.Held([]byte(k)); err != nil || !held {
					t.Errorf("Held(%s) = %v, %v; want held", k, held, err)
				}
			}
			for _, k := range []string{"c", "d"} {
				if rec, held, err := p.Held([]byte(k)); err != nil || held || rec.OutputSeq != 0 {
					t.Errorf("Held(%s) = %+v, %v, %v; want no record", k, rec, held, err)
				}
			}
		}
		check(p)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = openStore(t, opts)
		check(s.Partition(0))
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(PartitionDir(opts.Dir, 0), SnapshotFile)); err != nil {
			t.Fatal(err)
		}
		s = openStore(t, opts)
		p = s.Partition(0)
		check(p)

		// The dropped keys' next copies are New; the kept ones repeats.
		res, err := p.Claim([]Claim{{Key: []byte("c"), Fingerprint: 3, OutputSeq: 6}, {Key: []byte("a"), Fingerprint: 1}})
		if err != nil || !res[0].New || res[1].New {
			t.Fatalf("claims after the drop = %+v, %v; want c New, a a repeat", res, err)
		}
	})
}
