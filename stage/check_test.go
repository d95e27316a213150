package stage_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// inventory describes every stream on the server with its configuration
// and consumers, to see that a check changed nothing.
func (e *env) inventory() string {
	e.t.Helper()
	ctx := context.Background()
	var s string
	for info := range e.js.ListStreams(ctx).Info() {
		st, err := e.js.Stream(ctx, info.Config.Name)
		if err != nil {
			e.t.Fatal(err)
		}
		b, err := json.Marshal(info.Config)
		if err != nil {
			e.t.Fatal(err)
		}
		s += string(b) + " consumers:"
		for name := range st.ConsumerNames(ctx).Name() {
			s += " " + name
		}
		s += "\n"
	}
	return s
}

// TestCheckFindsWhatNewRefuses edits a group's streams as an operator
// might: Check reports each refusal of New as an error finding with the
// same message and a fix, and changes nothing on the server; on the
// streams as the stage made them it finds nothing that stops a start.
func TestCheckFindsWhatNewRefuses(t *testing.T) {
	routed := func(e *env) { e.cfg.ScaleOut.Route = config.RouteAlways }
	for _, tc := range []struct {
		name   string
		setup  func(e *env)        // changes the configuration, nil for none
		stream func(e *env) string // the stream to edit, nil for none
		edit   func(c *jetstream.StreamConfig)
		check  string // the finding's check; "" when New must start
	}{
		{"as made", nil, nil, nil, ""},
		{"routed, as made", routed, nil, nil, ""},
		{"routed duplicate window", routed, func(e *env) string { return e.cfg.ScaleOut.RoutedStream },
			func(c *jetstream.StreamConfig) { c.Duplicates = time.Second }, "routed_stream"},
		{"duplicate window", nil, func(e *env) string { return e.cfg.Output.Stream },
			func(c *jetstream.StreamConfig) { c.Duplicates = time.Second }, "duplicate_window"},
		{"changelog limit", nil, func(e *env) string { return e.cfg.Output.Stream },
			func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = 1 }, "changelog"},
		{"control subjects", nil, func(e *env) string { return e.cfg.Output.Stream },
			func(c *jetstream.StreamConfig) { c.Subjects = c.Subjects[:1] }, "control_subjects"},
		{"partition transform", nil, func(e *env) string { return e.cfg.Input.Stream },
			func(c *jetstream.StreamConfig) { c.SubjectTransform = nil }, "partition_transform"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newScaleOutEnv(t)
			if tc.setup != nil {
				tc.setup(e)
			}
			e.as("a").start().stop(t) // creates the streams and the group
			ctx := context.Background()
			if tc.stream != nil {
				st, err := e.js.Stream(ctx, tc.stream(e))
				if err != nil {
					t.Fatal(err)
				}
				c := st.CachedInfo().Config
				tc.edit(&c)
				if _, err := e.js.UpdateStream(ctx, c); err != nil {
					t.Fatalf("edit stream %s: %v", c.Name, err)
				}
			}

			before := e.inventory()
			fs, err := stage.Check(ctx, e.js, e.as("b").cfg)
			if err != nil {
				t.Fatal(err)
			}
			if after := e.inventory(); after != before {
				t.Errorf("Check changed the server:\n%s\nthen\n%s", before, after)
			}

			st, err := stage.New(ctx, stage.Options{Config: e.as("b").cfg, Conn: e.nc, Registry: prometheus.NewRegistry(), Clock: e.clock})
			if tc.check == "" {
				if err != nil {
					t.Fatalf("New: %v, want it to start", err)
				}
				if err := st.Close(); err != nil {
					t.Error(err)
				}
				if finding.Stops(fs) {
					t.Errorf("Check on the streams as made: %+v", fs)
				}
				return
			}
			if err == nil {
				_ = st.Close()
				t.Fatal("New started, want a refusal")
			}
			for _, f := range fs {
				if f.Check == tc.check && f.Severity == finding.Error && f.Message == err.Error() && f.Fix != "" && f.Fix == finding.Fix(err) {
					return
				}
			}
			t.Errorf("New refused with %q (fix %q); Check found no %s error saying so with that fix: %+v", err, finding.Fix(err), tc.check, fs)
		})
	}
}

// TestCheckFindsAnotherGroupRecord: a group made with 4 partitions, checked
// with 8, is refused with the command that removes its record.
func TestCheckFindsAnotherGroupRecord(t *testing.T) {
	e := newScaleOutEnv(t)
	e.as("a").start().stop(t)
	cfg := e.as("b").cfg
	cfg.State.Partitions = 8
	fs, err := stage.Check(context.Background(), e.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := "nats kv del static-consumer-groups " + cfg.Input.Stream + "." + cfg.ScaleOut.Group
	for _, f := range fs {
		if f.Check == "consumer_group" && f.Severity == finding.Error && f.Fix == want {
			return
		}
	}
	t.Errorf("no consumer_group error fixed by %q: %+v", want, fs)
}
