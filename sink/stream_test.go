package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// newTotalsStream creates a stream capturing prefix.> with a one-minute
// duplicate window and returns its name.
func newTotalsStream(t testing.TB, js jetstream.JetStream, prefix string) jetstream.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := strings.ToUpper(strings.ReplaceAll(prefix, ".", "_"))
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{prefix + ".>"}, Duplicates: time.Minute, AllowAtomicPublish: true,
	})
	if err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	return st
}

// streamReader reads a totals stream incrementally and keeps the largest
// value per ID, as a consumer of the stream sink should.
type streamReader struct {
	mu     sync.Mutex
	st     jetstream.Stream
	next   uint64
	latest map[string]int64
}

// snapshot reads the messages stored since the last call and returns the
// largest value per ID seen so far.
func (r *streamReader) snapshot(ctx context.Context) (map[string]int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	info, err := r.st.Info(ctx)
	if err != nil {
		return nil, err
	}
	for ; r.next <= info.State.LastSeq; r.next++ {
		m, err := r.st.GetMsg(ctx, r.next)
		if err != nil {
			return nil, fmt.Errorf("get seq %d: %w", r.next, err)
		}
		var tt Total
		if err := json.Unmarshal(m.Data, &tt); err != nil {
			return nil, fmt.Errorf("seq %d: %w", r.next, err)
		}
		if cur, ok := r.latest[tt.ID()]; !ok || tt.Value > cur {
			r.latest[tt.ID()] = tt.Value
		}
	}
	return maps.Clone(r.latest), nil
}

// streamEnv returns a conformance env over a fresh stream on srv; every
// sink gets its own connection and the options o.
func streamEnv(t *testing.T, srv *server.Server, o StreamOptions) env {
	_, js := natstest.Connect(t, srv.ClientURL())
	prefix := fmt.Sprintf("totals.t%d", bucketSeq.Add(1))
	r := &streamReader{st: newTotalsStream(t, js, prefix), next: 1, latest: map[string]int64{}}
	return env{
		newSink: func(t *testing.T) Sink {
			_, js := natstest.Connect(t, srv.ClientURL())
			return NewStreamWith(js, prefix, o)
		},
		snapshot: r.snapshot,
		log:      true,
	}
}

func TestStream(t *testing.T) {
	srv := natstest.RunServer(t, "")
	runConformance(t, "stream", func(t *testing.T) env { return streamEnv(t, srv, StreamOptions{}) })

	t.Run("message form", func(t *testing.T) {
		_, js := natstest.Connect(t, srv.ClientURL())
		newTotalsStream(t, js, "form")
		s := NewStream(js, "form")
		totals := []Total{
			tot("campaign-42", bucket0, 1017),
			{Group: "tenant.a/x", Bucket: bucket1.In(time.FixedZone("X", 3600)), Value: 3},
		}
		checkedWrite(t, s, totals)
		checkedWrite(t, s, []Total{tot("campaign-42", bucket0, 1000)}) // smaller: logged, readers keep 1017
		msgs := natstest.ReadAll(t, js, "FORM")
		type want struct{ subject, id, group, bucket, total, data string }
		wants := []want{
			{"form.campaign-42", "campaign-42.1767225600:1017", "campaign-42", "2026-01-01T00:00:00Z", "1017",
				`{"group":"campaign-42","bucket":"2026-01-01T00:00:00Z","value":1017}`},
			{"form.=dGVuYW50LmEveA", "=dGVuYW50LmEveA.1767229200:3", "tenant.a/x", "2026-01-01T01:00:00Z", "3",
				`{"group":"tenant.a/x","bucket":"2026-01-01T01:00:00Z","value":3}`},
			{"form.campaign-42", "campaign-42.1767225600:1000", "campaign-42", "2026-01-01T00:00:00Z", "1000",
				`{"group":"campaign-42","bucket":"2026-01-01T00:00:00Z","value":1000}`},
		}
		if len(msgs) != len(wants) {
			t.Fatalf("stream holds %d messages, want %d", len(msgs), len(wants))
		}
		var read []Total
		for i, w := range wants {
			m := msgs[i]
			got := want{m.Subject, m.Header.Get(jetstream.MsgIDHeader), m.Header.Get(HeaderGroup),
				m.Header.Get(HeaderBucket), m.Header.Get(HeaderTotal), string(m.Data)}
			if got != w {
				t.Errorf("message %d = %+v, want %+v", i, got, w)
			}
			var tt Total
			if err := json.Unmarshal(m.Data, &tt); err != nil {
				t.Fatalf("message %d payload: %v", i, err)
			}
			read = append(read, tt)
		}
		latest := Latest(read)
		if got := latest[totals[0].ID()].Value; got != 1017 {
			t.Fatalf("Latest over the stream: %s = %d, want 1017", totals[0].ID(), got)
		}
	})

	t.Run("bad prefix", func(t *testing.T) {
		_, js := natstest.Connect(t, srv.ClientURL())
		_, err := NewStream(js, "totals.>").Write(context.Background(), []Total{tot("g", bucket0, 1)})
		if !errors.Is(err, ErrBadSubject) {
			t.Fatalf("Write with prefix \"totals.>\": error = %v, want ErrBadSubject", err)
		}
	})

	t.Run("no stream", func(t *testing.T) {
		_, js := natstest.Connect(t, srv.ClientURL())
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := NewStream(js, "nostream").Write(ctx, []Total{tot("g", bucket0, 1)})
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Write to a subject no stream captures = %+v, %v; want a publish error", res, err)
		}
		if res.Applied != 0 {
			t.Fatalf("Write to a subject no stream captures = %+v, want nothing applied", res)
		}
	})
}

// TestStreamAtomic runs the conformance tests with atomic batches (small
// ones, so that a Write spans several), and checks that a batch holding a
// total the stream already has is published one by one: the repeat is
// Stale and the rest are stored, each once.
func TestStreamAtomic(t *testing.T) {
	srv := natstest.RunServer(t, "")
	runConformance(t, "stream", func(t *testing.T) env {
		return streamEnv(t, srv, StreamOptions{Atomic: true, BatchMax: 7})
	})

	t.Run("batch with a stored total", func(t *testing.T) {
		_, js := natstest.Connect(t, srv.ClientURL())
		newTotalsStream(t, js, "atomicrepeat")
		s := NewStreamWith(js, "atomicrepeat", StreamOptions{Atomic: true})
		first := []Total{tot("a", bucket0, 1), tot("b", bucket0, 2)}
		if res := checkedWrite(t, s, first); res != (Result{Applied: 2}) {
			t.Fatalf("first Write = %+v, want 2 applied", res)
		}
		// "a" with the same value is already in the duplicate window: the
		// server refuses the atomic batch as a whole.
		second := []Total{tot("a", bucket0, 1), tot("b", bucket0, 3), tot("c", bucket0, 4)}
		if res := checkedWrite(t, s, second); res != (Result{Applied: 2, Stale: 1}) {
			t.Fatalf("Write holding a stored total = %+v, want 2 applied and 1 stale", res)
		}
		ids := map[string]int{}
		batched := 0
		for _, m := range natstest.ReadAll(t, js, "ATOMICREPEAT") {
			ids[m.Header.Get(jetstream.MsgIDHeader)]++
			if m.Header.Get(jetstreamext.BatchIDHeader) != "" {
				batched++
			}
		}
		// The server keeps the batch headers: the first Write went as one
		// atomic batch, the second one by one.
		if batched != 2 {
			t.Errorf("%d stored totals came in an atomic batch, want the first Write's 2", batched)
		}
		want := map[string]int{
			tot("a", bucket0, 1).ID() + ":1": 1, tot("b", bucket0, 2).ID() + ":2": 1,
			tot("b", bucket0, 3).ID() + ":3": 1, tot("c", bucket0, 4).ID() + ":4": 1,
		}
		if !maps.Equal(ids, want) {
			t.Fatalf("stream holds ids %v, want each of %v once", ids, want)
		}
	})
}

func TestCheckSubjectPrefix(t *testing.T) {
	tests := []struct {
		prefix string
		ok     bool
	}{
		{"totals", true},
		{"dedupe.totals.v1", true},
		{"a-b_c=d", true},
		{"", false},
		{".totals", false},
		{"totals.", false},
		{"a..b", false},
		{"totals.*", false},
		{"totals.>", false},
		{"to tals", false},
		{"tot\tals", false},
	}
	for _, tc := range tests {
		t.Run(tc.prefix, func(t *testing.T) {
			err := CheckSubjectPrefix(tc.prefix)
			if tc.ok && err != nil {
				t.Fatalf("CheckSubjectPrefix(%q) = %v, want nil", tc.prefix, err)
			}
			if !tc.ok && !errors.Is(err, ErrBadSubject) {
				t.Fatalf("CheckSubjectPrefix(%q) = %v, want ErrBadSubject", tc.prefix, err)
			}
		})
	}
}
