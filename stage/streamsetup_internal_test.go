package stage

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/streams"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// lostReply is a JetStream whose first stream lookup gets no answer, as
// when a cluster's meta leader steps down before it replies.
type lostReply struct {
	jetstream.JetStream
	calls    atomic.Int32
	deadline time.Duration // of the first lookup, from its start
}

func (l *lostReply) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if l.calls.Add(1) == 1 {
		if d, ok := ctx.Deadline(); ok {
			l.deadline = time.Until(d)
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return l.JetStream.Stream(ctx, name)
}

// TestStreamSetUpOutlivesALostReply: when the first stream lookup gets no
// answer, it waits at most streams.RequestTimeout, is asked again, and the
// set-up creates every stream within its minute.
func TestStreamSetUpOutlivesALostReply(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	cfg := config.Default()
	lr := &lostReply{JetStream: js}
	start := time.Now()
	if err := ensureStreams(context.Background(), lr, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatalf("stream set-up after one lost reply: %v", err)
	}
	if lr.deadline <= 0 || lr.deadline > streams.RequestTimeout {
		t.Errorf("the lost lookup could wait %v, want at most %v of the %v set-up", lr.deadline, streams.RequestTimeout, streams.SetUpTimeout)
	}
	if took := time.Since(start); took >= streams.SetUpTimeout {
		t.Errorf("set-up took %v, the whole of its %v", took, streams.SetUpTimeout)
	}
	for _, name := range []string{cfg.Input.Stream, cfg.Output.Stream, cfg.DeadLetter.Stream} {
		if _, err := js.Stream(context.Background(), name); err != nil {
			t.Errorf("stream %s after set-up: %v", name, err)
		}
	}
}
