package stage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/sink"
)

// openSinks opens the totals sinks c.Totals.Sinks configures, each
// instrumented with m, creating its bucket, stream or table when configured
// to (a bucket or stream also when nats.create_streams is in effect; with
// c.TotalsReplicas() replicas). It is the one place that maps the
// configuration to sinks: a new sink is written in sink/ and opened here.
// Errors name the YAML field. On error it closes what it opened. A bucket
// or stream that exists with fewer replicas is used, with a warning naming
// the fix. The stream sink publishes atomic batches as
// config.Config.SideStreamAtomic decides.
func openSinks(ctx context.Context, js jetstream.JetStream, c config.Config, m *sink.Metrics, log *slog.Logger) (sinks []sink.Sink, err error) {
	defer func() {
		if err != nil {
			closeSinks(sinks)
			sinks = nil
		}
	}()
	sk, replicas, create := c.Totals.Sinks, c.TotalsReplicas(), c.NATS.ShouldCreateStreams()
	if sk.KV.Enabled() {
		s, err := sink.OpenKV(ctx, js, sk.KV.Bucket, create || sk.KV.Create, replicas)
		if err != nil {
			return sinks, kvSinkError(sk.KV.Bucket, err)
		}
		sinks = append(sinks, sink.Instrument(s, m))
		warnFewReplicas(ctx, js, "KV_"+sk.KV.Bucket, "totals.sinks.kv.bucket "+sk.KV.Bucket, replicas, log)
	}
	if sk.Stream.Enabled() {
		s, err := sink.OpenStream(ctx, js, sk.Stream.Stream, sk.Stream.SubjectPrefix, create || sk.Stream.Create, replicas, c.SideStreamAtomic)
		if err != nil {
			return sinks, streamSinkError(sk.Stream, err)
		}
		sinks = append(sinks, sink.Instrument(s, m))
		warnFewReplicas(ctx, js, sk.Stream.Stream, "totals.sinks.stream.stream "+sk.Stream.Stream, replicas, log)
	}
	if sk.Postgres.Enabled() {
		s, err := sink.OpenPostgres(ctx, sk.Postgres.DSN, sk.Postgres.Table, sk.Postgres.CreateSchema)
		if err != nil {
			return sinks, fmt.Errorf("totals.sinks.postgres: %w", err)
		}
		sinks = append(sinks, sink.Instrument(s, m))
	}
	return sinks, nil
}

// kvSinkError is openSinks' refusal of the KV sink's bucket.
func kvSinkError(bucket string, err error) error {
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return finding.WithFix(fmt.Errorf("totals.sinks.kv.bucket %s: %w (create it, or set totals.sinks.kv.create)", bucket, err),
			"nats kv add "+bucket+" --storage file")
	}
	return fmt.Errorf("totals.sinks.kv.bucket %s: %w", bucket, err)
}

// streamSinkError is openSinks' refusal of the stream sink's stream.
func streamSinkError(cfg config.StreamSink, err error) error {
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return finding.WithFix(fmt.Errorf("totals.sinks.stream.stream %s: %w (create it, or set totals.sinks.stream.create)", cfg.Stream, err),
			natsStreamAdd(jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{sink.StreamSubjects(cfg.SubjectPrefix)},
				Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld, MaxBytes: -1, AllowAtomicPublish: true}))
	}
	return fmt.Errorf("totals.sinks.stream.stream %s: %w", cfg.Stream, err)
}

// checkSinks checks, reading only, what openSinks would refuse of the
// totals sinks cfg configures: a bucket or stream that does not exist and
// is not to be created (an error; to be created: an info), and a
// PostgreSQL server that does not answer or has no table of the sink's
// columns (an error, or an info when totals.sinks.postgres.create_schema
// creates it).
func checkSinks(ctx context.Context, js jetstream.JetStream, cfg config.Config) []finding.Finding {
	if !cfg.Totals.Enabled {
		return nil
	}
	sk, create := cfg.Totals.Sinks, cfg.NATS.ShouldCreateStreams()
	var fs []finding.Finding
	if sk.KV.Enabled() {
		if _, err := js.KeyValue(ctx, sk.KV.Bucket); errors.Is(err, jetstream.ErrBucketNotFound) && (create || sk.KV.Create) {
			fs = append(fs, finding.Finding{Check: "totals_sink", Severity: finding.Info,
				Message: fmt.Sprintf("totals.sinks.kv.bucket %s does not exist; run creates it", sk.KV.Bucket)})
		} else if err != nil {
			fs = append(fs, finding.FromError("totals_sink", finding.Error, kvSinkError(sk.KV.Bucket, err)))
		}
	}
	if sk.Stream.Enabled() {
		if _, err := js.Stream(ctx, sk.Stream.Stream); errors.Is(err, jetstream.ErrStreamNotFound) && (create || sk.Stream.Create) {
			fs = append(fs, finding.Finding{Check: "totals_sink", Severity: finding.Info,
				Message: fmt.Sprintf("totals.sinks.stream.stream %s does not exist; run creates it (subjects %s)", sk.Stream.Stream, sink.StreamSubjects(sk.Stream.SubjectPrefix))})
		} else if err != nil {
			fs = append(fs, finding.FromError("totals_sink", finding.Error, streamSinkError(sk.Stream, err)))
		}
	}
	if sk.Postgres.Enabled() {
		// Without create_schema, opening the sink only reads (a probe of
		// the table); the table is created when run opens it.
		s, err := sink.OpenPostgres(ctx, sk.Postgres.DSN, sk.Postgres.Table, false)
		switch {
		case err == nil:
			_ = s.Close()
		case errors.Is(err, sink.ErrNoTable) && sk.Postgres.CreateSchema:
			fs = append(fs, finding.Finding{Check: "totals_sink", Severity: finding.Info,
				Message: fmt.Sprintf("totals.sinks.postgres.table %s does not exist; run creates it (create_schema)", sk.Postgres.Table)})
		default:
			fs = append(fs, finding.FromError("totals_sink", finding.Error, fmt.Errorf("totals.sinks.postgres: %w", err)))
		}
	}
	return fs
}

// closeSinks closes every sink.
func closeSinks(sinks []sink.Sink) {
	for _, s := range sinks {
		_ = s.Close()
	}
}

// warnFewReplicas logs a warning when stream, which holds the totals of
// field, has fewer replicas than want: a bucket or stream made before
// totals.replicas existed has one, and the loss of its node stops every
// total. The stage does not change a stream it finds; the warning says how.
func warnFewReplicas(ctx context.Context, js jetstream.JetStream, stream, field string, want int, log *slog.Logger) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return // the sink opened: a lookup that fails now says nothing about replicas
	}
	if have := st.CachedInfo().Config.Replicas; have < want {
		log.Warn("the totals are kept with fewer replicas than the stage's streams: losing its node stops every total",
			"field", field, "stream", stream, "replicas", have, "want", want,
			"fix", fmt.Sprintf("nats stream edit %s --replicas %d", stream, want))
	}
}
