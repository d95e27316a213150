package stage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/finding"
)

// Check runs against the server every check New makes before it opens the
// store (the streams, the consumer, the output's duplicate window and
// atomic publish, and with scale-out the group's checks), and returns
// every finding instead of stopping at the first. It only reads: it
// creates and changes no stream, consumer or bucket, and where New would
// create one, the finding (finding.Info) says what it would create.
// `dedupe-stage check-config --connect` prints the findings.
func Check(ctx context.Context, js jetstream.JetStream, cfg config.Config) ([]finding.Finding, error) {
	w, err := cfg.Window.Derive()
	if err != nil {
		return nil, fmt.Errorf("window: %w", err)
	}
	wanted, err := StreamsToCreate(cfg)
	if err != nil {
		return nil, err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var fs []finding.Finding
	add := func(check string, sev finding.Severity, err error) {
		fs = append(fs, finding.FromError(check, sev, err))
	}

	found := make(map[string]jetstream.Stream)
	for _, s := range wanted {
		sc := s.Config
		kind := strings.ReplaceAll(s.Field, "_", "-")
		st, err := js.Stream(ctx, sc.Name)
		switch {
		case err == nil:
			found[sc.Name] = st
		case !errors.Is(err, jetstream.ErrStreamNotFound):
			add("stream", finding.Error, fmt.Errorf("look up %s stream %s (%s.stream): %w", kind, sc.Name, s.Field, err))
		case cfg.NATS.ShouldCreateStreams():
			fs = append(fs, finding.Finding{Check: "stream", Severity: finding.Info,
				Message: fmt.Sprintf("%s stream %s (%s.stream) does not exist; run creates it (subjects %v)", kind, sc.Name, s.Field, sc.Subjects)})
		default:
			fix := natsStreamAdd(sc)
			fs = append(fs, finding.Finding{Check: "stream", Severity: finding.Error, Fix: fix,
				Message: fmt.Sprintf("%v: %s stream %s (%s.stream) does not exist on the server; create it as run would (the fix), "+
					"or start with --create-streams (nats.create_streams: true) to have run create it", ErrStreamMissing, kind, sc.Name, s.Field)})
		}
	}

	src := sourceFor(cfg)
	consumerCfg, cfs := src.checkConsumer(ctx, found[cfg.Input.Stream])
	fs = append(fs, cfs...)

	atomic := true // a stream run creates allows atomic publish
	if _, ok := found[cfg.Output.Stream]; ok {
		strict := cfg
		strict.Output.AllowShortDuplicateWindow = false
		if err := checkDuplicateWindow(ctx, js, strict, consumerCfg, quiet); err != nil {
			sev := finding.Error
			if cfg.Output.AllowShortDuplicateWindow {
				sev = finding.Warning // run starts, and logs it
			}
			add("duplicate_window", sev, err)
		}
		if atomic, err = outputPublish(ctx, js, cfg, quiet); err != nil {
			add("atomic_publish", finding.Error, err)
		}
	}
	fs = append(fs, src.check(ctx, js, w, atomic)...)
	return fs, nil
}

// memberConsumer is what the stage knows of its consumer before it binds
// one: input's ack_wait and max_deliver. With scale-out, the group's
// member consumers are made with them when Run joins the group.
func memberConsumer(cfg config.Input) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{AckWait: cfg.AckWait.D(), MaxDeliver: cfg.MaxDeliver}
}

// natsStreamAdd is the nats command that creates the stream sc as the
// stage would.
func natsStreamAdd(sc jetstream.StreamConfig) string {
	args := []string{"nats stream add", sc.Name, "--subjects", "'" + strings.Join(sc.Subjects, ",") + "'",
		"--storage", "file", "--retention", retentionFlag(sc.Retention), "--discard", discardFlag(sc.Discard),
		"--max-age", sc.MaxAge.String(), fmt.Sprintf("--max-bytes=%d", sc.MaxBytes)}
	if sc.Duplicates > 0 {
		args = append(args, "--dupe-window", sc.Duplicates.String())
	}
	if sc.Replicas > 1 {
		args = append(args, "--replicas", fmt.Sprint(sc.Replicas))
	}
	if sc.AllowAtomicPublish {
		args = append(args, "--allow-batch")
	}
	if tr := sc.SubjectTransform; tr != nil {
		args = append(args, "--transform-source", "'"+tr.Source+"'", "--transform-destination", "'"+tr.Destination+"'")
	}
	return strings.Join(append(args, "--defaults"), " ")
}

// retentionFlag is the value of nats stream add --retention for r.
func retentionFlag(r jetstream.RetentionPolicy) string {
	switch r {
	case jetstream.WorkQueuePolicy:
		return "work"
	case jetstream.InterestPolicy:
		return "interest"
	default:
		return "limits"
	}
}

// discardFlag is the value of nats stream add --discard for d.
func discardFlag(d jetstream.DiscardPolicy) string {
	if d == jetstream.DiscardNew {
		return "new"
	}
	return "old"
}
