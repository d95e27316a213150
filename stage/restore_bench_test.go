package stage_test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
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

var restoreEmptiedKeys = flag.Int("restore-keys", 100_000, "BenchmarkRestoreEmptied: forwards in the output stream")

// BenchmarkRestoreEmptied measures the restore of one instance whose data
// dir is empty (new, wiped or replaced) from an output stream that holds
// -restore-keys forwards, each with the record it carries: the time
// stage.New takes (which returns once every partition is restored), the
// records restored per second, and the process's peak RSS while it runs
// beside its baseline (the in-process nats-server's included). One op is
// one restore: run it with -benchtime=1x.
//
//	go test -run '^$' -bench RestoreEmptied -benchtime=1x ./stage/ -args -restore-keys 1000000
func BenchmarkRestoreEmptied(b *testing.B) {
	n := *restoreEmptiedKeys
	srv := natstest.RunServer(b, "")
	_, js := natstest.Connect(b, srv.ClientURL())
	runNC, _ := natstest.Connect(b, srv.ClientURL())
	cfg := config.Default()
	yes := true
	cfg.NATS.URL = srv.ClientURL()
	cfg.NATS.CreateStreams = &yes
	cfg.HTTP.Addr = ""
	cfg.Filter.ExpectedKeys = uint64(max(n, 1000))
	cfg.Key = keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceHeader, Header: "Event-Id"}, MaxLength: 256}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.State.DataDir = b.TempDir()
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	// Create the streams, then fill the output as n forwards leave it.
	st, err := stage.New(context.Background(), stage.Options{Config: cfg, Conn: runNC, Registry: prometheus.NewRegistry(), Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
	publishForwards(b, js, cfg, n)
	for b.Loop() {
		cfg.State.DataDir = b.TempDir()
		base := rssKiB()
		var peak atomic.Int64
		peak.Store(base)
		done := make(chan struct{})
		go func() {
			t := time.NewTicker(20 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
					if r := rssKiB(); r > peak.Load() {
						peak.Store(r)
					}
				}
			}
		}()
		reg := prometheus.NewRegistry()
		start := time.Now()
		st, err := stage.New(context.Background(), stage.Options{Config: cfg, Conn: runNC, Registry: reg, Logger: quiet})
		took := time.Since(start)
		close(done)
		if err != nil {
			b.Fatal(err)
		}
		restored := metrictest.Sum(b, reg, "dedupe_start_restored_records_total", nil)
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
		if restored != float64(n) {
			b.Fatalf("restored %v keys, want %d", restored, n)
		}
		b.ReportMetric(took.Seconds(), "s/restore")
		b.ReportMetric(float64(n)/took.Seconds(), "records/s")
		b.ReportMetric(float64(peak.Load())/1024, "peak-RSS-MiB")
		b.ReportMetric(float64(peak.Load()-base)/1024, "RSS-growth-MiB")
	}
}

// publishForwards publishes n forwards to cfg's output stream, as the
// stage publishes them: the key as Nats-Msg-Id, the record's headers.
func publishForwards(b testing.TB, js jetstream.JetStream, cfg config.Config, n int) {
	b.Helper()
	ctx := context.Background()
	// Under the jetstream context's default limit of 4,000 pending
	// asynchronous publishes: at the limit, PublishMsgAsync waits 200 ms
	// and then fails ("stalled with too many outstanding async published
	// messages"), as it did on a busy machine.
	const inFlight = 1024
	first := time.Now().Add(-time.Minute)
	var futures []jetstream.PubAckFuture
	for i := range n {
		k := fmt.Sprintf("key-%09d", i)
		m := &nats.Msg{Subject: cfg.Output.Subject("events.orders"), Header: nats.Header{}, Data: []byte(k)}
		m.Header.Set(jetstream.MsgIDHeader, k)
		m.Header.Set("Event-Id", k)
		changelog.Annotate(m.Header, first.Add(time.Duration(i)*time.Microsecond), changelog.Fingerprint(m.Data))
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			b.Fatal(err)
		}
		futures = append(futures, f)
		if len(futures) == inFlight || i == n-1 {
			for _, f := range futures {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					b.Fatal(err)
				case <-ctx.Done():
					b.Fatal(ctx.Err())
				}
			}
			futures = futures[:0]
		}
	}
}

// rssKiB is the process's resident set size in KiB (/proc/self/status),
// 0 where there is none.
func rssKiB() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

// TestReadyzSaysHowFarTheRestoreIs: while an emptied instance restores
// its partitions from the output, /readyz answers 503 saying it restores,
// with the records each partition has read back so far; then 200.
func TestReadyzSaysHowFarTheRestoreIs(t *testing.T) {
	e := newEnv(t)
	e.cfg.Key = keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceHeader, Header: "Event-Id"}, MaxLength: 256}
	r := e.start() // creates the streams
	r.stop(t)
	const n = 40_000
	publishForwards(t, e.js, e.cfg, n)
	e.cfg.State.DataDir = t.TempDir()

	h := &stage.Health{}
	srv := httptest.NewServer(stage.NewHealthHandler(prometheus.NewRegistry(), h))
	defer srv.Close()
	type built struct {
		st  *stage.Stage
		err error
	}
	done := make(chan built, 1)
	go func() {
		st, err := stage.New(context.Background(), stage.Options{Config: e.cfg, Conn: e.nc, Registry: prometheus.NewRegistry(), Health: h,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		done <- built{st, err}
	}()
	var seen string
	var b built
	for b.st == nil && b.err == nil {
		select {
		case b = <-done:
		case <-time.After(5 * time.Millisecond):
			resp, err := http.Get(srv.URL + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(body), "records read back") && seen == "" {
				seen = string(body)
			}
		}
	}
	if b.err != nil {
		t.Fatal(b.err)
	}
	defer b.st.Close()
	if !strings.Contains(seen, "not ready: restoring from the output stream") {
		t.Errorf("/readyz never said how far the restore of %d records was; it said %q", n, seen)
	}
	t.Logf("/readyz during the restore: %q", seen)
}
