package stage_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/bench/loop"
	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// The pipeline benchmarks drain a backlog of b.N events (one op = one
// event) pre-published to a real in-process JetStream server: 10% of the
// events repeat an earlier key, each with the same 256-byte payload. The
// timer covers only the drain, from Run to the consumer having
// acknowledged everything. Size them with -benchtime=20000x or similar;
// go test's default of one second gives a few tens of thousands of events.

const (
	benchRepeatRatio = 0.1
	benchPayload     = 256
	benchDrainLimit  = 5 * time.Minute
)

// benchPipe is one benchmark's server, connections and configuration.
type benchPipe struct {
	js     jetstream.JetStream // the harness's: publishing, polling
	runNC  *nats.Conn          // the system under test's
	cfg    config.Config
	unique int
}

// newBenchPipe starts a server, creates the input stream and publishes n
// events to it.
func newBenchPipe(b *testing.B, n int, filter bool) *benchPipe {
	b.Helper()
	srv := natstest.RunServer(b, "")
	_, js := natstest.Connect(b, srv.ClientURL())
	runNC, _ := natstest.Connect(b, srv.ClientURL())
	cfg := config.Default()
	yes := true
	cfg.NATS.URL = srv.ClientURL()
	cfg.NATS.CreateStreams = &yes
	cfg.State.DataDir = b.TempDir()
	cfg.Filter.Enabled = filter
	cfg.HTTP.Addr = ""
	// Not Nats-Msg-Id: the input stream would drop the repeats itself.
	cfg.Key = keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceHeader, Header: "Event-Id"}, MaxLength: 256}
	p := &benchPipe{js: js, runNC: runNC, cfg: cfg}

	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Input.Stream, Subjects: cfg.Input.Subjects, Storage: jetstream.FileStorage}); err != nil {
		b.Fatalf("create input stream: %v", err)
	}
	p.unique = max(1, int(float64(n)*(1-benchRepeatRatio)))
	pjs, err := jetstream.New(js.Conn(), jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		k := i
		if i >= p.unique {
			k = (i * 7919) % p.unique // a repeat of an earlier key
		}
		key := fmt.Sprintf("evt-%028x", uint64(k)*0x9e3779b97f4a7c15)
		data := make([]byte, benchPayload)
		copy(data, key)
		m := &nats.Msg{Subject: "events.orders", Header: nats.Header{"Event-Id": []string{key}}, Data: data}
		if _, err := pjs.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
			b.Fatalf("publish %d: %v", i, err)
		}
	}
	select {
	case <-pjs.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		b.Fatal("input publishes not acknowledged in 2m")
	}
	return p
}

// drain runs run until the consumer has acknowledged all n events and
// stops it; the benchmark timer runs only meanwhile.
func (p *benchPipe) drain(b *testing.B, n int, run func(context.Context) error) {
	b.Helper()
	ctx := context.Background()
	cons, err := p.js.Consumer(ctx, p.cfg.Input.Stream, p.cfg.Input.Consumer)
	if err != nil {
		b.Fatalf("consumer: %v", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ResetTimer()
	go func() { done <- run(runCtx) }()
	natstest.Poll(b, benchDrainLimit, time.Millisecond, fmt.Sprintf("%d events to drain", n), func() (bool, error) {
		ci, err := cons.Info(ctx)
		if err != nil {
			return false, err
		}
		return ci.AckFloor.Stream >= uint64(n) && ci.NumAckPending == 0, fmt.Errorf("last: %+v", ci)
	})
	b.StopTimer()
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "events/s")
	stop()
	select {
	case err := <-done:
		if err != nil {
			b.Fatalf("run: %v", err)
		}
	case <-time.After(time.Minute):
		b.Fatal("run did not stop in 1m")
	}
}

// outputCount returns the number of messages in the output stream.
func (p *benchPipe) outputCount(b *testing.B) int {
	b.Helper()
	st, err := p.js.Stream(context.Background(), p.cfg.Output.Stream)
	if err != nil {
		b.Fatalf("output stream: %v", err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		b.Fatalf("output stream info: %v", err)
	}
	return int(info.State.Msgs)
}

// BenchmarkPipeline drains b.N events through a running stage, with the
// Bloom pre-check and without it, and checks that each key was forwarded
// once.
func BenchmarkPipeline(b *testing.B) {
	for _, filter := range []bool{true, false} {
		name := "filter=on"
		if !filter {
			name = "filter=off"
		}
		b.Run(name, func(b *testing.B) {
			p := newBenchPipe(b, b.N, filter)
			st, err := stage.New(context.Background(), stage.Options{Config: p.cfg, Conn: p.runNC,
				Registry: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatalf("stage.New: %v", err)
			}
			defer st.Close()
			p.drain(b, b.N, st.Run)
			if got := p.outputCount(b); got != p.unique {
				b.Fatalf("output holds %d messages, want %d (one per key)", got, p.unique)
			}
			s := st.Store().Stats()
			b.ReportMetric(float64(s.StoreReads+s.ClaimStoreReads)/float64(b.N), "store-reads/event")
			if filter && s.Lookups > 0 {
				b.ReportMetric(float64(s.FilterNegatives)/float64(s.Lookups), "skip-ratio")
			}
		})
	}
}

// BenchmarkPublishLoop drains b.N events through the plain consume ->
// publish -> ack loop with the stage's batching and routing by key
// (bench/loop), without dedupe: the ceiling BenchmarkPipeline compares
// with. It forwards every event, repeats included.
func BenchmarkPublishLoop(b *testing.B) {
	p := newBenchPipe(b, b.N, false)
	ctx := context.Background()
	cfg := p.cfg
	if _, err := p.js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Output.Stream, Subjects: []string{cfg.Output.SubjectPrefix + ".>"}, Storage: jetstream.FileStorage}); err != nil {
		b.Fatalf("create output stream: %v", err)
	}
	if _, err := p.js.CreateOrUpdateConsumer(ctx, cfg.Input.Stream, jetstream.ConsumerConfig{
		Durable: cfg.Input.Consumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: cfg.Input.AckWait.D(),
		MaxAckPending: cfg.Input.MaxAckPending, MaxDeliver: cfg.Input.MaxDeliver, DeliverPolicy: jetstream.DeliverAllPolicy,
	}); err != nil {
		b.Fatalf("create consumer: %v", err)
	}
	rjs, err := jetstream.New(p.runNC, jetstream.WithPublishAsyncMaxPending(cfg.Pipeline.MaxPublishInFlight))
	if err != nil {
		b.Fatal(err)
	}
	cons, err := rjs.Consumer(ctx, cfg.Input.Stream, cfg.Input.Consumer)
	if err != nil {
		b.Fatal(err)
	}
	prefix := cfg.Output.SubjectPrefix + "."
	opts := loop.DefaultOptions(cons, rjs, func(in string) string { return prefix + in })
	opts.Workers, opts.BatchSize, opts.Linger = cfg.State.Partitions, cfg.Pipeline.BatchSize, cfg.Pipeline.BatchLinger.D()
	kf, err := keys.NewKeyFunc(cfg.Key)
	if err != nil {
		b.Fatal(err)
	}
	opts.Key = func(m jetstream.Msg) (string, error) {
		k, err := kf.Key(m.Subject(), m.Headers(), m.Data())
		return string(k), err
	}
	var stats loop.Stats
	p.drain(b, b.N, func(ctx context.Context) error { return loop.Run(ctx, opts, &stats) })
	if got := p.outputCount(b); got != b.N {
		b.Fatalf("output holds %d messages, want %d (every event)", got, b.N)
	}
}
