package stage_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
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
		if _, err := changelog.DecodeHeader(m.Headers()); err != nil || m.Headers().Get(jetstream.MsgIDHeader) == "" {
			t.Errorf("a consumer of %s received %s, not a forwarded message: %v", e.cfg.Output.Subjects(), m.Subject(), err)
		}
		data++
	}
	if m, err := c.Next(jetstream.FetchMaxWait(time.Second)); err == nil {
		t.Errorf("a consumer of %s received %s after the %d forwarded messages", e.cfg.Output.Subjects(), m.Subject(), data)
	}
	info, err := out.Info(ctx, jetstream.WithSubjectFilter(changelog.ControlSubjects(e.cfg.Output.SubjectPrefix)))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != e.cfg.State.Partitions {
		t.Errorf("fence subjects %v, want one per partition (%d) under %s", info.State.Subjects, e.cfg.State.Partitions, changelog.ControlSubjects(e.cfg.Output.SubjectPrefix))
	}

	// An existing output stream without the control subjects.
	e.editOutput(func(c *jetstream.StreamConfig) { c.Subjects = []string{e.cfg.Output.Subjects()} })
	st, err := stage.New(ctx, stage.Options{Config: e.as("a").cfg, Conn: e.nc, Registry: prometheus.NewRegistry(), Clock: e.clock})
	if err == nil {
		_ = st.Close()
		t.Fatal("started on an output stream without the control subjects, want a refusal")
	}
	fix := "nats stream edit " + e.cfg.Output.Stream + " --subjects '" + e.cfg.Output.Subjects() + "," + changelog.ControlSubjects(e.cfg.Output.SubjectPrefix) + "'"
	if !errors.Is(err, stage.ErrControlSubjects) || !strings.Contains(err.Error(), fix) {
		t.Fatalf("start refused with %q, want stage.ErrControlSubjects and %q", err, fix)
	}
	// The fix's subjects.
	e.editOutput(func(c *jetstream.StreamConfig) {
		c.Subjects = []string{e.cfg.Output.Subjects(), changelog.ControlSubjects(e.cfg.Output.SubjectPrefix)}
	})
	e.as("a").start().stop(t)
}

// TestScaleOutDeadLetterFence moves every partition's dead-letter fence
// under a running owner, as a new owner does when it takes the partitions:
// the dead letters the owner decided under its tenure are refused
// (counted) and left unacked, the owner, still pinned, takes the
// partitions again, and in the end every input it dead-letters is stored
// once. Without the fence the first dead letters would be stored beside
// the new owner's (a zombie's second dead letter, once past the stream's
// duplicate window).
func TestScaleOutDeadLetterFence(t *testing.T) {
	e := newScaleOutEnv(t).as("a")
	a := e.start()
	payload := map[string][]byte{}
	var ks []string
	for i := range 100 {
		k := fmt.Sprintf("k-%d", i)
		payload[k] = []byte(`{"n":1}`)
		ks = append(ks, k)
	}
	e.publishKeys(ks, payload)
	e.scaleOutDrained(60 * time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for p := range e.cfg.State.Partitions {
		if _, err := changelog.Take(ctx, e.js, e.cfg.DeadLetter.Stream, changelog.FenceSubject(e.cfg.DeadLetter.Subject, p), "other"); err != nil {
			t.Fatal(err)
		}
	}
	// A copy of every key with another body: a fingerprint mismatch each,
	// dead-lettered (pipeline.on_fingerprint_mismatch: dead_letter).
	other := map[string][]byte{}
	for _, k := range ks {
		other[k] = []byte(`{"n":2}`)
	}
	e.publishKeys(ks, other)
	e.scaleOutDrained(90 * time.Second)

	e.checkOnce(e.scaleOutOutput(), payload)
	perSeq := map[string]int{}
	for _, m := range e.deadLetters() {
		perSeq[m.Header.Get(deadletter.HeaderOriginalSequence)]++
	}
	if len(perSeq) != len(ks) {
		t.Errorf("%d inputs dead-lettered, want the %d copies", len(perSeq), len(ks))
	}
	for seq, n := range perSeq {
		if n != 1 {
			t.Errorf("input sequence %s dead-lettered %d times, want once", seq, n)
		}
	}
	if got := counter(t, a.reg, "dedupe_dead_letter_fence_refusals_total", nil); got < 1 {
		t.Errorf("dedupe_dead_letter_fence_refusals_total = %v, want >= 1: no dead letter was refused by a moved fence", got)
	}
	if got := counter(t, a.reg, "dedupe_partition_takeovers_total", nil); got < 5 {
		t.Errorf("dedupe_partition_takeovers_total = %v, want >= 5 (4 at start, then again after a refusal)", got)
	}
}

// deadLetters returns the dead-letter stream's dead letters, without the
// scale-out group's fences (changelog.ControlSubjects of the dead-letter
// subject).
func (e *env) deadLetters() []natstest.Message {
	e.t.Helper()
	control := strings.TrimSuffix(changelog.ControlSubjects(e.cfg.DeadLetter.Subject), ">")
	var dl []natstest.Message
	for _, m := range natstest.ReadAll(e.t, e.js, e.cfg.DeadLetter.Stream) {
		if !strings.HasPrefix(m.Subject, control) {
			dl = append(dl, m)
		}
	}
	return dl
}
