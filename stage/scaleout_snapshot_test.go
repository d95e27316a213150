package stage_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// kill stops r as a crash does: its connection drops first, so it acks
// nothing more and releases no partition (they move after the pin's TTL),
// then its Run and its store end.
func (r *running) kill(t *testing.T, nc interface{ Close() }) {
	t.Helper()
	nc.Close()
	r.cancel()
	r.cancel = nil
	select {
	case <-r.done:
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return 60s after the kill")
	}
	_ = r.st.Close() // its connection is gone: errors expected
}

// snapshotHandOver runs instance a alone (its own connection) on round 1
// of keys, has it write a snapshot of every partition, then runs round 2
// (the tail the snapshots do not hold), calls damage, kills a and
// starts b with an empty data dir. b is given a copy of every key of both
// rounds and as many new keys: it must judge every copy a repeat and
// forward each new key once. It returns b's registry and the rounds'
// sizes.
func snapshotHandOver(t *testing.T, damage func(e *env)) (b *running, round1, round2 int) {
	e := newScaleOutEnv(t)
	e.cfg.ScaleOut.SnapshotInterval = config.Duration(time.Hour) // written by the test, not the ticker
	// b starts while a's presence is still live: as a's warm standby it
	// would tail the changelog and take the partitions from its local
	// store (docs/scale-out.md §4.4); this hand-over is the snapshot's.
	e.cfg.ScaleOut.Standbys = 0
	ea, eb := e.as("a"), e.as("b")
	ea.nc, ea.js = natstest.Connect(t, e.srv.ClientURL())
	a := ea.start()

	evs, unique := workload(31, 2000, 0.2)
	e.publishKeys(keysOf(evs), unique)
	e.scaleOutDrained(60 * time.Second)
	round1 = len(unique)
	natstest.WaitFor(t, 30*time.Second, "a to own every partition", func() bool {
		return gauge(t, a.reg, "dedupe_partitions_owned") == 4
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if n, err := a.st.WriteSnapshots(ctx); err != nil || n != 4 {
		t.Fatalf("write snapshots of %d partitions: %v; want 4", n, err)
	}
	if got := gauge(t, a.reg, "dedupe_snapshot_records"); got != float64(round1) {
		t.Fatalf("a's snapshots hold %v records, want the %d keys it forwarded", got, round1)
	}
	checkSnapshotBucket(t, e)

	tail, tailPayload := workload(32, 1000, 0)
	for k, v := range tailPayload {
		unique[k] = v
	}
	e.publishKeys(keysOf(tail), unique)
	e.scaleOutDrained(60 * time.Second)
	round2 = len(unique) - round1
	e.checkOnce(e.scaleOutOutput(), unique)
	if damage != nil {
		damage(e)
	}

	a.kill(t, ea.nc)
	b = eb.start()
	copies := make([]string, 0, 2*len(unique))
	for k := range unique {
		copies = append(copies, k)
	}
	fresh, freshPayload := workload(33, 500, 0)
	for _, ev := range fresh {
		copies = append(copies, ev.key)
		unique[ev.key] = freshPayload[ev.key]
	}
	e.publishKeys(copies, unique)
	e.scaleOutDrained(120 * time.Second)
	e.checkOnce(e.scaleOutOutput(), unique)
	if got := counter(t, b.reg, "dedupe_messages_total", map[string]string{"outcome": "repeat"}); got < float64(round1+round2) {
		t.Errorf("b judged %v copies repeats, want every one of the %d keys of the snapshot and the tail", got, round1+round2)
	}
	if got := counter(t, b.reg, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != float64(len(fresh)) {
		t.Errorf("b forwarded %v new keys, want %d", got, len(fresh))
	}
	return b, round1, round2
}

// checkSnapshotBucket checks the bucket the stage created: named after the
// group, as many replicas as the output, objects kept the output's
// retention.
func checkSnapshotBucket(t *testing.T, e *env) {
	t.Helper()
	w, err := e.cfg.Window.Derive()
	if err != nil {
		t.Fatal(err)
	}
	bucket, _, keep, _ := e.cfg.ScaleOutSnapshots(w.W)
	obs, err := e.js.ObjectStore(context.Background(), bucket)
	if err != nil {
		t.Fatalf("snapshot bucket %s: %v", bucket, err)
	}
	st, err := obs.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Replicas() != 1 || st.TTL() != keep {
		t.Errorf("bucket %s: %d replicas, TTL %v; want 1 (the output's) and %v", bucket, st.Replicas(), st.TTL(), keep)
	}
}

// TestScaleOutSnapshotHandOver: the new owner of partitions whose owner
// was killed loads their snapshots and replays only the tail after them,
// and judges copies of keys of both parts as repeats.
func TestScaleOutSnapshotHandOver(t *testing.T) {
	b, round1, round2 := snapshotHandOver(t, nil)
	if got := counter(t, b.reg, "dedupe_restore_path_total", map[string]string{"path": "snapshot"}); got < 4 {
		t.Errorf("%v takeovers restored from a snapshot, want every one of the 4 partitions", got)
	}
	if got := counter(t, b.reg, "dedupe_restore_path_total", map[string]string{"path": "full"}); got != 0 {
		t.Errorf("%v takeovers read the whole changelog, want none", got)
	}
	// Each takeover's duration is observed once, under its restore's path.
	if got := counter(t, b.reg, "dedupe_partition_restore_seconds", map[string]string{"path": "snapshot"}); got < 4 {
		t.Errorf("dedupe_partition_restore_seconds{path=snapshot} holds %v takeovers, want every one of the 4 partitions", got)
	}
	// Read first: a takeover counts before it observes its duration.
	if got, takeovers := counter(t, b.reg, "dedupe_partition_restore_seconds", nil), counter(t, b.reg, "dedupe_partition_takeovers_total", nil); got > takeovers {
		t.Errorf("dedupe_partition_restore_seconds holds %v takeovers, more than the %v of dedupe_partition_takeovers_total", got, takeovers)
	}
	if got := counter(t, b.reg, "dedupe_snapshot_restore_records_total", nil); got < float64(round1) {
		t.Errorf("b loaded %v records from snapshots, want the %d they hold", got, round1)
	}
	// A lapsed pin on a loaded machine makes a second takeover, which
	// restores after the local cursor: at least the tail, once.
	got := counter(t, b.reg, "dedupe_restore_records_total", nil)
	if got < float64(round2) || got >= float64(round1) {
		t.Errorf("b replayed %v records of the changelog, want the %d of the tail (not the %d the snapshots hold)", got, round2, round1)
	}
}

// TestScaleOutSnapshotCorrupt: the same hand-over with every snapshot
// damaged (a byte flipped in the middle): the new owner finds it out,
// reads the whole changelog instead, and is as exact.
func TestScaleOutSnapshotCorrupt(t *testing.T) {
	b, round1, round2 := snapshotHandOver(t, func(e *env) {
		w, _ := e.cfg.Window.Derive()
		bucket, _, _, _ := e.cfg.ScaleOutSnapshots(w.W)
		ctx := context.Background()
		obs, err := e.js.ObjectStore(ctx, bucket)
		if err != nil {
			e.t.Fatal(err)
		}
		for p := range e.cfg.State.Partitions {
			name := layout.Member(p)
			res, err := obs.Get(ctx, name)
			if err != nil {
				e.t.Fatal(err)
			}
			data, err := io.ReadAll(res)
			res.Close()
			if err != nil {
				e.t.Fatal(err)
			}
			data[len(data)/2] ^= 0x55
			if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: name}, bytes.NewReader(data)); err != nil {
				e.t.Fatal(err)
			}
		}
	})
	if got := counter(t, b.reg, "dedupe_restore_path_total", map[string]string{"path": "full"}); got < 4 {
		t.Errorf("%v takeovers read the whole changelog, want every one of the 4 partitions", got)
	}
	if got := counter(t, b.reg, "dedupe_restore_path_total", map[string]string{"path": "snapshot"}); got != 0 {
		t.Errorf("%v takeovers restored from a corrupt snapshot, want none", got)
	}
	if got := counter(t, b.reg, "dedupe_restore_records_total", nil); got < float64(round1+round2) {
		t.Errorf("b replayed %v records of the changelog, want all %d", got, round1+round2)
	}
}

// TestScaleOutSnapshotEveryInterval: with scale_out.snapshot_interval set,
// a running owner writes a snapshot of each partition it owns in the
// background, and again once more keys were forwarded; each holds every
// key forwarded before it.
func TestScaleOutSnapshotEveryInterval(t *testing.T) {
	e := newScaleOutEnv(t)
	e.cfg.ScaleOut.SnapshotInterval = config.Duration(time.Second)
	a := e.as("a").start()
	forwarded := 0
	for round := range 2 {
		evs, unique := workload(uint64(41+round), 500, 0.2)
		e.publishKeys(keysOf(evs), unique)
		e.scaleOutDrained(60 * time.Second)
		forwarded += len(unique)
		natstest.WaitFor(t, 60*time.Second, "snapshots holding every forwarded key", func() bool {
			return metrictest.Sum(t, a.reg, "dedupe_snapshot_records", nil) == float64(forwarded)
		})
	}
	if got := counter(t, a.reg, "dedupe_snapshot_writes_total", map[string]string{"result": "ok"}); got < 8 {
		t.Errorf("%v snapshots written, want at least 4 per round", got)
	}
	if got := counter(t, a.reg, "dedupe_snapshot_writes_total", map[string]string{"result": "failed"}); got != 0 {
		t.Errorf("%v snapshot writes failed, want none", got)
	}
	// Read first: a write counts before it observes its duration, and
	// writes go on in the background.
	if got, written := counter(t, a.reg, "dedupe_snapshot_write_seconds", nil), counter(t, a.reg, "dedupe_snapshot_writes_total", map[string]string{"result": "ok"}); got < 8 || got > written {
		t.Errorf("dedupe_snapshot_write_seconds holds %v writes, want at least 4 per round and at most the %v written", got, written)
	}
	// Rounds with nothing new keep each partition's snapshot current:
	// its last-success time moves on without a write.
	drained := time.Now()
	for p := range 4 {
		label := map[string]string{"partition": strconv.Itoa(p)}
		natstest.WaitFor(t, 30*time.Second, fmt.Sprintf("partition %d's snapshot current after the drain", p), func() bool {
			v, ok := metrictest.Lookup(t, a.reg, "dedupe_snapshot_last_success_timestamp_seconds", label)
			return ok && v > float64(drained.Unix())
		})
	}
	checkSnapshotBucket(t, e)
}
