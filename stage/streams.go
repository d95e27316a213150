package stage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
)

// ErrDuplicateWindow means the output stream's duplicate window is too short
// to drop the re-publish that follows a crash between publish and commit.
var ErrDuplicateWindow = errors.New("output stream duplicate window too short")

// ensureStreams creates the input, output and dead-letter streams that are
// missing. It never changes a stream that exists.
func ensureStreams(ctx context.Context, js jetstream.JetStream, cfg config.Config, log *slog.Logger) error {
	wanted := []jetstream.StreamConfig{
		{Name: cfg.Input.Stream, Subjects: cfg.Input.Subjects, Storage: jetstream.FileStorage},
		{Name: cfg.Output.Stream, Subjects: []string{cfg.Output.Subjects()}, Storage: jetstream.FileStorage, Duplicates: cfg.OutputDuplicateWindow(), AllowAtomicPublish: true},
		{Name: cfg.DeadLetter.Stream, Subjects: []string{cfg.DeadLetter.Subjects()}, Storage: jetstream.FileStorage},
	}
	for _, sc := range wanted {
		_, err := js.Stream(ctx, sc.Name)
		if err == nil {
			log.Info("stream exists, left as it is", "stream", sc.Name)
			continue
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("look up stream %s: %w", sc.Name, err)
		}
		if _, err := js.CreateStream(ctx, sc); err != nil {
			return fmt.Errorf("create stream %s on %v: %w", sc.Name, sc.Subjects, err)
		}
		log.Info("stream created", "stream", sc.Name, "subjects", sc.Subjects, "duplicate_window", sc.Duplicates)
	}
	return nil
}

// ensureConsumer binds to the stage's durable pull consumer, creating it when
// missing. An existing consumer is used as it is.
func ensureConsumer(ctx context.Context, js jetstream.JetStream, cfg config.Input, log *slog.Logger) (jetstream.Consumer, error) {
	st, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("input stream %s: %w", cfg.Stream, err)
	}
	c, err := st.Consumer(ctx, cfg.Consumer)
	if err == nil {
		log.Info("consumer exists, used as it is", "stream", cfg.Stream, "consumer", cfg.Consumer,
			"ack_wait", c.CachedInfo().Config.AckWait, "max_deliver", c.CachedInfo().Config.MaxDeliver)
		return c, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("look up consumer %s on %s: %w", cfg.Consumer, cfg.Stream, err)
	}
	cc := jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait.D(),
		MaxAckPending: cfg.MaxAckPending,
		MaxDeliver:    cfg.MaxDeliver,
		FilterSubject: cfg.FilterSubject,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	c, err = st.CreateConsumer(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("create consumer %s on %s: %w", cfg.Consumer, cfg.Stream, err)
	}
	log.Info("consumer created", "stream", cfg.Stream, "consumer", cfg.Consumer, "ack_wait", cc.AckWait, "max_ack_pending", cc.MaxAckPending)
	return c, nil
}

// checkDuplicateWindow compares the output stream's duplicate window with
// the longest redelivery wait after a crash between publish and commit.
func checkDuplicateWindow(ctx context.Context, js jetstream.JetStream, cfg config.Config, cc jetstream.ConsumerConfig, log *slog.Logger) error {
	st, err := js.Stream(ctx, cfg.Output.Stream)
	if err != nil {
		return fmt.Errorf("output stream %s: %w", cfg.Output.Stream, err)
	}
	have := st.CachedInfo().Config.Duplicates
	need := config.RequiredDuplicateWindow(cc.AckWait, cc.BackOff, cfg.Output.RestartMargin.D())
	if have >= need {
		log.Info("output duplicate window covers a crash between publish and commit", "stream", cfg.Output.Stream, "duplicate_window", have, "required", need)
		return nil
	}
	err = fmt.Errorf("%w: stream %s drops re-published ids for %v, but a message can come back %v after a crash (consumer ack_wait %v and backoff %v, plus output.restart_margin %v); raise the stream's duplicate window (nats stream edit %s --dupe-window %v), or lower input.ack_wait, or set output.allow_short_duplicate_window to run anyway",
		ErrDuplicateWindow, cfg.Output.Stream, have, need, cc.AckWait, cc.BackOff, cfg.Output.RestartMargin.D(), cfg.Output.Stream, need)
	if cfg.Output.AllowShortDuplicateWindow {
		log.Warn("RUNNING WITH A SHORT DUPLICATE WINDOW: a crash between publish and commit can forward a message twice", "err", err)
		return nil
	}
	return err
}

// outputPublish decides whether the output is published as atomic batches
// (config.PublishAtomic), from the output stream's AllowAtomicPublish. With
// output.publish atomic on a stream that does not allow it, it returns an
// error wrapping config.ErrAtomicNotAllowed that says how to fix it.
func outputPublish(ctx context.Context, js jetstream.JetStream, cfg config.Config, log *slog.Logger) (bool, error) {
	st, err := js.Stream(ctx, cfg.Output.Stream)
	if err != nil {
		return false, fmt.Errorf("output stream %s: %w", cfg.Output.Stream, err)
	}
	allowed := st.CachedInfo().Config.AllowAtomicPublish
	atomic, err := cfg.PublishAtomic(allowed)
	if err != nil {
		return false, fmt.Errorf("%w: stream %s has AllowAtomicPublish off; allow it (nats stream edit %s --allow-batch) or set output.publish to async or auto",
			err, cfg.Output.Stream, cfg.Output.Stream)
	}
	if atomic {
		log.Info("output published as atomic batches", "stream", cfg.Output.Stream, "publish", cfg.Output.Publish,
			"batch_max", cfg.Output.BatchMax, "max_batches_in_flight", cfg.Output.MaxBatchesInFlight)
	} else {
		log.Info("output published one message at a time", "stream", cfg.Output.Stream, "publish", cfg.Output.Publish,
			"stream_allows_atomic_publish", allowed, "embedded_sync_always", cfg.NATS.URL == "" && cfg.NATS.Embedded.SyncAlways)
	}
	return atomic, nil
}
