package ensure_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/ensure"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// openKV opens bucket on js as the stage opens its buckets.
func openKV(ctx context.Context, js jetstream.JetStream, bucket string) (jetstream.KeyValue, bool, error) {
	return ensure.Open(ctx, "bucket "+bucket, func(ctx context.Context) (jetstream.KeyValue, error) {
		return js.KeyValue(ctx, bucket)
	}, func(ctx context.Context) (jetstream.KeyValue, error) {
		return js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, Replicas: 3})
	}, ensure.Options{})
}

// TestConcurrentOpensOnAFreshCluster: three clients, each on its own node
// of a new 3-node cluster, open the same R3 bucket at the same moment,
// round after round. Looked up first and created when missing, one of
// them waited for its lookup's request timeout in about half the rounds:
// the server leaves a stream's info request unanswered while the stream
// another client created has no leader yet. Every open now returns the
// bucket well within the client's 5 s request timeout, and it takes a
// write within the same bound.
func TestConcurrentOpensOnAFreshCluster(t *testing.T) {
	const rounds, clients = 4, 3
	const bound = 4 * time.Second // the requirement: no request timeout waited, with margin
	for round := range rounds {
		cl := natstest.StartCluster(t, 3)
		var wg sync.WaitGroup
		took := make([]time.Duration, clients)
		errs := make([]error, clients)
		kvs := make([]jetstream.KeyValue, clients)
		for i := range clients {
			_, js := natstest.Connect(t, cl.URL(i))
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				start := time.Now()
				kvs[i], _, errs[i] = openKV(ctx, js, "b")
				took[i] = time.Since(start)
			})
		}
		wg.Wait()
		for i := range clients {
			if errs[i] != nil {
				t.Fatalf("round %d client %d: %v", round, i, errs[i])
			}
			if took[i] > bound {
				t.Errorf("round %d client %d: open took %v, want within %v", round, i, took[i], bound)
			}
			// A stream just created may still be electing its leader on a
			// busy machine, and refuse a write with no response meanwhile;
			// the stage retries such a write, so the test does too, within
			// the bound.
			var err error
			for deadline := time.Now().Add(bound); ; time.Sleep(50 * time.Millisecond) {
				if _, err = kvs[i].Put(context.Background(), "k", []byte("v")); err == nil || time.Now().After(deadline) {
					break
				}
			}
			if err != nil {
				t.Errorf("round %d client %d: put into the opened bucket for %v: %v", round, i, bound, err)
			}
		}
		t.Logf("round %d: opens took %v", round, took)
	}
}

// TestOpenBindsToAnotherConfiguration: a stream that exists with another
// configuration than the one the create asks for is opened as it is.
func TestOpenBindsToAnotherConfiguration(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, MaxMsgs: 7}); err != nil {
		t.Fatal(err)
	}
	missing := true
	st, created, err := ensure.Open(ctx, "stream S", func(ctx context.Context) (jetstream.Stream, error) {
		if missing { // as when the lookup ran before another instance's create
			missing = false
			return nil, jetstream.ErrStreamNotFound
		}
		return js.Stream(ctx, "S")
	}, func(ctx context.Context) (jetstream.Stream, error) {
		return js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	}, ensure.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if created || st.CachedInfo().Config.MaxMsgs != 7 {
		t.Errorf("created %v, max msgs %d: want the existing stream (7), not created", created, st.CachedInfo().Config.MaxMsgs)
	}
}

// TestOpenStopsAtARefusal: a create no retry can change (subjects another
// stream holds) fails at once, naming what was opened.
func TestOpenStopsAtARefusal(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "A", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	_, _, err := ensure.Open(ctx, "stream B", func(ctx context.Context) (jetstream.Stream, error) {
		return js.Stream(ctx, "B")
	}, func(ctx context.Context) (jetstream.Stream, error) {
		return js.CreateStream(ctx, jetstream.StreamConfig{Name: "B", Subjects: []string{"s.>"}})
	}, ensure.Options{})
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "stream B") {
		t.Errorf("err = %v (ctx %v), want the overlap refusal, at once, naming stream B", err, ctx.Err())
	}
}

// TestOpenStoppedSaysWhy: an open stopped while the server does not answer
// says what it waited for and why, not a bare "context canceled".
func TestOpenStoppedSaysWhy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	unanswered := func(ctx context.Context) (jetstream.Stream, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	_, _, err := ensure.Open(ctx, "stream S", unanswered, unanswered, ensure.Options{})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "stream S") || !strings.Contains(err.Error(), "not answered") {
		t.Errorf("err = %v, want it to name stream S, the lookup not answered, and wrap the deadline", err)
	}
}

// TestLookupOutlivesAMomentaryNotFound: right after a stream's create was
// answered, a lookup was once told it does not exist, and the instance
// exited; a lookup without a create asks again for ensure.MissingGrace,
// and fails with the server's answer after that.
func TestLookupOutlivesAMomentaryNotFound(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	lookups := 0
	lookup := func(name string) func(context.Context) (jetstream.Stream, error) {
		return func(ctx context.Context) (jetstream.Stream, error) {
			lookups++
			if lookups == 1 { // as a server that has not applied the create yet
				return nil, jetstream.ErrStreamNotFound
			}
			return js.Stream(ctx, name)
		}
	}
	if _, _, err := ensure.Open(ctx, "stream S", lookup("S"), nil, ensure.Options{}); err != nil {
		t.Errorf("stream S after one not-found answer: %v", err)
	}
	lookups = 0
	start := time.Now()
	_, _, err := ensure.Open(ctx, "stream T", lookup("T"), nil, ensure.Options{})
	if !errors.Is(err, jetstream.ErrStreamNotFound) || time.Since(start) < ensure.MissingGrace {
		t.Errorf("stream T, missing: %v after %v, want not found after %v", err, time.Since(start), ensure.MissingGrace)
	}
}

// TestOpenConsumer: a durable consumer is created when missing, found when
// it exists, and one that exists with another configuration (an
// operator's) is bound to as it is, also when a lookup went unanswered
// and a create was asked.
func TestOpenConsumer(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	want := jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Second}
	unanswered := false
	open := func() (jetstream.Consumer, bool, error) {
		return ensure.Open(ctx, "consumer C", func(ctx context.Context) (jetstream.Consumer, error) {
			if unanswered { // as while a node that just came back catches up
				unanswered = false
				return nil, context.DeadlineExceeded
			}
			return js.Consumer(ctx, "S", "C")
		}, func(ctx context.Context) (jetstream.Consumer, error) {
			return js.CreateConsumer(ctx, "S", want)
		}, ensure.Options{})
	}
	c, created, err := open()
	if err != nil || !created || c.CachedInfo().Config.AckWait != want.AckWait {
		t.Fatalf("open of a missing consumer: created %v, err %v; want it created", created, err)
	}
	if _, created, err := open(); err != nil || created {
		t.Fatalf("open of the consumer just created: created %v, err %v; want it found", created, err)
	}
	if err := js.DeleteConsumer(ctx, "S", "C"); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute}); err != nil {
		t.Fatal(err)
	}
	unanswered = true
	c, created, err = open()
	if err != nil || created || c.CachedInfo().Config.AckWait != time.Minute {
		t.Errorf("open of an operator's consumer after an unanswered lookup: created %v, err %v; want it bound to as it is (ack wait 1m)", created, err)
	}
}
