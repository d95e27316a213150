package loop_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/dedupe-stage/dedupe-stage/bench/loop"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// setup starts a server with an input stream holding n messages (message
// i carries key i%keys in header Key), an output stream with duplicate
// window dup, and a durable consumer on the input. It returns the
// harness's JetStream and the loop's options bound to their own
// connection.
func setup(t *testing.T, n, keys int, dup time.Duration) (jetstream.JetStream, loop.Options) {
	t.Helper()
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	nc, _ := natstest.Connect(t, srv.ClientURL())
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, Duplicates: dup}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		m := &nats.Msg{Subject: "in.a", Header: nats.Header{"Key": []string{fmt.Sprint("k", i%keys)}, "Nats-Expected-Stream": []string{"IN"}}, Data: []byte{byte(i)}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "IN", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	rjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := rjs.Consumer(ctx, "IN", "c")
	if err != nil {
		t.Fatal(err)
	}
	return js, loop.DefaultOptions(cons, rjs, func(s string) string { return "out." + s })
}

// allow changes the output stream's configuration with edit, and returns
// the stream.
func allow(t *testing.T, js jetstream.JetStream, edit func(*jetstream.StreamConfig)) jetstream.Stream {
	t.Helper()
	st, err := js.Stream(context.Background(), "OUT")
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	edit(&cfg)
	if _, err := js.UpdateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	return st
}

// drain runs the loop until the consumer has acked n messages, stops it
// and returns the output stream's messages.
func drain(t *testing.T, js jetstream.JetStream, opts loop.Options, n int, stats *loop.Stats) []natstest.Message {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- loop.Run(ctx, opts, stats) }()
	natstest.WaitFor(t, 30*time.Second, "the loop to ack everything", func() bool {
		c, err := js.Consumer(context.Background(), "IN", "c")
		if err != nil {
			return false
		}
		ci, err := c.Info(context.Background())
		return err == nil && ci.AckFloor.Stream >= uint64(n) && ci.NumAckPending == 0
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	return natstest.ReadAll(t, js, "OUT")
}

// TestForwardsEveryMessage forwards one message at a time, and with
// atomic batches of at most 64 into an output stream that allows them:
// every message once, on the output subject, with the input's headers but
// Nats-Expected-* and no id, and no batch refused.
func TestForwardsEveryMessage(t *testing.T) {
	const n = 500
	for _, atomic := range []bool{false, true} {
		t.Run(fmt.Sprint("atomic=", atomic), func(t *testing.T) {
			js, opts := setup(t, n, 50, 0)
			if atomic {
				allow(t, js, func(c *jetstream.StreamConfig) { c.AllowAtomicPublish = true })
				opts.Atomic, opts.BatchMax = true, 64
			}
			var stats loop.Stats
			out := drain(t, js, opts, n, &stats)
			if len(out) != n || stats.Forwarded.Load() != n || stats.BatchesRefused.Load() != 0 {
				t.Fatalf("output %d, forwarded %d, batches refused %d; want %d, %d, 0", len(out), stats.Forwarded.Load(), stats.BatchesRefused.Load(), n, n)
			}
			seen := map[byte]int{}
			for _, m := range out {
				if m.Subject != "out.in.a" {
					t.Fatalf("subject %q, want out.in.a", m.Subject)
				}
				if m.Header.Get("Key") == "" || m.Header.Get("Nats-Expected-Stream") != "" || m.Header.Get(jetstream.MsgIDHeader) != "" {
					t.Fatalf("headers %v: want Key kept, Nats-Expected-* dropped, no id", m.Header)
				}
				seen[m.Data[0]]++
			}
			for b := range 256 {
				if c, want := seen[byte(b)], n/256; c < want || c > want+1 {
					t.Fatalf("payload byte %d forwarded %d times", b, c)
				}
			}
		})
	}
}

func TestMsgIDDedupesInTheOutputStream(t *testing.T) {
	const n, keys = 600, 40
	js, opts := setup(t, n, keys, time.Hour)
	opts.KeyAsMsgID = true
	opts.Key = func(m jetstream.Msg) (string, error) {
		if k := m.Headers().Get("Key"); k != "k7" {
			return k, nil
		}
		return "", errors.New("no key") // skipped and acked
	}
	var stats loop.Stats
	out := drain(t, js, opts, n, &stats)
	if len(out) != keys-1 {
		t.Fatalf("output %d, want %d (one per key but k7)", len(out), keys-1)
	}
	for _, m := range out {
		if m.Header.Get(jetstream.MsgIDHeader) != m.Header.Get("Key") {
			t.Fatalf("id %q for key %q", m.Header.Get(jetstream.MsgIDHeader), m.Header.Get("Key"))
		}
	}
	skipped := uint64(n / keys)
	if stats.Skipped.Load() != skipped || stats.Duplicates.Load() != n-skipped-(keys-1) {
		t.Fatalf("skipped %d, duplicates %d; want %d, %d", stats.Skipped.Load(), stats.Duplicates.Load(), skipped, n-skipped-(keys-1))
	}
}

// TestFastForwardsEveryMessageOnceByID forwards with fast batches into an
// output stream that allows them, each forward carrying its key as
// Nats-Msg-Id, then publishes the whole output again as fast batches:
// every key is stored once, with its id, and the re-publish is dropped by
// the ids.
func TestFastForwardsEveryMessageOnceByID(t *testing.T) {
	const n = 500
	js, opts := setup(t, n, n, time.Hour)
	ctx := context.Background()
	st := allow(t, js, func(c *jetstream.StreamConfig) { c.AllowBatchPublish = true })
	opts.Fast, opts.KeyAsMsgID = true, true
	opts.Key = func(m jetstream.Msg) (string, error) { return m.Headers().Get("Key"), nil }
	var stats loop.Stats
	out := drain(t, js, opts, n, &stats)
	if len(out) != n || stats.Forwarded.Load() != n {
		t.Fatalf("output %d, forwarded %d; want %d each", len(out), stats.Forwarded.Load(), n)
	}
	again := make([]*nats.Msg, 0, n)
	for _, m := range out {
		if m.Header.Get(jetstream.MsgIDHeader) != m.Header.Get("Key") {
			t.Fatalf("id %q for key %q: want the key carried as the id", m.Header.Get(jetstream.MsgIDHeader), m.Header.Get("Key"))
		}
		again = append(again, &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	}
	fp, err := jetstreamext.NewFastPublisher(js)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range again[:n-1] {
		if _, err := fp.AddMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fp.CommitMsg(ctx, again[n-1]); err != nil {
		t.Fatalf("commit of the re-publish: %v", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n {
		t.Fatalf("output holds %d messages after the re-publish, want %d: a re-publish is dropped by its id", info.State.Msgs, n)
	}
}
