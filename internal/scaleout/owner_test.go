package scaleout

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// TestClaimCursorLeavesOutDuplicates checks that an owner's cursor moves
// only to sequences its batches stored: a duplicate's sequence is where
// the stream held the key already, maybe another owner's record written
// after this owner's fence moved (forward's
// TestZombieDuplicatesPassAMovedFenceOnR3), which this store does not hold.
func TestClaimCursorLeavesOutDuplicates(t *testing.T) {
	w, err := window.Derive([]window.Path{{Name: "client-retry", Max: 50 * time.Minute}}, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	opts := state.DefaultOptions(t.TempDir(), w)
	opts.Partitions, opts.SyncWrites, opts.GCInterval, opts.SnapshotInterval = 1, false, 0, 0
	opts.MemoryBudget, opts.Filter.ExpectedKeys = 8<<20, 10_000
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := state.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	p := st.Partition(0)
	o := &Owner{tenure: &tenure{}}

	stored := func(seq uint64) forward.Result { return forward.Result{Done: true, Seq: seq} }
	dup := func(seq uint64) forward.Result { return forward.Result{Done: true, Duplicate: true, Seq: seq} }
	refused := forward.Result{Done: true, Err: io.ErrUnexpectedEOF}
	for _, step := range []struct {
		what string
		res  []forward.Result
		want uint64
	}{
		{"a batch it stored", []forward.Result{stored(10), stored(11)}, 11},
		{"duplicates alone, at another owner's sequences", []forward.Result{dup(50), dup(51)}, 11},
		{"stored and duplicate", []forward.Result{stored(60), dup(70), refused}, 60},
		{"a duplicate of its own earlier record", []forward.Result{dup(12)}, 60},
	} {
		claims := make([]state.Claim, len(step.res))
		for i := range claims {
			claims[i] = state.Claim{Key: []byte(step.what + string(rune('a'+i)))}
		}
		if _, err := o.Claim(p, claims, step.res); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		if c, err := p.Cursor(); err != nil || c != step.want {
			t.Errorf("after %s: cursor %d (%v), want %d", step.what, c, err, step.want)
		}
	}
}
