package route

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/keys"
)

// The per-copy work of scale-out's route step and of the member that reads
// the copy, without a server: what one routed input costs an instance's
// CPU besides the publishes and acks. Run:
//
//	go test -run '^$' -bench 'BenchmarkCopy' -benchmem ./internal/scaleout/route/

// benchMsg is an input as the route consumer delivers it; the methods the
// benchmarks do not call are left to the embedded nil interface.
type benchMsg struct {
	jetstream.Msg
	subject string
	header  nats.Header
	data    []byte
	md      *jetstream.MsgMetadata
}

func (m *benchMsg) Subject() string                           { return m.subject }
func (m *benchMsg) Headers() nats.Header                      { return m.header }
func (m *benchMsg) Data() []byte                              { return m.data }
func (m *benchMsg) Metadata() (*jetstream.MsgMetadata, error) { return m.md, nil }
func (m *benchMsg) Ack() error                                { return nil }

// benchBatch is a route batch of n inputs with a header key, as the bench
// workload publishes them: an Event-Id, a 128-byte payload.
func benchBatch(n int) []jetstream.Msg {
	out := make([]jetstream.Msg, n)
	now := time.Now()
	for i := range out {
		out[i] = &benchMsg{
			subject: "in.bench.orders",
			header:  nats.Header{"Event-Id": {fmt.Sprintf("order-%08d", i)}},
			data:    make([]byte, 128),
			md:      &jetstream.MsgMetadata{Stream: "EVENTS", Sequence: jetstream.SequencePair{Stream: uint64(1_000_000 + i)}, Timestamp: now},
		}
	}
	return out
}

// benchRouter is a router of 12 partitions bundling up to bundleMax.
func benchRouter(b *testing.B, bundleMax int) *router {
	kf, err := keys.NewKeyFunc(keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceHeader, Header: "Event-Id"}, MaxLength: 256})
	if err != nil {
		b.Fatal(err)
	}
	o := Options{InputStream: "EVENTS", RoutedSubject: "dedupe.routed", Partitions: 12, Key: kf, BundleMax: bundleMax}.withDefaults()
	return &router{o: o, metrics: NewMetrics(prometheus.NewRegistry())}
}

// routeBatch makes what process would publish for batch: every copy, and
// the bundles (or copies alone) of group.
func (r *router) routeBatch(b *testing.B, batch []jetstream.Msg) {
	r.out = r.out[:0]
	for i, msg := range batch {
		c, dl := r.routed(msg)
		if dl != nil {
			b.Fatalf("dead letter: %s", dl.Detail)
		}
		c.i = i
		r.out = append(r.out, c)
	}
	r.group(batch, 1<<20)
}

// BenchmarkCopyRoute is the route step's work per routed input: the copy,
// and its share of a bundle (or the copy alone).
func BenchmarkCopyRoute(b *testing.B) {
	for _, bundleMax := range []int{0, 16} {
		b.Run(fmt.Sprintf("bundle_max=%d", bundleMax), func(b *testing.B) {
			r, batch := benchRouter(b, bundleMax), benchBatch(192)
			b.ReportAllocs()
			for b.Loop() {
				r.routeBatch(b, batch)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/copy")
		})
	}
}

// BenchmarkCopyRead is a member's work per routed input before it judges
// it: the bundle read into its parts (or the copy alone), each part's
// origin read, and its ack.
func BenchmarkCopyRead(b *testing.B) {
	for _, bundleMax := range []int{0, 16} {
		b.Run(fmt.Sprintf("bundle_max=%d", bundleMax), func(b *testing.B) {
			r, batch := benchRouter(b, bundleMax), benchBatch(192)
			r.routeBatch(b, batch)
			delivered := make([]jetstream.Msg, len(r.pub))
			for k, m := range r.pub {
				h := nats.Header{"Nats-Pin-Id": {"pin-of-the-member"}}
				for k, v := range m.Header {
					h[k] = v
				}
				delivered[k] = &benchMsg{subject: m.Subject, header: h, data: m.Data,
					md: &jetstream.MsgMetadata{Stream: "ROUTED", Sequence: jetstream.SequencePair{Stream: uint64(k + 1)}}}
			}
			b.ReportAllocs()
			for b.Loop() {
				for _, m := range delivered {
					parts := []jetstream.Msg{m}
					if IsBundle(m.Headers()) {
						var err error
						if parts, err = Unbundle(m); err != nil {
							b.Fatal(err)
						}
					}
					for _, p := range parts {
						if _, err := OriginOfMsg(r.o.RoutedSubject, p); err != nil {
							b.Fatal(err)
						}
						_ = p.Ack()
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/copy")
		})
	}
}
