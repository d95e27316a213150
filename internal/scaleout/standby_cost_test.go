package scaleout

import (
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/lograte"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

var standbyCostKeys = flag.Int("standby-cost-keys", 120_000, "TestScaleOutStandbyCost: forwards of the standby partition in the output stream")

// standbyCostPrefix is TestScaleOutStandbyCost's output subject prefix.
const standbyCostPrefix = "deduped"

// TestScaleOutStandbyCost tails, as a warm standby, a partition whose
// changelog holds -standby-cost-keys forwards from an in-process
// nats-server into a new store (tailStep, standbyStep sequences at a time,
// until the cursor is at the last forward), checks that every record is
// applied once and the cursor is at the end, and reports what a standby
// key costs: the Go heap in use after the tail less that before the store
// was opened and less that of the empty store (after a GC), the Bloom
// filter's part of it, and the data dir's
// bytes once the store is closed (its memtables flushed), each per key.
//
//	go test -run TestScaleOutStandbyCost -v ./internal/scaleout/ -args -standby-cost-keys 1000000
func TestScaleOutStandbyCost(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes and tails a partition of -standby-cost-keys forwards; not with -short")
	}
	n := *standbyCostKeys
	ctx := context.Background()
	srv := natstest.RunServer(t, t.TempDir())
	_, js := natstest.Connect(t, srv.ClientURL())
	const stream = "OUT"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{standbyCostPrefix + ".>", changelog.ControlSubjects(standbyCostPrefix)},
		Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	publishPartitionForwards(t, js, n)

	w, err := window.Derive([]window.Path{{Name: "retry", Max: time.Hour}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	opts := state.DefaultOptions(dir, w)
	opts.Partitions, opts.SyncWrites, opts.GCInterval, opts.SnapshotInterval = 1, false, 0, 0
	opts.Filter.ExpectedKeys = uint(n)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts.Logger = quiet
	heapNone := heapInUse()
	st, err := state.Open(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	reg := prometheus.NewRegistry()
	g := &Group{opts: Options{Partitions: 1, Standbys: 1}, js: js, log: quiet, logs: lograte.New(quiet, lograte.Options{}, reg),
		clock: window.SystemClock{}, busy: make([]sync.Mutex, 1), instance: "b", prefix: standbyCostPrefix, outStream: stream,
		retention: 2 * time.Hour, terms: "W", metrics: newScaleOutMetrics(reg),
		owned: map[int]string{}, standby: map[int]bool{0: true}}
	p := st.Partition(0)
	heapBase := heapInUse()
	start := time.Now()
	steps := 0
	for more := true; more; steps++ {
		if steps > n/standbyStep+3 {
			t.Fatalf("still more to tail after %d steps", steps)
		}
		if more, err = g.tailStep(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	heapAfter := heapInUse()
	heap, heapAll := heapAfter-heapBase, heapAfter-heapNone
	cursor, err := p.Cursor()
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if last := info.CachedInfo().State.LastSeq; cursor != last {
		t.Errorf("cursor %d after the tail, want the last forward's sequence %d", cursor, last)
	}
	if want := (n + standbyStep - 1) / standbyStep; steps < want {
		t.Errorf("%d steps for %d sequences, want at least %d of %d", steps, n, want, standbyStep)
	}
	if got := testCounter(t, g.metrics.sbRecords); got != float64(n) {
		t.Errorf("dedupe_standby_records_total %v, want %d", got, n)
	}
	// A step with nothing new reads nothing and says so.
	if more, err := g.tailStep(ctx, p); more || err != nil {
		t.Errorf("a step at the end: more %v, %v; want nothing", more, err)
	}
	// A partition this instance owns is not tailed.
	g.owned[0] = "pin"
	if g.standbyOf(0) || len(g.standbyPartitions()) != 0 || !g.Keeps(0) {
		t.Errorf("owned: standby %v, standbys %v, keeps %v; want no standby, kept", g.standbyOf(0), g.standbyPartitions(), g.Keeps(0))
	}
	filter := p.Stats().FilterBytes
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	disk := dirBytes(t, dir)
	per := func(b int64) float64 { return float64(b) / float64(n) }
	t.Logf("standby cost at %d keys: disk %.1f B/key; heap %.1f B/key with the store (its Bloom filter %.1f, the rest Badger's buffers), %.1f B/key added by the tail; tailed in %d steps, %v (%.0f records/s)",
		n, per(disk), per(heapAll), per(int64(filter)), per(heap), steps, took.Round(time.Millisecond), float64(n)/took.Seconds())
}

// publishPartitionForwards publishes n forwards of partition 0, each with
// its record, into the output stream under standbyCostPrefix.
func publishPartitionForwards(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	const inFlight = 1024
	first := time.Now().Add(-time.Minute)
	var futures []jetstream.PubAckFuture
	for i := range n {
		k := fmt.Sprintf("key-%09d", i)
		m := &nats.Msg{Subject: changelog.PartitionSubject(standbyCostPrefix, 0, "events.orders"), Header: nats.Header{}, Data: []byte(k)}
		m.Header.Set(jetstream.MsgIDHeader, k)
		changelog.Annotate(m.Header, first.Add(time.Duration(i)*time.Microsecond), changelog.Fingerprint(m.Data))
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
		if len(futures) == inFlight || i == n-1 {
			for _, f := range futures {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					t.Fatal(err)
				case <-time.After(30 * time.Second):
					t.Fatal("no ack within 30s")
				}
			}
			futures = futures[:0]
		}
	}
}

// heapInUse is the Go heap in use after a GC.
func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// dirBytes is the size of the files under dir.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// testCounter reads counter c.
func testCounter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 {
		t.Fatalf("gather: %v", err)
	}
	return mfs[0].GetMetric()[0].GetCounter().GetValue()
}
