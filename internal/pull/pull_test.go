package pull_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/pull"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// received is what a Run handed over, safe for the test to read while Run
// delivers.
type received struct {
	mu   sync.Mutex
	data []string
}

func (r *received) add(m jetstream.Msg) {
	_ = m.Ack()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.data = append(r.data, string(m.Data()))
}

// has reports whether every one of want was received, and says what was.
func (r *received) has(want ...string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range want {
		if !slices.Contains(r.data, w) {
			return false, fmt.Errorf("received %q, want %q among them", r.data, want)
		}
	}
	return true, nil
}

// setUp starts a server with stream IN (subject in.>) and the durable pull
// consumer C on it, and returns the consumer's config for re-creating it.
func setUp(t *testing.T) (jetstream.JetStream, jetstream.Consumer, jetstream.ConsumerConfig) {
	t.Helper()
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}}); err != nil {
		t.Fatal(err)
	}
	cc := jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second}
	cons, err := js.CreateConsumer(ctx, "IN", cc)
	if err != nil {
		t.Fatal(err)
	}
	return js, cons, cc
}

func publish(t *testing.T, js jetstream.JetStream, data string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, "in.x", []byte(data)); err != nil {
		t.Fatalf("publish %q: %v", data, err)
	}
}

// TestRunResubscribesAfterTheConsumerIsRecreated deletes the consumer
// under a running loop and creates it again: the loop re-subscribes and
// delivers what is published after, without a restart.
func TestRunResubscribesAfterTheConsumerIsRecreated(t *testing.T) {
	js, cons, cc := setUp(t)
	ctx, cancel := context.WithCancel(context.Background())
	var got received
	var logs syncBuffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		pull.Run(ctx, cons, pull.Options{MaxMessages: 16, AckWait: cc.AckWait, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, got.add)
	}()
	t.Cleanup(func() { cancel(); <-done })

	publish(t, js, "before")
	natstest.Poll(t, 10*time.Second, 20*time.Millisecond, "the first message", func() (bool, error) { return got.has("before") })

	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	if err := js.DeleteConsumer(dctx, "IN", "C"); err != nil {
		t.Fatal(err)
	}
	// Re-created from the stream's next message on: what is published
	// now is new to it.
	cc.DeliverPolicy = jetstream.DeliverNewPolicy
	if _, err := js.CreateConsumer(dctx, "IN", cc); err != nil {
		t.Fatal(err)
	}
	publish(t, js, "after")
	natstest.Poll(t, 30*time.Second, 20*time.Millisecond, "the message published after the consumer was re-created", func() (bool, error) {
		return got.has("before", "after")
	})
	if !strings.Contains(logs.String(), "pull subscription ended, re-subscribing") {
		t.Errorf("the loop did not say it re-subscribed; its log:\n%s", logs.String())
	}
}

// syncBuffer is a log's destination that the test reads while Run writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRunStopsOnCtx ends ctx under a running loop: Run returns, and
// delivers nothing after it returned.
func TestRunStopsOnCtx(t *testing.T) {
	js, cons, cc := setUp(t)
	ctx, cancel := context.WithCancel(context.Background())
	var got received
	done := make(chan struct{})
	go func() {
		defer close(done)
		pull.Run(ctx, cons, pull.Options{MaxMessages: 16, AckWait: cc.AckWait, Logger: slog.New(slog.DiscardHandler)}, got.add)
	}()
	publish(t, js, "one")
	natstest.Poll(t, 10*time.Second, 20*time.Millisecond, "the first message", func() (bool, error) { return got.has("one") })

	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its ctx ending")
	}
	publish(t, js, "late")
	// The late message stays with the consumer, unacked by anyone: Run
	// is gone.
	ictx, icancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer icancel()
	natstest.Poll(t, 10*time.Second, 20*time.Millisecond, "the late message pending on the consumer", func() (bool, error) {
		info, err := cons.Info(ictx)
		if err != nil {
			return false, err
		}
		if info.NumPending != 1 || info.NumAckPending != 0 {
			return false, fmt.Errorf("pending %d, ack pending %d; want 1 and 0", info.NumPending, info.NumAckPending)
		}
		return true, nil
	})
	if ok, _ := got.has("late"); ok {
		t.Fatal("Run delivered a message published after it returned")
	}
}

// TestExpiry checks the pull's bound: the ack wait, and never below
// MinExpiry.
func TestExpiry(t *testing.T) {
	for _, c := range []struct{ ackWait, want time.Duration }{
		{30 * time.Second, 30 * time.Second},
		{pull.MinExpiry, pull.MinExpiry},
		{500 * time.Millisecond, pull.MinExpiry},
		{0, pull.MinExpiry},
	} {
		if got := pull.Expiry(c.ackWait); got != c.want {
			t.Errorf("Expiry(%v) = %v, want %v", c.ackWait, got, c.want)
		}
	}
}
