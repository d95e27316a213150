package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// scaleOutOn returns a valid scale-out configuration: an external server,
// the key in the second token of orders.*, 4 partitions.
func scaleOutOn() Config {
	c := Default()
	c.NATS.URL = "nats://127.0.0.1:4222"
	c.Input.Subjects = []string{"orders.*"}
	c.Key.Field = keys.FieldSpec{Source: keys.SourceSubject, SubjectToken: 2}
	c.State.Partitions = 4
	c.ScaleOut.Enabled = true
	c.ScaleOut.Instance = "a"
	return c
}

func TestScaleOutOffByDefault(t *testing.T) {
	d := Default()
	if d.ScaleOut.Enabled || d.ScaleOut.Group != "dedupe" || d.ScaleOut.Instance != "" || d.ScaleOut.Replicas != 3 {
		t.Errorf("default scale_out %+v, want off, group dedupe, instance from the host name, 3 replicas", d.ScaleOut)
	}
	// Off, nothing scale-out needs is asked of the default (embedded
	// server, header key).
	if err := d.Validate(); err != nil {
		t.Errorf("default config: %v", err)
	}
	ext := Default()
	ext.NATS.URL = "nats://127.0.0.1:4222"
	if got, _ := ext.PublishAtomic(true); got {
		t.Error("scale-out off: output.publish auto with an external server is atomic; want one publish per message, as before")
	}
	if got, err := scaleOutOn().PublishAtomic(true); !got || err != nil {
		t.Errorf("scale-out: output.publish auto gives atomic %v, %v; want atomic", got, err)
	}
	if _, err := scaleOutOn().PublishAtomic(false); !errors.Is(err, ErrAtomicNotAllowed) {
		t.Errorf("scale-out on a stream without atomic publish: %v, want ErrAtomicNotAllowed", err)
	}
	if err := scaleOutOn().Validate(); err != nil {
		t.Errorf("scale-out with a subject key: %v", err)
	}
}

func TestScaleOutValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *Config)
		want   []string // substrings, each in some error; nil = valid
	}{
		{"key in a middle token, a > after it", func(c *Config) {
			c.Input.Subjects = []string{"shop.*.orders.*.>"}
			c.Key.Field.SubjectToken = 4
		}, nil},
		{"snapshots off", func(c *Config) { c.ScaleOut.SnapshotInterval = 0 }, nil},
		{"snapshots too often", func(c *Config) { c.ScaleOut.SnapshotInterval = Duration(time.Millisecond) },
			[]string{"scale_out.snapshot_interval: 1ms, want 0 (off) or 1s to 1d"}},
		{"snapshots too rarely", func(c *Config) { c.ScaleOut.SnapshotInterval = Duration(25 * time.Hour) },
			[]string{"scale_out.snapshot_interval: 1d1h"}},
		{"bundles off", func(c *Config) { c.ScaleOut.RouteBundleMax = 0 }, nil},
		{"standbys off", func(c *Config) { c.ScaleOut.Standbys = 0 }, nil},
		{"standbys at most", func(c *Config) { c.ScaleOut.Standbys = 4 }, nil},
		{"standbys too many", func(c *Config) { c.ScaleOut.Standbys = 5 },
			[]string{"scale_out.standbys: 5, want 0 (no warm standbys"}},
		{"standbys negative", func(c *Config) { c.ScaleOut.Standbys = -1 },
			[]string{"scale_out.standbys: -1"}},
		{"bundles too large", func(c *Config) { c.ScaleOut.RouteBundleMax = 257 },
			[]string{"scale_out.route_bundle_max: 257, want 0 (every copy alone) to 256"}},
		{"bundles negative", func(c *Config) { c.ScaleOut.RouteBundleMax = -1 },
			[]string{"scale_out.route_bundle_max: -1"}},
		{"embedded server", func(c *Config) { c.NATS.URL = "" },
			[]string{"scale_out.enabled: true with the embedded server"}},
		{"async output", func(c *Config) { c.Output.Publish = PublishAsync },
			[]string{"output.publish: \"async\" with scale_out.enabled", "atomic batch"}},
		{"totals, the group a subject token", func(c *Config) {
			c.Input.Subjects = []string{"orders.*.*"}
			c.Key.Field.SubjectToken = 3
			c.Totals.Enabled = true
			c.Totals.Group = keys.FieldSpec{Source: keys.SourceSubject, SubjectToken: 2}
			c.Totals.Sinks.KV.Bucket = "t"
			c.ScaleOut.Route = RouteNever
		}, nil},
		{"totals, the group a header, routed", func(c *Config) {
			c.Totals.Enabled = true
			c.Totals.Group = keys.FieldSpec{Source: keys.SourceHeader, Header: "Group"}
			c.Totals.Sinks.KV.Bucket = "t"
		}, nil},
		{"totals, the group a header, not routed", func(c *Config) {
			c.Totals.Enabled = true
			c.Totals.Group = keys.FieldSpec{Source: keys.SourceHeader, Header: "Group"}
			c.Totals.Sinks.KV.Bucket = "t"
			c.ScaleOut.Route = RouteNever
		}, []string{"totals.group: totals.group is header", "other keys need the route step"}},
		{"totals, max_event_time_ahead negative", func(c *Config) {
			c.Totals.Enabled = true
			c.Totals.Group = keys.FieldSpec{Source: keys.SourceHeader, Header: "Group"}
			c.Totals.Sinks.KV.Bucket = "t"
			c.ScaleOut.MaxEventTimeAhead = -1
		}, []string{"scale_out.max_event_time_ahead: -1ns, want 0 to 366d"}},
		{"totals, output max_age below the retention", func(c *Config) {
			c.Totals.Enabled = true
			c.Totals.Group = keys.FieldSpec{Source: keys.SourceHeader, Header: "Group"}
			c.Totals.Time = keys.FieldSpec{Source: keys.SourceHeader, Header: "Ts"}
			c.Totals.Bucket = Duration(time.Hour)
			c.Totals.Sinks.KV.Bucket = "t"
			c.Output.Limits.MaxAge = Duration(2 * time.Hour)
		}, []string{"want 0 (computed) or at least W + input.ack_wait + output.restart_margin + totals.bucket + scale_out.max_event_time_ahead = 3h11m10s"}},
		{"header key", func(c *Config) {
			c.ScaleOut.Route = RouteNever
			c.Key.Field = keys.FieldSpec{Source: keys.SourceHeader, Header: "Nats-Msg-Id"}
		},
			[]string{"key: key is header", "need the route step (scale_out.route auto or always)"}},
		{"key token from the end", func(c *Config) { c.ScaleOut.Route = RouteNever; c.Key.Field.SubjectToken = -1 },
			[]string{"counted from the start"}},
		{"key token not a wildcard", func(c *Config) { c.ScaleOut.Route = RouteNever; c.Key.Field.SubjectToken = 1 },
			[]string{"key.subject_token 1 is not a '*' token of input.subjects[0] \"orders.*\""}},
		{"key token under >", func(c *Config) {
			c.ScaleOut.Route = RouteNever
			c.Input.Subjects = []string{"orders.>"}
		}, []string{"key.subject_token 2 is not a '*' token"}},
		{"two input subjects", func(c *Config) { c.ScaleOut.Route = RouteNever; c.Input.Subjects = []string{"orders.*", "refunds.*"} },
			[]string{"input.subjects: input.subjects has 2 subjects, scale-out needs exactly one"}},
		{"header key, routed", func(c *Config) { c.Key.Field = keys.FieldSpec{Source: keys.SourceHeader, Header: "Nats-Msg-Id"} }, nil},
		{"two input subjects, routed", func(c *Config) { c.Input.Subjects = []string{"orders.*", "refunds.*"} }, nil},
		{"bad route", func(c *Config) { c.ScaleOut.Route = "sometimes" }, []string{"scale_out.route: \"sometimes\", want auto, always or never"}},
		{"bad routed subject", func(c *Config) { c.ScaleOut.Route = RouteAlways; c.ScaleOut.RoutedSubject = "a.*" },
			[]string{"scale_out.routed_subject: \"a.*\": wildcards not allowed here"}},
		{"routed stream is the input", func(c *Config) { c.ScaleOut.Route = RouteAlways; c.ScaleOut.RoutedStream = c.Input.Stream },
			[]string{"scale_out.routed_stream: \"EVENTS\" is also the input"}},
		{"filter subject", func(c *Config) { c.Input.FilterSubject = "orders.x" },
			[]string{"input.filter_subject: \"orders.x\" with scale_out.enabled"}},
		{"bad group", func(c *Config) { c.ScaleOut.Group = "a.b" }, []string{"scale_out.group: \"a.b\""}},
		{"ack_wait shorter than two pulls", func(c *Config) { c.Input.AckWait = Duration(1500 * time.Millisecond) },
			[]string{"input.ack_wait: 1.5s with scale_out.enabled, want at least 2s"}},
		{"ack_wait of two pulls", func(c *Config) { c.Input.AckWait = Duration(MinScaleOutAckWait) }, nil},
		{"replicas", func(c *Config) { c.ScaleOut.Replicas = 0 }, []string{"scale_out.replicas: 0, want 1..5"}},
		{"batch larger than an atomic batch", func(c *Config) { c.Output.BatchMax = 100 },
			[]string{"output.batch_max: 100, below pipeline.batch_size 256"}},
		{"output max_age below the retention", func(c *Config) { c.Output.Limits.MaxAge = Duration(time.Hour) },
			[]string{"output.max_age: 1h with scale_out.enabled, want 0 (computed) or at least W + input.ack_wait + output.restart_margin = 1h11m10s"}},
		{"output max_bytes", func(c *Config) { c.Output.Limits.MaxBytes = 1024 * MiB },
			[]string{"output.max_bytes: 1GiB with scale_out.enabled, want 0"}},
		{"off ignores all of it", func(c *Config) {
			c.ScaleOut.Enabled = false
			c.NATS.URL = ""
			c.Key.Field = keys.FieldSpec{Source: keys.SourceHeader, Header: "Nats-Msg-Id"}
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := scaleOutOn()
			tt.change(&c)
			err := c.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("want ErrInvalid, got %v", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestScaleOutSummary(t *testing.T) {
	c := scaleOutOn()
	got := c.Summary()
	for _, want := range []string{
		`instance "a" in static consumer group "dedupe": members p0..p3`,
		"hand-over after a crash ≈ input.ack_wait 10s",
		"input stream transform orders.* -> {{partition(4,1)}}.orders.{{wildcard(1)}}",
		"streams created with 3 replicas",
		"at most 4 instances do work (one per partition, state.partitions)",
		"instance counts that share the 4 partitions evenly: 1, 2, 4;",
		"stream EVENTS_DEDUPED (subjects deduped.>, _dedupe.deduped.>)",
		"a partition judges up to 1000 messages together (output.batch_max)",
		"output.publish auto with scale-out: atomic batches",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary does not say %q:\n%s", want, got)
		}
	}
	w, err := c.Window.Derive()
	if err != nil {
		t.Fatal(err)
	}
	bucket, every, keep, off := c.ScaleOutSnapshots(w.W)
	if bucket != "dedupe-snapshots" || every != 2*time.Minute || keep != c.OutputRetention(w.W) || off != "" {
		t.Errorf("snapshots %q every %v kept %v (off %q), want dedupe-snapshots every 2m kept %v", bucket, every, keep, off, c.OutputRetention(w.W))
	}
	if want := fmt.Sprintf("partition snapshots every 2m into object store dedupe-snapshots (as many replicas as the output stream, objects kept %v)", Duration(keep)); !strings.Contains(got, want) {
		t.Errorf("summary does not say %q:\n%s", want, got)
	}
	c.ScaleOut.SnapshotInterval = 0
	if _, every, _, off := c.ScaleOutSnapshots(w.W); every != 0 || !strings.Contains(c.Summary(), "partition snapshots off ("+off+")") {
		t.Errorf("snapshot_interval 0: every %v, summary:\n%s", every, c.Summary())
	}
	c.ScaleOut.SnapshotInterval = Duration(time.Minute)
	c.Totals.Enabled = true
	if _, every, _, off := c.ScaleOutSnapshots(w.W); every != 0 || !strings.Contains(off, "totals") {
		t.Errorf("with totals: snapshots every %v (off %q), want off because of totals", every, off)
	}
	c.Totals.Enabled = false
	if got, want := c.PartitionBatch(), c.Output.BatchMax; got != want {
		t.Errorf("with scale-out a partition's batch is %d, want output.batch_max %d", got, want)
	}
	if got, want := Default().PartitionBatch(), Default().Pipeline.BatchSize; got != want {
		t.Errorf("without scale-out a partition's batch is %d, want pipeline.batch_size %d", got, want)
	}
	if s := Default().Summary(); !strings.Contains(s, "scale-out:   off (one instance)") {
		t.Errorf("default summary does not say scale-out is off:\n%s", s)
	}
}

// TestScaleOutStateRecordsTheServersHash: with scale-out on, the store is
// opened to record (and insist on) the server's hash for the group; off,
// the single-instance layout is unchanged.
func TestScaleOutStateRecordsTheServersHash(t *testing.T) {
	c := scaleOutOn()
	c.ScaleOut.Group = "g1"
	w, err := c.Window.Derive()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.StateOptions(w).Partitioning, (state.Partitioning{Hash: state.HashServerFNV1a32, Group: "g1"}); got != want {
		t.Errorf("scale-out state partitioning %+v, want %+v", got, want)
	}
	if err := c.StateOptions(w).Validate(); err != nil {
		t.Errorf("scale-out state options: %v", err)
	}
	if got := Default().StateOptions(w).Partitioning; got != (state.Partitioning{}) {
		t.Errorf("single-instance state partitioning %+v, want the zero value (xxhash64)", got)
	}
}
