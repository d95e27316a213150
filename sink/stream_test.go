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

	"github.com/dedupe-stage/dedupe-stage/internal/natstest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// newTotalsStream creates a stream capturing prefix.> with a one-minute
// duplicate window and returns its name.
func newTotalsStream(t testing.TB, js jetstream.JetStream, prefix string) jetstream.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := strings.ToUpper(strings.ReplaceAll(prefix, ".", "_"))
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{prefix + ".>"}, Duplicates: time.Minute,
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
// sink gets its own connection.
func streamEnv(t *testing.T, srv *server.Server) env {
	_, js := natstest.Connect(t, srv.ClientURL())
	prefix := fmt.Sprintf("totals.t%d", bucketSeq.Add(1))
	r := &streamReader{st: newTotalsStream(t, js, prefix), next: 1, latest: map[string]int64{}}
	return env{
		newSink: func(t *testing.T) Sink {
			_, js := natstest.Connect(t, srv.ClientURL())
			return NewStream(js, prefix)
		},
		snapshot: r.snapshot,
		log:      true,
	}
}

func TestStream(t *testing.T) {
	srv := natstest.RunServer(t, "")
	runConformance(t, "stream", func(t *testing.T) env { return streamEnv(t, srv) })

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
