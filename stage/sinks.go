package stage

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/sink"
)

// openSinks opens the totals sinks cfg.Sinks configures, each instrumented
// with m, creating its bucket, stream or table when configured to (a bucket
// or stream also when createStreams, nats.create_streams in effect). It is
// the one place that maps the configuration to sinks: a new sink is written
// in sink/ and opened here. Errors name the YAML field. On error it closes
// what it opened. atomic decides whether the stream sink publishes atomic
// batches (config.Config.SideStreamAtomic).
func openSinks(ctx context.Context, js jetstream.JetStream, cfg config.Totals, createStreams bool, atomic func(streamAllowsAtomic bool) bool, m *sink.Metrics) (sinks []sink.Sink, err error) {
	defer func() {
		if err != nil {
			closeSinks(sinks)
			sinks = nil
		}
	}()
	sk := cfg.Sinks
	if sk.KV.Enabled() {
		s, err := sink.OpenKV(ctx, js, sk.KV.Bucket, createStreams || sk.KV.Create)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return sinks, fmt.Errorf("totals.sinks.kv.bucket %s: %w (create it, or set totals.sinks.kv.create)", sk.KV.Bucket, err)
		} else if err != nil {
			return sinks, fmt.Errorf("totals.sinks.kv.bucket %s: %w", sk.KV.Bucket, err)
		}
		sinks = append(sinks, sink.Instrument(s, m))
	}
	if sk.Stream.Enabled() {
		s, err := sink.OpenStream(ctx, js, sk.Stream.Stream, sk.Stream.SubjectPrefix, createStreams || sk.Stream.Create, atomic)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return sinks, fmt.Errorf("totals.sinks.stream.stream %s: %w (create it, or set totals.sinks.stream.create)", sk.Stream.Stream, err)
		} else if err != nil {
			return sinks, fmt.Errorf("totals.sinks.stream.stream %s: %w", sk.Stream.Stream, err)
		}
		sinks = append(sinks, sink.Instrument(s, m))
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

// closeSinks closes every sink.
func closeSinks(sinks []sink.Sink) {
	for _, s := range sinks {
		_ = s.Close()
	}
}
