package changelog_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// owner is one instance's hold on partition part: its own store and the
// fence it took.
type owner struct {
	name  string
	store *state.Store
	fence forward.Fence
}

const part = 0

// openOwner opens an instance's one-partition store in its own directory.
func openOwner(t *testing.T, name string) *owner {
	t.Helper()
	w, err := window.Derive([]window.Path{{Name: "client-retry", Max: 50 * time.Minute}}, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	o := state.DefaultOptions(t.TempDir(), w)
	o.Partitions = 1
	o.SyncWrites = false
	o.GCInterval, o.SnapshotInterval = 0, 0
	o.MemoryBudget = 8 << 20
	o.Filter.ExpectedKeys = 10_000
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := state.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &owner{name: name, store: s}
}

// take takes the partition's fence and restores the partition from the
// owner's cursor + 1 up to it, as a takeover does. It returns how many
// records it read back.
func (o *owner) take(t *testing.T, js jetstream.JetStream) int {
	t.Helper()
	ctx := context.Background()
	subj := changelog.FenceSubject(prefix, part)
	f, err := changelog.Take(ctx, js, "OUT", subj, o.name)
	if err != nil {
		t.Fatalf("%s takes the fence: %v", o.name, err)
	}
	o.fence = forward.Fence{Subject: subj, Seq: f}
	p := o.store.Partition(0)
	cursor, err := p.Cursor()
	if err != nil {
		t.Fatal(err)
	}
	var recs []state.Restored
	st, err := changelog.Restore(ctx, js, "OUT", changelog.PartitionFilter(prefix, part), subj, changelog.KeyStateSubject(prefix, part), cursor+1, time.Time{}, f,
		func(r changelog.Record, _ uint64) error {
			recs = append(recs, state.Restored{Key: r.Key, FirstSeen: r.FirstSeen, Fingerprint: r.Fingerprint})
			return nil
		})
	if err != nil {
		t.Fatalf("%s restores: %v", o.name, err)
	}
	if err := p.Restore(recs, f); err != nil {
		t.Fatalf("%s restores: %v", o.name, err)
	}
	return st.Records
}

// forwardNew judges keys as the stage does: the ones the partition does not
// hold are forwarded, annotated, as one fenced atomic batch, then claimed
// with the batch's last sequence as the cursor. It returns the keys
// forwarded, or the publish error (no claim then).
func (o *owner) forwardNew(t *testing.T, js jetstream.JetStream, keys ...string) ([]string, error) {
	t.Helper()
	p := o.store.Partition(0)
	var msgs []*nats.Msg
	var claims []state.Claim
	var sent []string
	for _, k := range keys {
		r, err := p.Lookup([]byte(k), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Found {
			continue
		}
		first := time.Now()
		fp := uint64(len(k))
		h := nats.Header{jetstream.MsgIDHeader: {k}}
		changelog.Annotate(h, first, fp)
		msgs = append(msgs, &nats.Msg{Subject: changelog.PartitionSubject(prefix, part, "events.k"), Header: h, Data: []byte(k)})
		claims = append(claims, state.Claim{Key: []byte(k), At: first, Fingerprint: fp})
		sent = append(sent, k)
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	res := make([]forward.Result, len(msgs))
	fence := o.fence
	if err := forward.Batch(context.Background(), js, msgs, res, forward.Options{Atomic: true, Fence: &fence}); err != nil {
		return nil, err
	}
	if _, err := p.ClaimWithCursor(claims, res[len(res)-1].Seq); err != nil {
		t.Fatal(err)
	}
	return sent, nil
}

// TestHandoffAndBack plays a partition's hand-over with the building
// blocks: A owns it and forwards; B takes it, restores A's records, and
// judges A's keys as repeats; A, a zombie, is refused and stores nothing;
// A takes the partition back, catches up from its cursor with B's records
// only, and judges B's keys as repeats. The output holds each key once.
func TestHandoffAndBack(t *testing.T) {
	js := outStream(t)
	a, b := openOwner(t, "A"), openOwner(t, "B")

	if n := a.take(t, js); n != 0 {
		t.Fatalf("A restored %d records from an empty output", n)
	}
	if sent, err := a.forwardNew(t, js, "k1", "k2", "k3"); err != nil || len(sent) != 3 {
		t.Fatalf("A forwards k1..k3: %v, %v", sent, err)
	}

	if n := b.take(t, js); n != 3 {
		t.Fatalf("B restored %d records, want A's 3", n)
	}
	holdsSame(t, b, a, "k1", "k2", "k3")
	if sent, err := b.forwardNew(t, js, "k2", "k4", "k5"); err != nil || fmt.Sprint(sent) != "[k4 k5]" {
		t.Fatalf("B judges k2 k4 k5: forwarded %v, %v; want [k4 k5]", sent, err)
	}

	if sent, err := a.forwardNew(t, js, "k6"); !retry.IsFenced(err) {
		t.Fatalf("zombie A forwards k6: %v, %v; want fenced", sent, err)
	}
	if c, err := a.store.Partition(0).Cursor(); err != nil || c == 0 {
		t.Fatalf("A's cursor: %d, %v", c, err)
	}

	if n := a.take(t, js); n != 2 {
		t.Fatalf("A, taking the partition back, read %d records after its cursor, want B's 2", n)
	}
	holdsSame(t, a, b, "k4", "k5")
	if sent, err := a.forwardNew(t, js, "k4", "k5", "k6"); err != nil || fmt.Sprint(sent) != "[k6]" {
		t.Fatalf("A, owner again, judges k4 k5 k6: forwarded %v, %v; want [k6]", sent, err)
	}

	ids := map[string]int{}
	for _, m := range readOut(t, js) {
		ids[m]++
	}
	for _, k := range []string{"k1", "k2", "k3", "k4", "k5", "k6"} {
		if ids[k] != 1 {
			t.Errorf("%s is in the output %d times, want once", k, ids[k])
		}
	}
}

// holdsSame fails unless to holds each key with the record from holds.
func holdsSame(t *testing.T, to, from *owner, keys ...string) {
	t.Helper()
	for _, k := range keys {
		want, err := from.store.Partition(0).Lookup([]byte(k), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := to.store.Partition(0).Lookup([]byte(k), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if !want.Found || !got.Found || !got.Record.FirstSeen.Equal(want.Record.FirstSeen) || got.Record.Fingerprint != want.Record.Fingerprint {
			t.Errorf("%s holds %s as %+v, %s as %+v: want the same record", to.name, k, got, from.name, want)
		}
	}
}

// readOut returns the Nats-Msg-Id of every message in stream OUT but the
// fence messages.
func readOut(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	var ids []string
	for _, m := range natstest.ReadAll(t, js, "OUT") {
		if m.Subject != changelog.FenceSubject(prefix, part) {
			ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
		}
	}
	return ids
}
