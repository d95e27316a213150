package forward_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// BenchmarkBatchLatency publishes one batch at a time, each after the
// previous one's acks, to a server that fsyncs every write: what a batch
// costs with nothing else in flight, as atomic batches or as async
// publishes, on a file and on a memory stream. An atomic batch on an R1 file
// stream is staged by the server in a file store of its own before it is
// applied; on a memory stream (or an R3 one) it is staged in memory. ns/op
// is one batch.
func BenchmarkBatchLatency(b *testing.B) {
	s := natstest.RunServerWith(b, func(o *server.Options) { o.SyncAlways = true })
	_, js := natstest.Connect(b, s.ClientURL())
	ctx := context.Background()
	seq := 0 // ids unique over every run of the sub-benchmarks
	for _, st := range []jetstream.StorageType{jetstream.FileStorage, jetstream.MemoryStorage} {
		name := map[jetstream.StorageType]string{jetstream.FileStorage: "file", jetstream.MemoryStorage: "memory"}[st]
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: st, AllowAtomicPublish: true}); err != nil {
			b.Fatal(err)
		}
		for _, atomic := range []bool{true, false} {
			for _, n := range []int{1, 10, 100} {
				mode := map[bool]string{true: "atomic", false: "async"}[atomic]
				b.Run(fmt.Sprintf("%s/%s/n=%d", name, mode, n), func(b *testing.B) {
					msgs := make([]*nats.Msg, n)
					res := make([]forward.Result, n)
					data := make([]byte, 256)
					for b.Loop() {
						for i := range msgs {
							seq++
							msgs[i] = &nats.Msg{Subject: name + ".x", Data: data,
								Header: nats.Header{jetstream.MsgIDHeader: {fmt.Sprintf("%s-%d-%d", mode, n, seq)}}}
						}
						if err := forward.Batch(ctx, js, msgs, res, forward.Options{Atomic: atomic}); err != nil {
							b.Fatal(err)
						}
						for i, r := range res {
							if !r.Done || r.Err != nil || r.Duplicate {
								b.Fatalf("message %d: %+v, want stored", i, r)
							}
						}
					}
				})
			}
		}
	}
}
