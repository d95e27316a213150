package config

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/keys"
)

// totalsOn returns the default config with totals on: group from the JSON
// field campaign_id and a KV sink.
func totalsOn() Config {
	c := Default()
	c.Totals.Enabled = true
	c.Totals.Group = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "campaign_id"}
	c.Totals.Sinks.KV.Bucket = "totals"
	return c
}

func TestTotalsDefaultsAreOff(t *testing.T) {
	d := Default().Totals
	if d.Enabled || d.Bucket != Duration(time.Minute) || d.FlushInterval != Duration(5*time.Second) || d.LateEvents != LateDeadLetter {
		t.Errorf("default totals %+v, want off, 1m buckets, 5s flushes, late events dead-lettered", d)
	}
	if d.Sinks.KV.Enabled() || d.Sinks.Stream.Enabled() || d.Sinks.Postgres.Enabled() {
		t.Errorf("default totals configure a sink: %+v", d.Sinks)
	}
	if err := totalsOn().Validate(); err != nil {
		t.Errorf("totals with a group and a KV sink: %v", err)
	}
}

func TestTotalsValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *Config)
		want   []string // substrings, each in some error; nil = valid
	}{
		{"off ignores missing group and sinks", func(c *Config) {
			c.Totals.Enabled = false
			c.Totals.Group = keys.FieldSpec{}
			c.Totals.Sinks.KV.Bucket = ""
		}, nil},
		{"all sinks", func(c *Config) {
			c.Totals.Sinks.Stream.Stream = "TOTALS"
			c.Totals.Sinks.Postgres.DSN = "postgres://u:p@db/x"
			c.Totals.Sinks.Postgres.Table = "analytics.totals"
		}, nil},
		{"time and value from json and header", func(c *Config) {
			c.Totals.Time = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "ts"}
			c.Totals.Value = keys.FieldSpec{Source: keys.SourceHeader, Header: "Amount"}
			c.Totals.LateEvents = LateDrop
			c.Totals.Bucket = Duration(time.Hour)
		}, nil},
		{"no group", func(c *Config) { c.Totals.Group = keys.FieldSpec{} },
			[]string{"totals.group.source: empty", "also the partition key"}},
		{"bad group spec", func(c *Config) { c.Totals.Group = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "a..b"} },
			[]string{"totals.group.json_path"}},
		{"bad time spec even when off", func(c *Config) {
			c.Totals.Enabled = false
			c.Totals.Time = keys.FieldSpec{Source: "clock"}
		}, []string{"totals.time.source"}},
		{"stray value field", func(c *Config) {
			c.Totals.Value = keys.FieldSpec{Source: keys.SourceHeader, Header: "A", JSONPath: "x"}
		},
			[]string{"totals.value.json_path"}},
		{"no sink", func(c *Config) { c.Totals.Sinks.KV.Bucket = "" }, []string{"totals.sinks: none configured"}},
		{"sub-second bucket", func(c *Config) { c.Totals.Bucket = Duration(1500 * time.Millisecond) }, []string{"totals.bucket: 1.5s"}},
		{"zero bucket", func(c *Config) { c.Totals.Bucket = 0 }, []string{"totals.bucket: 0"}},
		{"huge bucket", func(c *Config) { c.Totals.Bucket = MaxTotalsBucket + Duration(time.Second) }, []string{"totals.bucket"}},
		{"zero flush interval", func(c *Config) { c.Totals.FlushInterval = 0 }, []string{"totals.flush_interval: 0"}},
		{"late events", func(c *Config) { c.Totals.LateEvents = "ignore" }, []string{`totals.late_events: "ignore"`}},
		{"kv bucket name", func(c *Config) { c.Totals.Sinks.KV.Bucket = "my.totals" }, []string{"totals.sinks.kv.bucket", "'.'"}},
		{"stream name", func(c *Config) { c.Totals.Sinks.Stream.Stream = "A.B" }, []string{"totals.sinks.stream.stream"}},
		{"stream is the input", func(c *Config) { c.Totals.Sinks.Stream.Stream = "EVENTS" }, []string{"the same as input.stream"}},
		{"stream subjects overlap input", func(c *Config) {
			c.Totals.Sinks.Stream.Stream = "TOTALS"
			c.Totals.Sinks.Stream.SubjectPrefix = "events.totals"
		}, []string{"totals.sinks.stream.subject_prefix", "read its own totals"}},
		{"stream subjects overlap dead letters", func(c *Config) {
			c.Totals.Sinks.Stream.Stream = "TOTALS"
			c.Totals.Sinks.Stream.SubjectPrefix = "dedupe.dlq.totals"
		}, []string{"overlap dead-letter subjects"}},
		{"stream wildcard prefix", func(c *Config) {
			c.Totals.Sinks.Stream.Stream = "TOTALS"
			c.Totals.Sinks.Stream.SubjectPrefix = "totals.*"
		}, []string{"totals.sinks.stream.subject_prefix", "wildcards"}},
		{"postgres table", func(c *Config) {
			c.Totals.Sinks.Postgres.DSN = "postgres://db/x"
			c.Totals.Sinks.Postgres.Table = "Totals"
		}, []string{"totals.sinks.postgres.table"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := totalsOn()
			tt.change(&c)
			err := c.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate = %v, want ErrInvalid", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate = %v, want it to mention %q", err, w)
				}
			}
		})
	}
}

func TestTotalsExample(t *testing.T) {
	c, err := Load(filepath.Join("..", "configs", "totals.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	tt := c.Totals
	switch {
	case !tt.Enabled:
		t.Error("totals.yaml: totals off")
	case c.Key.Field != (keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "click_id"}):
		t.Errorf("totals.yaml: key %v, want json click_id", c.Key.Field)
	case tt.Group != (keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "campaign_id"}):
		t.Errorf("totals.yaml: group %v, want json campaign_id", tt.Group)
	case tt.Time != (keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "ts"}) || tt.Bucket != Duration(time.Minute):
		t.Errorf("totals.yaml: time %v, bucket %v; want json ts, 1m", tt.Time, tt.Bucket)
	case tt.Value.Enabled():
		t.Errorf("totals.yaml: value %v, want a count", tt.Value)
	case !tt.Sinks.KV.Enabled() || !tt.Sinks.Postgres.Enabled() || tt.Sinks.Stream.Enabled():
		t.Errorf("totals.yaml: sinks %+v, want KV and PostgreSQL", tt.Sinks)
	}
	s := c.Summary()
	for _, want := range []string{"totals:", `group json "campaign_id" (also the partition key)`, "1m buckets by json \"ts\"", "sink kv: bucket", "sink postgres:"} {
		if !strings.Contains(s, want) {
			t.Errorf("Summary does not contain %q:\n%s", want, s)
		}
	}
}

func TestTotalsSummaryHidesPasswords(t *testing.T) {
	for _, dsn := range []string{
		"postgres://clicks:s3cret-pw@db:5432/ads?sslmode=disable",
		"postgres://clicks@db/ads?password=s3cret-pw",
		"host=db user=clicks password=s3cret-pw dbname=ads",
	} {
		c := totalsOn()
		c.Totals.Sinks.Postgres.DSN = dsn
		s := c.Summary()
		if strings.Contains(s, "s3cret-pw") || !strings.Contains(s, "db") {
			t.Errorf("DSN %q: Summary shows the password or not the host:\n%s", dsn, s)
		}
	}
	if s := Default().Summary(); !strings.Contains(s, "totals:      off") {
		t.Errorf("Summary with totals off:\n%s", s)
	}
}
