package stage_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// The scale-out benchmarks run on one in-process server (R1 streams), so
// that what they time is the stage's work, not replication; the instances
// share the process, as they share this machine's cores. Run them alone:
//
//	go test -run '^$' -bench 'BenchmarkScaleOut' -benchtime 1x ./stage/
//	go test -run '^$' -bench 'BenchmarkScaleOutRestore' -benchtime 1x ./stage/ -args -scaleout.restore-keys 10000000
//
// The partition count is benchPartitions; the group is "dedupe".

const benchPartitions = 4

// scaleOutBenchConfig is the configuration of one instance: the key is the
// second token of orders.<key> (the server partitions the input), or, with
// routed, the Event-Id header (the route step partitions it).
func scaleOutBenchConfig(b *testing.B, url string, routed bool) config.Config {
	cfg := config.Default()
	yes := true
	cfg.NATS.URL = url
	cfg.NATS.CreateStreams = &yes
	cfg.HTTP.Addr = ""
	cfg.Input.Subjects = []string{"orders.*"}
	cfg.Input.AckWait = config.Duration(2 * time.Second)
	cfg.Key = keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceSubject, SubjectToken: 2}, MaxLength: 256}
	if routed {
		cfg.Key = keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceHeader, Header: "Event-Id"}, MaxLength: 256}
	}
	cfg.State.Partitions = benchPartitions
	cfg.ScaleOut.Enabled = true
	cfg.ScaleOut.Replicas = 1
	return cfg
}

// benchInstance is one instance of the group, running.
type benchInstance struct {
	reg    *prometheus.Registry
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan error
	st     *stage.Stage
}

// startInstance starts instance name on its own connection and data dir.
func startInstance(b *testing.B, cfg config.Config, name string) *benchInstance {
	b.Helper()
	cfg.ScaleOut.Instance = name
	cfg.State.DataDir = b.TempDir()
	nc, _ := natstest.Connect(b, cfg.NATS.URL)
	reg := prometheus.NewRegistry()
	// Warnings and errors only, so that a benchmark that stalls says why.
	st, err := stage.New(context.Background(), stage.Options{Config: cfg, Conn: nc, Registry: reg,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("instance", name)})
	if err != nil {
		b.Fatalf("instance %s: %v", name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &benchInstance{reg: reg, nc: nc, cancel: cancel, done: make(chan error, 1), st: st}
	go func() { in.done <- st.Run(ctx) }()
	return in
}

// stop stops the instance cleanly (it unpins what it owns).
func (in *benchInstance) stop(b *testing.B) {
	b.Helper()
	in.cancel()
	select {
	case <-in.done:
	case <-time.After(time.Minute):
		b.Fatal("instance did not stop in 1m")
	}
	_ = in.st.Close()
}

// sum adds up the counter (or gauge) name over its series with labels.
func (in *benchInstance) sum(b *testing.B, name string, labels map[string]string) float64 {
	b.Helper()
	return metrictest.Sum(b, in.reg, name, labels)
}

// publishOrders publishes the events keys[i] on orders.<key> (or, routed,
// on orders.x with the key in Event-Id), each with a 256-byte payload.
func publishOrders(b *testing.B, js jetstream.JetStream, ks []string, routed bool) {
	b.Helper()
	pjs, err := jetstream.New(js.Conn(), jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	for i, k := range ks {
		data := make([]byte, benchPayload)
		copy(data, k)
		m := &nats.Msg{Subject: "orders." + k, Data: data}
		if routed {
			m = &nats.Msg{Subject: "orders.x", Header: nats.Header{"Event-Id": []string{k}}, Data: data}
		}
		if _, err := pjs.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
			b.Fatalf("publish %d: %v", i, err)
		}
	}
	select {
	case <-pjs.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("publishes not acknowledged in 5m")
	}
}

// benchKeys returns n event keys, 10% of them repeats of earlier ones.
func benchKeys(n int) []string {
	unique := max(1, int(float64(n)*(1-benchRepeatRatio)))
	ks := make([]string, n)
	for i := range ks {
		k := i
		if i >= unique {
			k = (i * 7919) % unique
		}
		ks[i] = fmt.Sprintf("evt-%016x", uint64(k)*0x9e3779b97f4a7c15)
	}
	return ks
}

// createStreams creates the streams a scale-out stage creates.
func createStreams(tb testing.TB, js jetstream.JetStream, cfg config.Config) {
	tb.Helper()
	streams, err := stage.StreamsToCreate(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	for _, s := range streams {
		if _, err := js.CreateStream(context.Background(), s.Config); err != nil {
			tb.Fatalf("create %s: %v", s.Config.Name, err)
		}
	}
}

// recordKey is the key of the i-th record publishRecords writes.
func recordKey(i int) string { return fmt.Sprintf("rec-%016x", uint64(i)*0x9e3779b97f4a7c15) }

// publishRecords writes n records to cfg's output stream as an owner of
// the group forwards them (on orders.<key>, first seen at firstSeen, each
// with payload data) and waits until all are stored: the changelog a new
// owner restores from.
func publishRecords(tb testing.TB, js jetstream.JetStream, cfg config.Config, n int, data []byte, firstSeen time.Time) {
	tb.Helper()
	pjs, err := jetstream.New(js.Conn(), jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		tb.Fatal(err)
	}
	fp := fingerprintOf(data)
	for i := range n {
		k := recordKey(i)
		p := partitionOf(k, cfg.State.Partitions)
		m := &nats.Msg{Subject: changelog.PartitionSubject(cfg.Output.SubjectPrefix, p, "orders."+k), Header: nats.Header{}, Data: data}
		m.Header.Set(jetstream.MsgIDHeader, k)
		changelog.Annotate(m.Header, firstSeen, fp)
		if _, err := pjs.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
			tb.Fatalf("publish record %d: %v", i, err)
		}
	}
	select {
	case <-pjs.PublishAsyncComplete():
	case <-time.After(10 * time.Minute):
		tb.Fatal("records not acknowledged in 10m")
	}
}

// BenchmarkScaleOutThroughput drains a backlog of b.N events (10%
// repeats) through 1, 2 and 3 instances of a group, with the key in the
// subject (the server partitions the input) and in a header (the route
// step partitions it, one more write and read per event). The instances
// start together on an empty server, so each takes the partitions it is
// pinned first; events/s is what they judge together.
func BenchmarkScaleOutThroughput(b *testing.B) {
	for _, routed := range []bool{false, true} {
		for _, n := range []int{1, 2, 3} {
			b.Run(fmt.Sprintf("route=%v/instances=%d", routed, n), func(b *testing.B) {
				srv := natstest.RunServer(b, "")
				_, js := natstest.Connect(b, srv.ClientURL())
				cfg := scaleOutBenchConfig(b, srv.ClientURL(), routed)
				createStreams(b, js, cfg)
				publishOrders(b, js, benchKeys(b.N), routed)
				b.ResetTimer()
				var ins []*benchInstance
				for i := range n {
					ins = append(ins, startInstance(b, cfg, fmt.Sprintf("i%d", i)))
				}
				natstest.Poll(b, benchDrainLimit, 5*time.Millisecond, fmt.Sprintf("%d events judged", b.N), func() (bool, error) {
					judged := 0.0
					for _, in := range ins {
						judged += in.sum(b, "dedupe_messages_total", nil)
					}
					return judged >= float64(b.N), fmt.Errorf("%v judged", judged)
				})
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
				for i, in := range ins {
					b.ReportMetric(in.sum(b, "dedupe_partitions_owned", nil), fmt.Sprintf("partitions_i%d", i))
					in.stop(b)
				}
			})
		}
	}
}

// restoreKeysFlag lists the record counts BenchmarkScaleOutRestore
// restores, one sub-benchmark each.
var restoreKeysFlag = flag.String("scaleout.restore-keys", "100000,1000000", "record counts BenchmarkScaleOutRestore restores, comma-separated (10000000 takes minutes to write)")

// BenchmarkScaleOutRestore times an instance with an empty data dir taking
// the 4 partitions of an output stream holding each count of records
// -scaleout.restore-keys lists (100k and 1M by default)
// (restored in parallel, one worker per partition): from Run until every
// partition is taken, which is when its first batch is judged. path=full
// reads the whole changelog back; path=snapshot loads the snapshots an
// owner wrote after restoring them (and the changelog after them, a few
// records).
func BenchmarkScaleOutRestore(b *testing.B) {
	var counts []int
	for f := range strings.SplitSeq(*restoreKeysFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("-scaleout.restore-keys %q: want a comma-separated list of key counts", *restoreKeysFlag)
		}
		counts = append(counts, n)
	}
	for _, keysN := range counts {
		for _, path := range []string{"full", "snapshot"} {
			b.Run(fmt.Sprintf("keys=%d/path=%s", keysN, path), func(b *testing.B) {
				srv := natstest.RunServer(b, "")
				_, js := natstest.Connect(b, srv.ClientURL())
				cfg := scaleOutBenchConfig(b, srv.ClientURL(), false)
				cfg.Filter.ExpectedKeys = uint64(keysN) // sized for the keys restored, as an operator would
				createStreams(b, js, cfg)
				publishRecords(b, js, cfg, keysN, make([]byte, benchPayload), time.Now())
				// One input message per partition makes each taken.
				var wake []string
				for i := 0; len(wake) < benchPartitions; i++ {
					k := fmt.Sprintf("wake-%d", i)
					if partitionOf(k, benchPartitions) == len(wake) {
						wake = append(wake, k)
					}
				}
				var writeS, bytesPerKey float64
				if path == "snapshot" {
					// An owner that restored every partition writes their
					// snapshots, then stops.
					seed := startInstance(b, cfg, "seed")
					publishOrders(b, js, wake, false)
					natstest.WaitFor(b, benchDrainLimit, "the seed to take every partition", func() bool {
						return seed.sum(b, "dedupe_partitions_owned", nil) == benchPartitions &&
							seed.sum(b, "dedupe_messages_total", nil) >= benchPartitions
					})
					t0 := time.Now()
					if n, err := seed.st.WriteSnapshots(context.Background()); err != nil || n != benchPartitions {
						b.Fatalf("snapshots of %d partitions: %v", n, err)
					}
					writeS, bytesPerKey = time.Since(t0).Seconds(), seed.sum(b, "dedupe_snapshot_bytes", nil)/float64(keysN)
					seed.stop(b)
				}
				b.ResetTimer()
				for i := range b.N {
					b.StopTimer()
					publishOrders(b, js, wake, false)
					b.StartTimer()
					in := startInstance(b, cfg, fmt.Sprintf("r%d", i))
					natstest.Poll(b, benchDrainLimit, 5*time.Millisecond, "every partition taken", func() (bool, error) {
						return in.sum(b, "dedupe_partition_takeovers_total", nil) >= benchPartitions, nil
					})
					b.StopTimer()
					restored := in.sum(b, "dedupe_restore_records_total", nil) + in.sum(b, "dedupe_snapshot_restore_records_total", nil)
					if restored < float64(keysN) {
						b.Fatalf("restored %v records, want %d", restored, keysN)
					}
					if got := in.sum(b, "dedupe_restore_path_total", map[string]string{"path": path}); got < benchPartitions {
						b.Fatalf("%v partitions restored by path %s, want %d", got, path, benchPartitions)
					}
					in.stop(b)
				}
				b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "restore_s")
				b.ReportMetric(float64(keysN)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
				if path == "snapshot" {
					b.ReportMetric(writeS, "snapshot_write_s")
					b.ReportMetric(bytesPerKey, "snapshot_bytes/key")
				}
			})
		}
	}
}

// snapshotCostKeys is how many records the partitions hold in
// BenchmarkScaleOutSnapshotCost, what each snapshot writes.
const snapshotCostKeys = 200_000

// BenchmarkScaleOutSnapshotCost measures what writing snapshots costs a
// running owner: one instance whose 4 partitions hold 200k records judges
// a backlog of b.N events (10% repeats) with snapshots written back to
// back all the while (writing=true: the worst case, far more often than
// any snapshot_interval), or none (writing=false). events/s is from the
// moment every partition is taken until the backlog is judged.
func BenchmarkScaleOutSnapshotCost(b *testing.B) {
	for _, writing := range []bool{false, true} {
		b.Run(fmt.Sprintf("writing=%v", writing), func(b *testing.B) {
			srv := natstest.RunServer(b, "")
			_, js := natstest.Connect(b, srv.ClientURL())
			cfg := scaleOutBenchConfig(b, srv.ClientURL(), false)
			cfg.ScaleOut.SnapshotInterval = 0 // written by the benchmark
			cfg.Filter.ExpectedKeys = snapshotCostKeys + uint64(b.N)
			createStreams(b, js, cfg)
			publishRecords(b, js, cfg, snapshotCostKeys, make([]byte, benchPayload), time.Now())
			// One message per partition besides the backlog makes each taken.
			ks := benchKeys(b.N)
			for i := 0; len(ks) < b.N+benchPartitions; i++ {
				if k := fmt.Sprintf("wake-%d", i); partitionOf(k, benchPartitions) == len(ks)-b.N {
					ks = append(ks, k)
				}
			}
			publishOrders(b, js, ks, false)
			b.ResetTimer()
			in := startInstance(b, cfg, "a")
			deadline := time.Now().Add(benchDrainLimit)
			natstest.Poll(b, benchDrainLimit, time.Millisecond, "every partition taken", func() (bool, error) {
				return in.sum(b, "dedupe_partition_takeovers_total", nil) >= benchPartitions, nil
			})
			t0, judged0 := time.Now(), in.sum(b, "dedupe_messages_total", nil)
			ctx, stop := context.WithCancel(context.Background())
			writes := make(chan int, 1)
			go func() {
				n := 0
				for ctx.Err() == nil && writing {
					if _, err := in.st.WriteSnapshots(ctx); err != nil && ctx.Err() == nil {
						b.Errorf("snapshots: %v", err)
						break
					}
					n++
				}
				writes <- n
			}()
			natstest.Poll(b, time.Until(deadline), time.Millisecond, "the backlog judged", func() (bool, error) {
				return in.sum(b, "dedupe_messages_total", nil) >= float64(len(ks)), nil
			})
			took := time.Since(t0)
			b.StopTimer()
			stop()
			rounds := <-writes
			b.ReportMetric((float64(len(ks))-judged0)/took.Seconds(), "events/s")
			b.ReportMetric(float64(rounds), "snapshot_rounds")
			b.ReportMetric(in.sum(b, "dedupe_snapshot_writes_total", map[string]string{"result": "ok"}), "snapshots")
			in.stop(b)
		})
	}
}
