package config

import (
	"errors"
	"fmt"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/redact"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/sink"
)

// Values of Totals.LateEvents.
const (
	// LateDeadLetter dead-letters an event for a closed bucket (reason
	// "closed_bucket").
	LateDeadLetter = "dead-letter"
	// LateDrop acknowledges an event for a closed bucket and drops it; it is
	// counted, never forwarded nor added.
	LateDrop = "drop"
)

// Limits of the totals section, enforced by Validate.
const (
	// MaxTotalsBucket is the longest totals.bucket: 366 days.
	MaxTotalsBucket = Duration(366 * 24 * time.Hour)
	// MaxFlushInterval is the longest totals.flush_interval.
	MaxFlushInterval = Duration(time.Hour)
)

// Totals configures optional totals per (group, time bucket): each new event
// adds to its group's bucket in the same transaction that records its key,
// and the absolute totals are flushed to the sinks, which keep the larger
// value. Off by default.
type Totals struct {
	// Enabled turns totals on. Default false. With totals on, the group key
	// is also the partition key.
	Enabled bool `yaml:"enabled"`
	// Group is where the group key is read from (header, json or subject).
	// Required when enabled. Every copy of one intent key must carry the
	// same group: the group routes the message to its partition.
	Group keys.FieldSpec `yaml:"group"`
	// Bucket is the length of a time bucket, a whole number of seconds,
	// 1s..366d. Buckets are aligned to the Unix epoch in UTC. Default 1m.
	Bucket Duration `yaml:"bucket"`
	// Time is where an event's time is read from: a header or JSON field
	// holding RFC 3339 text or Unix seconds or milliseconds (see
	// configs/README.md). Unused (default) means the time the input stream
	// stored the message.
	Time keys.FieldSpec `yaml:"time"`
	// Value is where the number an event adds is read from: an integer
	// >= 0. Unused (default) means each event counts 1.
	Value keys.FieldSpec `yaml:"value"`
	// FlushInterval is how often changed totals are written to the sinks
	// (and once more at shutdown). Default 5s; at most 1h.
	FlushInterval Duration `yaml:"flush_interval"`
	// LateEvents says what happens to an event whose bucket is closed (its
	// end + W is past): "dead-letter" (default) or "drop".
	LateEvents string `yaml:"late_events"`
	// Sinks are where totals are written; at least one when enabled.
	Sinks TotalsSinks `yaml:"sinks"`
	// Replicas of the KV bucket and the stream the stage creates for the
	// totals, 0..5. Default 0: as many as the streams the stage creates
	// (scale_out.replicas with scale-out on, else 1), so that the totals
	// survive the loss of a node as the streams do. See TotalsReplicas.
	Replicas int `yaml:"replicas"`
}

// TotalsReplicas returns the replicas of the totals KV bucket and stream
// the stage creates: totals.replicas when set, else those of the streams
// it creates (scale_out.replicas with scale-out on, else 1).
func (c Config) TotalsReplicas() int {
	switch {
	case c.Totals.Replicas > 0:
		return c.Totals.Replicas
	case c.ScaleOut.Enabled:
		return c.ScaleOut.Replicas
	default:
		return 1
	}
}

// TotalsSinks lists the sinks totals are written to. A sink is used when
// its first field (kv.bucket, stream.stream, postgres.dsn) is set.
type TotalsSinks struct {
	// KV is the JetStream key-value sink.
	KV KVSink `yaml:"kv"`
	// Stream is the JetStream stream sink.
	Stream StreamSink `yaml:"stream"`
	// Postgres is the PostgreSQL sink.
	Postgres PostgresSink `yaml:"postgres"`
}

// KVSink writes totals to a JetStream key-value bucket.
type KVSink struct {
	// Bucket is the KV bucket's name; empty (default) means no KV sink.
	Bucket string `yaml:"bucket"`
	// Create: create the bucket when missing. Default false; it is also
	// created when nats.create_streams is in effect.
	Create bool `yaml:"create"`
}

// Enabled reports whether the KV sink is configured.
func (k KVSink) Enabled() bool { return k.Bucket != "" }

// StreamSink publishes totals to a JetStream stream.
type StreamSink struct {
	// Stream is the stream's name; empty (default) means no stream sink.
	Stream string `yaml:"stream"`
	// SubjectPrefix: a total of group G is published to
	// SubjectPrefix + "." + token(G). Default "dedupe.totals".
	SubjectPrefix string `yaml:"subject_prefix"`
	// Create: create the stream (subjects SubjectPrefix + ".>") when
	// missing. Default false; it is also created when nats.create_streams
	// is in effect.
	Create bool `yaml:"create"`
}

// Enabled reports whether the stream sink is configured.
func (s StreamSink) Enabled() bool { return s.Stream != "" }

// Subjects returns the subjects of the totals stream: SubjectPrefix + ".>".
func (s StreamSink) Subjects() string { return sink.StreamSubjects(s.SubjectPrefix) }

// PostgresSink writes totals to a PostgreSQL table.
type PostgresSink struct {
	// DSN is the connection string (postgres://user:pass@host/db?... or
	// key=value form); empty (default) means no PostgreSQL sink. Also set
	// by $DEDUPE_TOTALS_POSTGRES_DSN.
	DSN string `yaml:"dsn"`
	// Table is the table's name, optionally schema-qualified. Default
	// "dedupe_totals".
	Table string `yaml:"table"`
	// CreateSchema: create the table when missing. Default false.
	CreateSchema bool `yaml:"create_schema"`
}

// Enabled reports whether the PostgreSQL sink is configured.
func (p PostgresSink) Enabled() bool { return p.DSN != "" }

// DefaultTotals returns the defaults of the totals section: off, 1m
// buckets, count per event, stream time, flushes every 5s, late events
// dead-lettered, no sink.
func DefaultTotals() Totals {
	return Totals{
		Bucket:        Duration(time.Minute),
		FlushInterval: Duration(5 * time.Second),
		LateEvents:    LateDeadLetter,
		Sinks: TotalsSinks{
			Stream:   StreamSink{SubjectPrefix: "dedupe.totals"},
			Postgres: PostgresSink{Table: "dedupe_totals"},
		},
	}
}

// validateTotals checks the totals section. Field specs are checked
// whenever set; the rest only when totals are enabled.
func (c Config) validateTotals(v *validator) {
	t := c.Totals
	spec := func(field string, s keys.FieldSpec) {
		if err := s.Validate(field); err != nil {
			var j interface{ Unwrap() []error }
			if errors.As(err, &j) {
				for _, e := range j.Unwrap() {
					v.errs = append(v.errs, keyError{e})
				}
				return
			}
			v.errs = append(v.errs, keyError{err})
		}
	}
	spec("totals.group", t.Group)
	spec("totals.time", t.Time)
	spec("totals.value", t.Value)
	if t.Replicas < 0 || t.Replicas > MaxScaleOutReplicas {
		v.add("totals.replicas", "%d, want 0 (as the streams) or 1..%d", t.Replicas, MaxScaleOutReplicas)
	}
	if !t.Enabled {
		return
	}
	if !t.Group.Enabled() {
		v.add("totals.group.source", "empty, want header, json or subject: totals need a group key; "+
			"it is also the partition key, so every copy of an intent key must carry the same group")
	}
	if t.Bucket < Duration(time.Second) || t.Bucket > MaxTotalsBucket || t.Bucket.D()%time.Second != 0 {
		v.add("totals.bucket", "%v, want a whole number of seconds from 1s to %v", t.Bucket, MaxTotalsBucket)
	}
	if t.FlushInterval <= 0 || t.FlushInterval > MaxFlushInterval {
		v.add("totals.flush_interval", "%v, want > 0 and <= %v", t.FlushInterval, MaxFlushInterval)
	}
	switch t.LateEvents {
	case LateDeadLetter, LateDrop:
	default:
		v.add("totals.late_events", "%q, want %q or %q", t.LateEvents, LateDeadLetter, LateDrop)
	}
	s := t.Sinks
	if !s.KV.Enabled() && !s.Stream.Enabled() && !s.Postgres.Enabled() {
		v.add("totals.sinks", "none configured, want at least one of totals.sinks.kv.bucket, totals.sinks.stream.stream or totals.sinks.postgres.dsn")
	}
	if s.KV.Enabled() {
		if msg := checkKVBucket(s.KV.Bucket); msg != "" {
			v.add("totals.sinks.kv.bucket", "%q: %s", s.KV.Bucket, msg)
		}
	}
	if s.Stream.Enabled() {
		c.validateTotalsStream(v)
	}
	if s.Postgres.Enabled() {
		if _, err := sink.ParseTable(s.Postgres.Table); err != nil {
			v.add("totals.sinks.postgres.table", "%q: want a lower-case table name such as dedupe_totals or analytics.totals (%v)", s.Postgres.Table, err)
		}
	}
}

// validateTotalsStream checks the stream sink: a stream name of its own and
// subjects that no other stream of the stage captures.
func (c Config) validateTotalsStream(v *validator) {
	s := c.Totals.Sinks.Stream
	checkName(v, "totals.sinks.stream.stream", s.Stream)
	for _, other := range []struct{ field, name string }{
		{"input.stream", c.Input.Stream}, {"output.stream", c.Output.Stream}, {"dead_letter.stream", c.DeadLetter.Stream},
	} {
		if s.Stream == other.name {
			v.add("totals.sinks.stream.stream", "%q, the same as %s", s.Stream, other.field)
		}
	}
	if msg := checkSubject(s.SubjectPrefix, false); msg != "" {
		v.add("totals.sinks.stream.subject_prefix", "%q: %s", s.SubjectPrefix, msg)
		return
	}
	totals := s.Subjects()
	others := append([]string(nil), c.Input.Subjects...)
	if c.Input.FilterSubject != "" {
		others = append(others, c.Input.FilterSubject)
	}
	for _, in := range others {
		if checkSubject(in, true) == "" && subjectsOverlap(totals, in) {
			v.add("totals.sinks.stream.subject_prefix", "%q: totals subjects %q overlap input subject %q: the stage would read its own totals", s.SubjectPrefix, totals, in)
		}
	}
	if checkSubject(c.Output.SubjectPrefix, false) == "" && subjectsOverlap(totals, c.Output.Subjects()) {
		v.add("totals.sinks.stream.subject_prefix", "%q: totals subjects %q overlap output subjects %q", s.SubjectPrefix, totals, c.Output.Subjects())
	}
	if checkSubject(c.DeadLetter.Subject, false) == "" && subjectsOverlap(totals, c.DeadLetter.Subjects()) {
		v.add("totals.sinks.stream.subject_prefix", "%q: totals subjects %q overlap dead-letter subjects %q", s.SubjectPrefix, totals, c.DeadLetter.Subjects())
	}
}

// checkKVBucket returns "" when name is a valid JetStream KV bucket name,
// else why not.
func checkKVBucket(name string) string {
	if len(name) > 255 {
		return fmt.Sprintf("%d bytes, want at most 255", len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return fmt.Sprintf("byte %d (%q) not allowed: a bucket name is letters, digits, '_' and '-'", i, c)
		}
	}
	return ""
}

// totalsSummary describes the totals section for Summary, without secrets.
func (c Config) totalsSummary() []string {
	t := c.Totals
	if !t.Enabled {
		return []string{"off"}
	}
	timeSrc := "the input stream's timestamp"
	if t.Time.Enabled() {
		timeSrc = t.Time.String()
	}
	value := "count of events"
	if t.Value.Enabled() {
		value = "sum of " + t.Value.String()
	}
	out := []string{
		fmt.Sprintf("group %v (also the partition key), %v buckets by %s, %s", t.Group, t.Bucket, timeSrc, value),
		fmt.Sprintf("flushed every %v and at shutdown; events for buckets closed (end + W past) are %s", t.FlushInterval,
			map[string]string{LateDeadLetter: "dead-lettered (closed_bucket)", LateDrop: "dropped and counted"}[t.LateEvents]),
	}
	create := func(own bool) string {
		if own || c.NATS.ShouldCreateStreams() {
			return fmt.Sprintf(", created when missing with %d replicas", c.TotalsReplicas())
		}
		return ", must exist"
	}
	s := t.Sinks
	if s.KV.Enabled() {
		out = append(out, fmt.Sprintf("sink kv: bucket %s%s", s.KV.Bucket, create(s.KV.Create)))
	}
	if s.Stream.Enabled() {
		publish := "one publish per total"
		if c.SideStreamAtomic(true) {
			publish = "each flush as atomic batches when the stream allows atomic publish, else one publish per total"
		}
		out = append(out, fmt.Sprintf("sink stream: %s (subjects %s)%s; %s", s.Stream.Stream, s.Stream.Subjects(), create(s.Stream.Create), publish))
	}
	if s.Postgres.Enabled() {
		tbl := "must exist"
		if s.Postgres.CreateSchema {
			tbl = "created when missing"
		}
		out = append(out, fmt.Sprintf("sink postgres: %s, table %s (%s)", redact.DSN(s.Postgres.DSN), s.Postgres.Table, tbl))
	}
	return out
}
