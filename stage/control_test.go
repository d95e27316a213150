package stage_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/handover"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// TestScaleOutControlSubjectsApart runs a scale-out instance and reads the
// output as a downstream consumer of the output prefix would: it sees the
// forwarded messages and no fence, while the fences are stored on the
// group's control subjects in the same stream. An output stream without
// the control subjects is then refused at start with the nats stream edit
// command that adds them, and that command's subjects let it start.
func TestScaleOutControlSubjectsApart(t *testing.T) {
	e := newScaleOutEnv(t)
	ctx := context.Background()
	evs, unique := workload(21, 400, 0.2)
	a := e.as("a").start()
	e.publishKeys(keysOf(evs), unique)
	e.scaleOutDrained(60 * time.Second)
	a.stop(t)

	out, err := e.js.Stream(ctx, e.cfg.Output.Stream)
	if err != nil {
		t.Fatal(err)
	}
	// What a consumer of <prefix>.> receives: forwarded messages only.
	c, err := out.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{e.cfg.Output.Subjects()}})
	if err != nil {
		t.Fatal(err)
	}
	data := 0
	for data < len(unique) {
		m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("after %d of %d forwarded messages: %v", data, len(unique), err)
		}
		if _, err := handover.DecodeHeader(m.Headers()); err != nil || m.Headers().Get(jetstream.MsgIDHeader) == "" {
			t.Errorf("a consumer of %s received %s, not a forwarded message: %v", e.cfg.Output.Subjects(), m.Subject(), err)
		}
		data++
	}
	if m, err := c.Next(jetstream.FetchMaxWait(time.Second)); err == nil {
		t.Errorf("a consumer of %s received %s after the %d forwarded messages", e.cfg.Output.Subjects(), m.Subject(), data)
	}
	info, err := out.Info(ctx, jetstream.WithSubjectFilter(handover.ControlSubjects(e.cfg.Output.SubjectPrefix)))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != e.cfg.State.Partitions {
		t.Errorf("fence subjects %v, want one per partition (%d) under %s", info.State.Subjects, e.cfg.State.Partitions, handover.ControlSubjects(e.cfg.Output.SubjectPrefix))
	}

	// An existing output stream without the control subjects.
	e.editOutput(func(c *jetstream.StreamConfig) { c.Subjects = []string{e.cfg.Output.Subjects()} })
	st, err := stage.New(ctx, stage.Options{Config: e.as("a").cfg, Conn: e.nc, Registry: prometheus.NewRegistry(), Clock: e.clock})
	if err == nil {
		_ = st.Close()
		t.Fatal("started on an output stream without the control subjects, want a refusal")
	}
	fix := "nats stream edit " + e.cfg.Output.Stream + " --subjects '" + e.cfg.Output.Subjects() + "," + handover.ControlSubjects(e.cfg.Output.SubjectPrefix) + "'"
	if !errors.Is(err, stage.ErrControlSubjects) || !strings.Contains(err.Error(), fix) {
		t.Fatalf("start refused with %q, want stage.ErrControlSubjects and %q", err, fix)
	}
	// The fix's subjects.
	e.editOutput(func(c *jetstream.StreamConfig) {
		c.Subjects = []string{e.cfg.Output.Subjects(), handover.ControlSubjects(e.cfg.Output.SubjectPrefix)}
	})
	e.as("a").start().stop(t)
}
