package stage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
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

// TestStreamsHoldAThousandPartitions creates the input stream of a group
// of 1,024 partitions as the stage does: it sets a consumer limit of its
// own, so a server's default limit does not bind it. nats-server 2.15
// gives a stream without one 1,000 consumers, which left a group of 1,024
// partitions with partitions no member could consume; here the server's
// default is lowered to 50 so that the test creates few consumers: the
// stage's stream takes 60, a stream without max_consumers refuses the
// 51st. check-config and run warn of an existing stream that allows fewer
// consumers than the stage needs, with the edit that fixes it, and not at
// the default 8 partitions.
func TestStreamsHoldAThousandPartitions(t *testing.T) {
	const serverDefault = 50
	srv := natstest.RunServerWith(t, func(o *server.Options) { o.JetStreamLimits.DefaultMaxConsumers = serverDefault })
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx := context.Background()
	cfg := config.Default()
	cfg.State.Partitions = 1024
	wanted, err := StreamsToCreate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	in := wanted[0].Config
	if _, err := js.CreateStream(ctx, in); err != nil {
		t.Fatal(err)
	}
	bare := jetstream.StreamConfig{Name: "BARE", Subjects: []string{"bare.>"}}
	if _, err := js.CreateStream(ctx, bare); err != nil {
		t.Fatal(err)
	}
	consumers := func(stream string, n int) error {
		for i := range n {
			if _, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: fmt.Sprintf("c%d", i), AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
				return fmt.Errorf("consumer %d of %d on %s: %w", i+1, n, stream, err)
			}
		}
		return nil
	}
	if err := consumers(in.Name, serverDefault+10); err != nil {
		t.Errorf("the input stream as the stage creates it for 1,024 partitions: %v", err)
	}
	if err := consumers(bare.Name, serverDefault+1); !errors.Is(err, jetstream.ErrMaximumConsumersLimit) {
		t.Errorf("a stream without max_consumers: %v; want the server's default limit of %d to refuse one more", err, serverDefault)
	}

	unset := in
	unset.MaxConsumers = 0 // as a stream made without one reads
	have := map[string]jetstream.StreamConfig{in.Name: unset}
	fs := streamWarnings(cfg, wanted[:1], have)
	if len(fs) != 1 || fs[0].Check != "max_consumers" || !strings.Contains(fs[0].Fix, fmt.Sprintf("--max-consumers %d", StreamMaxConsumers(1024))) {
		t.Errorf("an input stream without max_consumers, 1,024 partitions: %+v; want one max_consumers warning with its fix", fs)
	}
	cfg.State.Partitions = 8
	if wanted, err = StreamsToCreate(cfg); err != nil {
		t.Fatal(err)
	}
	if fs := streamWarnings(cfg, wanted[:1], have); len(fs) != 0 {
		t.Errorf("an input stream without max_consumers, 8 partitions: %+v; want no finding", fs)
	}
}
