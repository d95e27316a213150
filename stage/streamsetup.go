package stage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/ensure"
	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/internal/streams"
)

// Errors about the streams.
var (
	// ErrDuplicateWindow means the output stream's duplicate window is too
	// short to drop the re-publish that follows a crash between publish and
	// commit.
	ErrDuplicateWindow = errors.New("output stream duplicate window too short")
	// ErrStreamMissing means a stream the stage needs does not exist and the
	// stage is not configured to create it.
	ErrStreamMissing = errors.New("stream not found")
)

// DefaultStreamMaxAge is the floor of the computed max_age of the streams
// the stage creates: a week, so that a stage stopped over a long weekend
// still finds its unjudged input, and dead letters wait a week for someone
// to read them.
const DefaultStreamMaxAge = 7 * 24 * time.Hour

// StreamMaxAge is the max_age a stream is created with: configured when it
// is set (> 0); otherwise the larger of DefaultStreamMaxAge and 2 x w (so
// that a replay of the input over a whole window, and a stage that was down
// for up to a window, still find their messages). It is never shorter than
// duplicates, the stream's duplicate window, which JetStream requires.
func StreamMaxAge(configured, w, duplicates time.Duration) time.Duration {
	if configured > 0 {
		return max(configured, duplicates)
	}
	return max(DefaultStreamMaxAge, 2*w, duplicates)
}

// StreamToCreate is one stream the stage creates when it is missing.
type StreamToCreate struct {
	// Field is the configuration section naming the stream, e.g.
	// "input" (its name is <field>.stream).
	Field string
	// Config is what the stage asks JetStream for.
	Config jetstream.StreamConfig
	// MaxAgeComputed is true when Config.MaxAge was computed, not
	// configured.
	MaxAgeComputed bool
}

// DefaultServerMaxConsumers is the consumers nats-server (2.15 on)
// allows a stream that sets no limit of its own (its
// jetstream.limits.default_max_consumers).
const DefaultServerMaxConsumers = 1000

// StreamMaxConsumers is the max_consumers the stage gives each stream it
// creates with partitions partitions: the server's default for everyone
// else's consumers (operators, analyze, redrive), plus the stage's own
// (stageConsumers), which a stream that sets no limit would otherwise
// share with them.
func StreamMaxConsumers(partitions int) int {
	return DefaultServerMaxConsumers + stageConsumers(partitions)
}

// stageConsumers is how many consumers the stage may hold at once on one
// of its streams with partitions partitions, five per partition: a group
// holds one member consumer per partition on the stream it pulls from,
// and on the output stream each partition may have a restore reader at a
// takeover and one per warm standby (at most 4) at once.
func stageConsumers(partitions int) int { return 5 * partitions }

// minConsumers is the fewest consumers a stream that exists must allow:
// the stage's own and 100 for whoever else reads it.
func minConsumers(partitions int) int { return stageConsumers(partitions) + 100 }

// StreamsToCreate returns the input, output and dead-letter streams with
// the settings and limits the stage creates them with when they are missing
// (see StreamMaxAge; max_bytes is unlimited unless configured). A full input
// stream refuses new messages (discard new) so that nothing is dropped
// before it is judged; full output and dead-letter streams drop their
// oldest messages. `dedupe-stage check-config` prints these.
func StreamsToCreate(cfg config.Config) ([]StreamToCreate, error) {
	w, err := cfg.Window.Derive()
	if err != nil {
		return nil, fmt.Errorf("window: %w", err)
	}
	stream := func(field, name string, subjects []string, dup time.Duration, l config.StreamLimits, discard jetstream.DiscardPolicy) StreamToCreate {
		maxBytes := int64(l.MaxBytes)
		if maxBytes == 0 {
			maxBytes = -1
		}
		return StreamToCreate{
			Field: field,
			Config: jetstream.StreamConfig{
				Name:       name,
				Subjects:   subjects,
				Storage:    jetstream.FileStorage,
				Duplicates: dup,
				MaxAge:     StreamMaxAge(l.MaxAge.D(), w.W, dup),
				MaxBytes:   maxBytes,
				Discard:    discard,
				// What the server's default (1,000) would not leave a
				// group of a thousand partitions.
				MaxConsumers: StreamMaxConsumers(cfg.State.Partitions),
			},
			MaxAgeComputed: l.MaxAge == 0,
		}
	}
	out := stream("output", cfg.Output.Stream, cfg.OutputStreamSubjects(), cfg.OutputDuplicateWindow(), cfg.Output.Limits, jetstream.DiscardOld)
	dl := stream("dead_letter", cfg.DeadLetter.Stream, cfg.DeadLetterStreamSubjects(), 0, cfg.DeadLetter.Limits, jetstream.DiscardOld)
	// The stage may publish its output and its dead letters as atomic
	// batches (output.publish).
	out.Config.AllowAtomicPublish = true
	dl.Config.AllowAtomicPublish = true
	streams := []StreamToCreate{
		stream("input", cfg.Input.Stream, cfg.Input.Subjects, 0, cfg.Input.Limits, jetstream.DiscardNew),
		out,
		dl,
	}
	return sourceFor(cfg).streams(cfg, w, streams)
}

// ensureStreams creates the input, output and dead-letter streams that are
// missing. It never changes a stream that exists.
func ensureStreams(ctx context.Context, js jetstream.JetStream, cfg config.Config, log *slog.Logger) error {
	wanted, err := StreamsToCreate(cfg)
	if err != nil {
		return err
	}
	// The instances of a group starting together all ask at once, and a
	// cluster can leave a request unanswered (a stream another instance
	// has just created has no leader yet, a meta leader steps down before
	// it replies): ensure.Open asks again, for up to
	// streams.SetUpTimeout; a refusal is final.
	ctx, cancel := context.WithTimeout(ctx, streams.SetUpTimeout)
	defer cancel()
	for _, w := range wanted {
		sc := w.Config
		st, created, err := ensure.Open(ctx, fmt.Sprintf("stream %s (%s.stream) on %v", sc.Name, w.Field, sc.Subjects),
			func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, sc.Name) },
			func(ctx context.Context) (jetstream.Stream, error) { return js.CreateStream(ctx, sc) },
			ensure.Options{Logger: log})
		if err != nil {
			return err
		}
		if !created {
			log.Info("stream exists, left as it is", "stream", sc.Name)
			continue
		}
		// What the server applied, which can differ from what was asked
		// (a duplicate window of 0 becomes its default).
		got := st.CachedInfo().Config
		log.Info("stream created", "stream", got.Name, "subjects", got.Subjects, "duplicate_window", got.Duplicates,
			"max_age", got.MaxAge, "max_bytes", got.MaxBytes, "discard", got.Discard.String())
	}
	return nil
}

// checkStreamsExist reports the first of the input, output and dead-letter
// streams that does not exist, saying how to have it created. It is used
// when the stage does not create streams.
func checkStreamsExist(ctx context.Context, js jetstream.JetStream, cfg config.Config) error {
	wanted, err := StreamsToCreate(cfg)
	if err != nil {
		return err
	}
	for _, w := range wanted {
		_, err := js.Stream(ctx, w.Config.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("%w: %s stream %q (%s.stream) does not exist; create it (subjects %v) or start with --create-streams (nats.create_streams: true)",
				ErrStreamMissing, strings.ReplaceAll(w.Field, "_", "-"), w.Config.Name, w.Field, w.Config.Subjects)
		}
		if err != nil {
			return fmt.Errorf("look up %s stream %s (%s.stream): %w", strings.ReplaceAll(w.Field, "_", "-"), w.Config.Name, w.Field, err)
		}
	}
	return nil
}

// warnStreams logs what the streams the stage uses would have
// check-config --connect warn about (streamWarnings): a stream in memory,
// an input stream whose subjects do not cover input.subjects. A stream
// that cannot be read is left to the checks that need it.
func warnStreams(ctx context.Context, js jetstream.JetStream, cfg config.Config, log *slog.Logger) {
	wanted, err := StreamsToCreate(cfg)
	if err != nil {
		return
	}
	have := make(map[string]jetstream.StreamConfig, len(wanted))
	for _, w := range wanted {
		if st, err := js.Stream(ctx, w.Config.Name); err == nil {
			have[w.Config.Name] = st.CachedInfo().Config
		}
	}
	for _, f := range streamWarnings(cfg, wanted, have) {
		log.Warn(f.Message, "check", f.Check, "fix", f.Fix)
	}
}

// ensureConsumer binds to the stage's durable pull consumer, creating it when
// missing (ensure.Open: a lookup or create the cluster leaves unanswered
// for a while, as while a node that just came back catches up, is asked
// again, for up to streams.SetUpTimeout). An existing consumer is used as
// it is.
func ensureConsumer(ctx context.Context, js jetstream.JetStream, cfg config.Input, log *slog.Logger) (jetstream.Consumer, error) {
	ctx, cancel := context.WithTimeout(ctx, streams.SetUpTimeout)
	defer cancel()
	consumerCfg := ConsumerToCreate(cfg)
	c, created, err := ensure.Open(ctx, fmt.Sprintf("consumer %s on stream %s", cfg.Consumer, cfg.Stream),
		func(ctx context.Context) (jetstream.Consumer, error) {
			return js.Consumer(ctx, cfg.Stream, cfg.Consumer)
		}, func(ctx context.Context) (jetstream.Consumer, error) {
			return js.CreateConsumer(ctx, cfg.Stream, consumerCfg)
		}, ensure.Options{Logger: log})
	if err != nil {
		return nil, err
	}
	if created {
		log.Info("consumer created", "stream", cfg.Stream, "consumer", cfg.Consumer, "ack_wait", consumerCfg.AckWait, "max_ack_pending", consumerCfg.MaxAckPending)
	} else {
		log.Info("consumer exists, used as it is", "stream", cfg.Stream, "consumer", cfg.Consumer,
			"ack_wait", c.CachedInfo().Config.AckWait, "max_deliver", c.CachedInfo().Config.MaxDeliver)
	}
	return c, nil
}

// ConsumerToCreate is the durable pull consumer the stage creates on the
// input when it is missing (with scale_out off): the one place its settings
// are made, which the bench's loops drain with too.
func ConsumerToCreate(cfg config.Input) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait.D(),
		MaxAckPending: cfg.MaxAckPending,
		MaxDeliver:    cfg.MaxDeliver,
		FilterSubject: cfg.FilterSubject,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// checkDuplicateWindow compares the output stream's duplicate window with
// the longest redelivery wait after a crash between publish and commit.
func checkDuplicateWindow(ctx context.Context, js jetstream.JetStream, cfg config.Config, consumerCfg jetstream.ConsumerConfig, log *slog.Logger) error {
	st, err := js.Stream(ctx, cfg.Output.Stream)
	if err != nil {
		return fmt.Errorf("output stream %s: %w", cfg.Output.Stream, err)
	}
	have := st.CachedInfo().Config.Duplicates
	need := streams.RequiredDuplicateWindow(consumerCfg.AckWait, consumerCfg.BackOff, cfg.Output.RestartMargin.D())
	if have >= need {
		log.Info("output duplicate window covers a crash between publish and commit", "stream", cfg.Output.Stream, "duplicate_window", have, "required", need)
		return nil
	}
	// The fix asks for the window the stage creates the stream with, which
	// leaves a margin over the bare requirement.
	fix := fmt.Sprintf("nats stream edit %s --dupe-window %v --force", cfg.Output.Stream, max(need, cfg.OutputDuplicateWindow()))
	err = finding.WithFix(fmt.Errorf("%w: stream %s keeps ids %v, but a copy can come back %v after a crash (ack_wait %v, backoff %v, restart_margin %v); "+
		"run %s, lower input.ack_wait, or set output.allow_short_duplicate_window",
		ErrDuplicateWindow, cfg.Output.Stream, have, need, consumerCfg.AckWait, consumerCfg.BackOff, cfg.Output.RestartMargin.D(), fix), fix)
	if cfg.Output.AllowShortDuplicateWindow {
		log.Warn("RUNNING WITH A SHORT DUPLICATE WINDOW: a crash between publish and commit can forward a message twice", "err", err)
		return nil
	}
	return err
}

// deadLetterPublish decides whether dead letters are published as atomic
// batches (config.Config.SideStreamAtomic), from the dead-letter stream's
// AllowAtomicPublish.
func deadLetterPublish(ctx context.Context, js jetstream.JetStream, cfg config.Config, log *slog.Logger) (bool, error) {
	st, err := js.Stream(ctx, cfg.DeadLetter.Stream)
	if err != nil {
		return false, fmt.Errorf("dead-letter stream %s: %w", cfg.DeadLetter.Stream, err)
	}
	allowed := st.CachedInfo().Config.AllowAtomicPublish
	atomic := cfg.SideStreamAtomic(allowed)
	log.Info("dead letters published together", "stream", cfg.DeadLetter.Stream, "atomic_batches", atomic,
		"stream_allows_atomic_publish", allowed, "publish", cfg.Output.Publish)
	return atomic, nil
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
		fix := "nats stream edit " + cfg.Output.Stream + " --allow-batch --force"
		return false, finding.WithFix(fmt.Errorf("%w: stream %s has AllowAtomicPublish off; allow it (%s) or set output.publish to async or auto",
			err, cfg.Output.Stream, fix), fix)
	}
	if atomic {
		log.Info("output published as atomic batches", "stream", cfg.Output.Stream, "publish", cfg.Output.Publish,
			"batch_max", cfg.Output.BatchMax, "atomic_min_batch", cfg.Output.AtomicMinBatch, "max_batches_in_flight", cfg.Output.MaxBatchesInFlight)
	} else {
		log.Info("output published one message at a time", "stream", cfg.Output.Stream, "publish", cfg.Output.Publish,
			"stream_allows_atomic_publish", allowed, "embedded_sync_always", cfg.KnownToSyncEveryWrite())
	}
	return atomic, nil
}
