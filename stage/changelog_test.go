package stage_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// editOutput applies edit to the output stream's configuration.
func (e *env) editOutput(edit func(c *jetstream.StreamConfig)) {
	e.t.Helper()
	ctx := context.Background()
	st, err := e.js.Stream(ctx, e.cfg.Output.Stream)
	if err != nil {
		e.t.Fatal(err)
	}
	c := st.CachedInfo().Config
	edit(&c)
	if _, err := e.js.UpdateStream(ctx, c); err != nil {
		e.t.Fatalf("edit the output stream: %v", err)
	}
}

// TestScaleOutStartRefusesChangelogLimits starts an instance against an
// output stream edited with a limit that drops records (the issue's
// reproduction is max_msgs_per_subject 1): the start is refused, naming
// the stream field and the nats stream edit that fixes it. A count limit
// with discard new drops nothing (the stream refuses new messages
// instead, which the stage reports) and starts.
func TestScaleOutStartRefusesChangelogLimits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(c *jetstream.StreamConfig)
		field string // "" when the start must succeed
		fix   string
	}{
		{"max_msgs_per_subject", func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = 1 }, "max_msgs_per_subject 1", "--max-msgs-per-subject=-1"},
		{"max_msgs", func(c *jetstream.StreamConfig) { c.MaxMsgs = 1_000_000 }, "max_msgs 1000000 with discard old", "--max-msgs=-1"},
		{"max_bytes", func(c *jetstream.StreamConfig) { c.MaxBytes = 1 << 30 }, "max_bytes 1073741824 with discard old", "--max-bytes=-1"},
		{"max_msgs discard new", func(c *jetstream.StreamConfig) { c.MaxMsgs, c.Discard = 1_000_000, jetstream.DiscardNew }, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newScaleOutEnv(t)
			e.start().stop(t) // creates the streams
			e.editOutput(tc.edit)
			st, err := stage.New(context.Background(), stage.Options{Config: e.cfg, Conn: e.nc, Registry: prometheus.NewRegistry(), Clock: e.clock})
			if tc.field == "" {
				if err != nil {
					t.Fatalf("start: %v, want it to start", err)
				}
				if err := st.Close(); err != nil {
					t.Error(err)
				}
				return
			}
			if err == nil {
				_ = st.Close()
				t.Fatalf("start with the output's %s: started, want a refusal", tc.field)
			}
			want := "nats stream edit " + e.cfg.Output.Stream + " " + tc.fix
			if !errors.Is(err, stage.ErrChangelog) || !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), want) {
				t.Errorf("start refused with %q, want stage.ErrChangelog naming %q and %q", err, tc.field, want)
			}
		})
	}
}

// TestScaleOutTakeoverRefusesShortChangelog edits the output stream of a
// running group so that it drops records (max_msgs_per_subject 1), then
// purges it, and each time makes another instance take the partitions:
// while the stream drops records, and after the purge removed records of
// keys still in the window, no partition is taken, nothing is forwarded
// (copies of purged keys would go out again), and
// dedupe_partition_refused_total says why; with the limit removed, the
// partitions are taken and every key is forwarded once.
func TestScaleOutTakeoverRefusesShortChangelog(t *testing.T) {
	e := newScaleOutEnv(t)
	ea, eb, ec := e.as("a"), e.as("b"), e.as("c")
	evs, unique := workload(37, 600, 0)
	ks := keysOf(evs)
	a := ea.start()
	e.publishKeys(ks[:200], unique)
	e.scaleOutDrained(60 * time.Second)

	b := eb.start() // checked at its start, while the stream keeps everything
	e.editOutput(func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = 1 })
	a.stop(t)
	e.publishKeys(ks[200:400], unique)
	e.refusedAgain(b, "limits") // b is offered the partitions again and again
	if got := counter(t, b.reg, "dedupe_partition_takeovers_total", nil); got != 0 {
		t.Errorf("instance b took partitions %v times with the output at max_msgs_per_subject 1, want 0", got)
	}
	if got := counter(t, b.reg, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != 0 {
		t.Errorf("instance b forwarded %v keys without taking a partition", got)
	}
	if got := counter(t, b.reg, "dedupe_partition_refused_total", map[string]string{"reason": "limits"}); got < 1 {
		t.Errorf("dedupe_partition_refused_total{reason=limits} = %v on b, want >= 1", got)
	}

	e.editOutput(func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = -1 })
	e.scaleOutDrained(60 * time.Second)
	e.checkOnce(e.scaleOutOutput(), subset(unique, ks[:400]))
	if got := counter(t, b.reg, "dedupe_partition_takeovers_total", nil); got < 4 {
		t.Errorf("instance b took partitions %v times once the limit was gone, want at least 4", got)
	}

	// A purge removes records of keys still inside the window: an
	// instance with an empty data dir must not take the partitions.
	st, err := e.js.Stream(context.Background(), e.cfg.Output.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := ec.start()
	b.stop(t)
	copies := append(ks[:100:100], ks[400:]...)
	e.publishKeys(copies, unique)
	e.refusedAgain(c, "short")
	if got := counter(t, c.reg, "dedupe_partition_takeovers_total", nil); got != 0 {
		t.Errorf("instance c took partitions %v times after the output was purged, want 0", got)
	}
	if got := counter(t, c.reg, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != 0 {
		t.Errorf("instance c forwarded %v keys from a purged changelog (copies of purged keys among them)", got)
	}
	if got := counter(t, c.reg, "dedupe_partition_refused_total", map[string]string{"reason": "short"}); got < 1 {
		t.Errorf("dedupe_partition_refused_total{reason=short} = %v on c, want >= 1", got)
	}
}

// refusedAgain waits until every partition's batch came back to r after
// ack_wait (each member consumer redelivered) and r refused takeovers for
// reason once more per partition after that, or a minute passed: the test
// checks next that r took nothing and forwarded nothing meanwhile.
func (e *env) refusedAgain(r *running, reason string) {
	e.t.Helper()
	stream := e.cfg.Input.Stream
	if routed, _ := e.cfg.ScaleOutPartitioning().Routed(); routed {
		stream = e.cfg.ScaleOut.RoutedStream
	}
	refused := func() float64 {
		return counter(e.t, r.reg, "dedupe_partition_refused_total", map[string]string{"reason": reason})
	}
	var before float64
	deadline := time.Now().Add(time.Minute)
	natstest.Until(time.Until(deadline), 50*time.Millisecond, func() bool {
		before = refused()
		for p := range e.cfg.State.Partitions {
			c, err := e.js.Consumer(context.Background(), stream, layout.MemberConsumer(e.cfg.ScaleOut.Group, p))
			if err != nil {
				return false
			}
			if ci, err := c.Info(context.Background()); err != nil || ci.NumRedelivered == 0 {
				return false
			}
		}
		return true
	})
	natstest.Until(time.Until(deadline), 50*time.Millisecond, func() bool {
		return refused() >= before+float64(e.cfg.State.Partitions)
	})
}

// subset returns the entries of m under ks.
func subset(m map[string][]byte, ks []string) map[string][]byte {
	out := make(map[string][]byte, len(ks))
	for _, k := range ks {
		out[k] = m[k]
	}
	return out
}
