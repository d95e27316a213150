// Package natstest runs a real nats-server with JetStream in process for
// tests, and reads streams back for assertions. It is for tests and the bench.
package natstest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// RunServer starts a JetStream server on a random loopback port, storing in
// dir (t.TempDir() when dir is ""). It is shut down when the test ends.
func RunServer(tb testing.TB, dir string) *server.Server {
	tb.Helper()
	if dir == "" {
		dir = tb.TempDir()
	}
	return RunServerOn(tb, dir, -1)
}

// RunServerOn is RunServer on a fixed port (-1 for a random one), for tests
// that restart a server on the same address.
func RunServerOn(tb testing.TB, dir string, port int) *server.Server {
	tb.Helper()
	return RunServerWith(tb, func(o *server.Options) { o.StoreDir, o.Port = dir, port })
}

// RunServerWith is RunServer with the options changed by edit first (for
// limits such as MaxPayload).
func RunServerWith(tb testing.TB, edit func(*server.Options)) *server.Server {
	tb.Helper()
	o := &server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: tb.TempDir(),
		NoLog: true, NoSigs: true,
	}
	edit(o)
	s, err := server.NewServer(o)
	if err != nil {
		tb.Fatalf("nats-server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		tb.Fatal("nats-server not ready in 10s")
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// Connect connects to s and returns the connection and a JetStream context;
// both are closed when the test ends.
func Connect(tb testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		tb.Fatalf("connect %s: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// Message is a stored stream message, for assertions.
type Message struct {
	Seq     uint64
	Subject string
	Header  nats.Header
	Data    []byte
	Time    time.Time // when the stream stored it
}

// maxNoResponders bounds the "no responders" answers Read waits
// out in a row: 10 s at one every 100 ms.
const maxNoResponders = 100

// maxResets bounds the attempts of one reset of Read's ordered consumer
// (about 25 s with nats.go's backoff of 1 s doubling to 10 s).
const maxResets = 5

// Read calls fn for every message stream holds, in order, and
// returns how many it read. It is the one stream reader of the tests and
// the bench.
func Read(ctx context.Context, js jetstream.JetStream, stream string, fn func(jetstream.Msg)) (int, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	want := info.State.Msgs
	if want == 0 {
		return 0, nil
	}
	// A reset of the ordered consumer (after a gap, or when the node it
	// was placed on is gone) is retried a few times only: unbounded, a
	// reset that keeps failing on a cluster with a node down holds Fetch,
	// which takes no context, forever. ReadAll reads again instead.
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{MaxResetAttempts: maxResets})
	if err != nil {
		return 0, fmt.Errorf("ordered consumer on %s: %w", stream, err)
	}
	var got uint64
	noResponders := 0
	for got < want {
		n := 0
		batch, err := c.Fetch(int(min(want-got, 4096)), jetstream.FetchMaxWait(5*time.Second))
		if err == nil {
			for m := range batch.Messages() {
				fn(m)
				n++
			}
			err = batch.Error()
		}
		if errors.Is(err, nats.ErrNoResponders) && n == 0 && noResponders < maxNoResponders && ctx.Err() == nil {
			// On a cluster the ordered consumer, when created or
			// re-created after a gap, can be asked before its node
			// answers pulls; it keeps its position, so ask again.
			noResponders++
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if err != nil && !errors.Is(err, nats.ErrTimeout) {
			return int(got), fmt.Errorf("fetch %s after %d messages: %w", stream, got, err)
		}
		if n == 0 {
			return int(got), fmt.Errorf("stream %s: read %d of %d messages, then nothing", stream, got, want)
		}
		noResponders = 0
		got += uint64(n)
	}
	return int(got), nil
}

// ReadAll returns every message in stream, in order, failing the test when
// the stream cannot be read within a minute. A read that fails (a cluster's
// consumer unanswered through an election, a reset that gave up) is begun
// again from the start while the minute lasts.
func ReadAll(tb testing.TB, js jetstream.JetStream, stream string) []Message {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []Message
	_, err := ReadAgain(ctx, js, stream, func(err error) {
		out = out[:0]
		if err != nil {
			tb.Logf("reading stream %s again from its start: %v", stream, err)
		}
	}, func(m jetstream.Msg) {
		md, _ := m.Metadata()
		out = append(out, Message{Seq: md.Sequence.Stream, Subject: m.Subject(), Header: m.Headers(), Data: m.Data(), Time: md.Timestamp})
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// ReadAgain is Read begun again from the start while it fails and ctx
// lasts: begin is called before each read, with the error of the read
// before (nil before the first), so that fn's caller can reset what it
// counted.
func ReadAgain(ctx context.Context, js jetstream.JetStream, stream string, begin func(error), fn func(jetstream.Msg)) (int, error) {
	var err error
	for {
		begin(err)
		var n int
		if n, err = Read(ctx, js, stream, fn); err == nil || ctx.Err() != nil {
			return n, err
		}
		select {
		case <-ctx.Done():
			return 0, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Until calls cond every interval until it returns true, and reports
// whether it did before timeout passed. It never fails the test. It is the
// one polling loop of the project's tests: Poll and WaitFor are built on
// it, and a test calls it itself only where a wait must not fail the test,
// in a goroutine other than the test's (where Fatal must not be called),
// or where the wait ends the first of a condition and a time on purpose
// (run the stage until its output holds N messages or a random time
// passed, then kill it).
func Until(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// Poll calls cond every interval until it returns true, and fails the test
// when timeout passes first, naming what and the last error cond returned.
// It is Until for a condition that can say why it does not hold yet: wait
// for a condition, never sleep out a timeout.
func Poll(tb testing.TB, timeout, interval time.Duration, what string, cond func() (bool, error)) {
	tb.Helper()
	var last error
	ok := Until(timeout, interval, func() bool {
		ok, err := cond()
		if err != nil {
			last = err
		}
		return ok
	})
	if ok {
		return
	}
	if last != nil {
		tb.Fatalf("timed out after %v waiting for %s (last error: %v)", timeout, what, last)
	}
	tb.Fatalf("timed out after %v waiting for %s", timeout, what)
}

// WaitFor polls cond every 20ms until it is true or timeout passes, then
// fails the test with what. It is Poll for a condition without an error to
// report, at the interval most waits want: the shape a test reaches for
// first.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	Poll(tb, timeout, 20*time.Millisecond, what, func() (bool, error) { return cond(), nil })
}

// WaitDrained waits until consumer on stream has acknowledged every message
// the stream holds: nothing pending, nothing awaiting an ack, and the ack
// floor at the stream's last sequence.
func WaitDrained(tb testing.TB, js jetstream.JetStream, stream, consumer string, timeout time.Duration) {
	tb.Helper()
	WaitFor(tb, timeout, "consumer "+consumer+" to ack everything in "+stream, func() bool {
		ctx := context.Background()
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return false
		}
		si, err := st.Info(ctx)
		if err != nil {
			return false
		}
		c, err := st.Consumer(ctx, consumer)
		if err != nil {
			return false
		}
		ci, err := c.Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && ci.AckFloor.Stream >= si.State.LastSeq
	})
}

// PublishAll publishes msgs with JetStream and fails the test unless every
// one is stored within a minute of the last.
func PublishAll(tb testing.TB, js jetstream.JetStream, msgs []*nats.Msg) {
	tb.Helper()
	if err := Publish(context.Background(), js, len(msgs), func(i int) *nats.Msg { return msgs[i] }, nil); err != nil {
		tb.Fatal(err)
	}
}

// Publish publishes count messages, msg(i) for i in order, as fast as the
// server acknowledges them (as many in flight as js's
// PublishAsyncMaxPending allows, 4000 by default), and calls sent, when
// not nil, with the count handed to js so far. It fails unless every one
// is stored, within a minute of the last. It is the one publisher of the
// tests and the bench.
func Publish(ctx context.Context, js jetstream.JetStream, count int, msg func(i int) *nats.Msg, sent func(n int)) error {
	futures := make(chan jetstream.PubAckFuture, 4096)
	failed := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				select {
				case failed <- fmt.Errorf("publish to %s: %w", f.Msg().Subject, err):
				default:
				}
			}
		}
	}()
	var err error
	for i := range count {
		if err = ctx.Err(); err != nil {
			break
		}
		var f jetstream.PubAckFuture
		if f, err = js.PublishMsgAsync(msg(i), jetstream.WithStallWait(30*time.Second)); err != nil {
			err = fmt.Errorf("publish %d of %d: %w", i, count, err)
			break
		}
		futures <- f
		if sent != nil {
			sent(i + 1)
		}
	}
	close(futures)
	select {
	case <-done:
	case <-time.After(time.Minute):
		return errors.New("publishes not acknowledged within a minute")
	}
	if err != nil {
		return err
	}
	select {
	case err := <-failed:
		return err
	default:
		return nil
	}
}
