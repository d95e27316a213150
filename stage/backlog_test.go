package stage_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// TestScaleOutRefusesBacklogWithoutPartitionToken stores 7 messages in the
// input stream, then gives it the subject transform that puts the
// partition first, and publishes 3 more: the 7 carry no partition token and
// no member of the group would ever consume them, so the start is refused
// with their count and what to do.
func TestScaleOutRefusesBacklogWithoutPartitionToken(t *testing.T) {
	e := newScaleOutEnv(t)
	ctx := context.Background()
	sc := jetstream.StreamConfig{Name: e.cfg.Input.Stream, Subjects: e.cfg.Input.Subjects}
	if _, err := e.js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	publish := func(from, to int) {
		var msgs []*nats.Msg
		for i := from; i < to; i++ {
			msgs = append(msgs, &nats.Msg{Subject: fmt.Sprintf("orders.k%d", i), Data: []byte("{}")})
		}
		natstest.PublishAll(t, e.js, msgs)
	}
	publish(0, 7)
	src, dest, err := e.cfg.ScaleOutPartitioning().Transform()
	if err != nil {
		t.Fatal(err)
	}
	sc.SubjectTransform = &jetstream.SubjectTransformConfig{Source: src, Destination: dest}
	if _, err := e.js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	publish(7, 10)
	st, err := stage.New(ctx, stage.Options{Config: e.cfg, Conn: e.nc, Registry: prometheus.NewRegistry(), Clock: e.clock})
	if err == nil {
		_ = st.Close()
		t.Fatal("started with 7 input messages no member consumes, want a refusal")
	}
	// The check counts with a consumer of its own and removes it: a
	// consumer left on the input would hold pending messages forever.
	in, err2 := e.js.Stream(ctx, e.cfg.Input.Stream)
	if err2 != nil {
		t.Fatal(err2)
	}
	names := in.ConsumerNames(ctx)
	for name := range names.Name() {
		t.Errorf("consumer %s left on the input stream by the start's checks", name)
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(err.Error(), "holds 7 messages without a partition token") || !strings.Contains(err.Error(), "nats stream purge "+e.cfg.Input.Stream) {
		t.Errorf("start refused with %q, want the count (7) and what to do", err)
	}
}

// TestScaleOutJoinsWhileInputFlows starts an instance while a publisher
// stores partitioned input as fast as it can, as when an instance joins a
// running group: none of it lacks a token, so the start's check counts
// none. A check that subtracted the partitioned messages it counted from
// the stream's count read after counted the messages stored in between as
// without a token and refused to start.
func TestScaleOutJoinsWhileInputFlows(t *testing.T) {
	e := newScaleOutEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, dest, err := e.cfg.ScaleOutPartitioning().Transform()
	if err != nil {
		t.Fatal(err)
	}
	sc := jetstream.StreamConfig{Name: e.cfg.Input.Stream, Subjects: e.cfg.Input.Subjects,
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: src, Destination: dest}}
	if _, err := e.js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	published := make(chan int)
	go func() {
		n := 0
		defer func() { published <- n }()
		for ; n < 200_000; n++ { // bounded: the start takes well under that
			select {
			case <-stop:
				return
			default:
			}
			if _, err := e.js.PublishAsync(fmt.Sprintf("orders.k%d", n), []byte("{}")); err != nil {
				return
			}
		}
	}()
	for range 5 {
		st, err := stage.New(ctx, stage.Options{Config: e.cfg, Conn: e.nc, Registry: prometheus.NewRegistry(), Clock: e.clock})
		if err != nil {
			close(stop)
			t.Fatalf("start while input flows: %v", err)
		}
		_ = st.Close()
	}
	close(stop)
	t.Logf("%d messages published during 5 starts", <-published)
}
