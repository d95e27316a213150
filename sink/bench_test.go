package sink

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// benchBatch is the number of totals per Write in the benchmarks.
const benchBatch = 100

// benchSinks returns the sinks to benchmark, each on a fresh store. The
// postgres sink is left out when DEDUPE_TEST_POSTGRES_DSN is unset.
func benchSinks(b *testing.B) map[string]func(b *testing.B) Sink {
	srv := natstest.RunServer(b, "")
	// A server that fsyncs every write, as the embedded default does.
	syncSrv := natstest.RunServerWith(b, func(o *server.Options) { o.SyncAlways = true })
	stream := func(srv *server.Server, o StreamOptions) func(b *testing.B) Sink {
		return func(b *testing.B) Sink {
			_, js := natstest.Connect(b, srv.ClientURL())
			prefix := fmt.Sprintf("bench%d", bucketSeq.Add(1))
			newTotalsStream(b, js, prefix)
			return NewStreamWith(js, prefix, o)
		}
	}
	return map[string]func(b *testing.B) Sink{
		"kv":                 func(b *testing.B) Sink { return NewKV(newKVBucket(b, srv)) },
		"stream":             stream(srv, StreamOptions{}),
		"stream-atomic":      stream(srv, StreamOptions{Atomic: true}),
		"stream-sync":        stream(syncSrv, StreamOptions{}),
		"stream-atomic-sync": stream(syncSrv, StreamOptions{Atomic: true}),
		"postgres": func(b *testing.B) Sink {
			pool := testPool(b)
			table := newTable(b, pool)
			if err := CreateSchema(context.Background(), pool, table); err != nil {
				b.Fatal(err)
			}
			s, err := NewPostgres(context.Background(), pool, table)
			if err != nil {
				b.Fatal(err)
			}
			return s
		},
	}
}

// BenchmarkWrite measures Write with batches of benchBatch totals over
// benchBatch groups: "raise" gives every total a larger value than the last
// Write (all Applied), "stale" repeats one batch (all Stale after the first).
// The stream sink runs one message at a time and as atomic batches, on a
// server without fsync and on one that fsyncs every write ("-sync").
func BenchmarkWrite(b *testing.B) {
	ctx := context.Background()
	sinks := benchSinks(b)
	for _, name := range []string{"kv", "stream", "stream-atomic", "stream-sync", "stream-atomic-sync", "postgres"} {
		newSink := sinks[name]
		for _, mode := range []string{"raise", "stale"} {
			b.Run(name+"/"+mode, func(b *testing.B) {
				s := newSink(b)
				batch := make([]Total, benchBatch)
				for i := range batch {
					batch[i] = tot(fmt.Sprintf("group-%d", i), bucket0, 1)
				}
				b.ResetTimer()
				start := time.Now()
				for n := range b.N {
					if mode == "raise" {
						for i := range batch {
							batch[i].Value = int64(n + 1)
						}
					}
					if _, err := s.Write(ctx, batch); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*benchBatch)/time.Since(start).Seconds(), "totals/s")
			})
		}
	}
}
