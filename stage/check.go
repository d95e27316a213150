package stage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/boot"
	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// Check runs every check that `dedupe-stage run` makes at start, against
// the server and the data dir, and returns every finding instead of
// stopping at the first: the streams, the consumer, the output's duplicate
// window and atomic publish, with scale-out the group's checks, the totals
// sinks, and the data dir (boot.LockDataDir's checks, and the partition
// count, placement and key the store was made with); and what run warns
// about (a stream in memory, an input stream whose subjects do not cover
// input.subjects). It only reads: it creates and changes no stream,
// consumer, bucket, table or file, and where run would create one, the
// finding (finding.Info) says what it would create.
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
	have := make(map[string]jetstream.StreamConfig, len(found))
	for name, st := range found {
		have[name] = st.CachedInfo().Config
	}
	fs = append(fs, streamWarnings(cfg, wanted, have)...)
	fs = append(fs, checkSinks(ctx, js, cfg)...)
	dirFindings, running := checkDataDir(cfg, w)
	fs = append(fs, dirFindings...)
	fs = append(fs, checkListen(cfg.HTTP, running)...)
	return fs, nil
}

// checkListen returns a finding for each address of the HTTP endpoints
// run cannot listen on now: an error, or a warning when running says that
// a stage runs on the data dir (and so, likely, holds the address).
func checkListen(cfg config.HTTP, running bool) []finding.Finding {
	var fs []finding.Finding
	addrs := map[string]string{"http.addr": cfg.Addr}
	if in := cfg.InspectOn(); in != "" && in != cfg.Addr {
		addrs["http.inspect_addr"] = in
	}
	for _, field := range []string{"http.addr", "http.inspect_addr"} {
		addr := addrs[field]
		if addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			_ = ln.Close()
			continue
		}
		sev, why := finding.Error, "run refuses to start"
		if running {
			sev, why = finding.Warning, "the stage that holds the data dir likely listens there; run refuses to start while it does"
		}
		fs = append(fs, finding.FromError("http_addr", sev, fmt.Errorf("%s %s: %w: %s", field, addr, err, why)))
	}
	return fs
}

// streamWarnings returns what run warns about the existing streams it
// uses (have, by name; wanted as StreamsToCreate returns them): a stream
// kept in memory, which a server restart empties although the stage needs
// what it holds afterwards (the input not yet judged, the output it reads
// back and restores from, the dead letters to redrive), and an input
// stream whose subjects do not cover input.subjects, so that what
// producers publish there as configured is not stored in it.
func streamWarnings(cfg config.Config, wanted []StreamToCreate, have map[string]jetstream.StreamConfig) []finding.Finding {
	var fs []finding.Finding
	for _, w := range wanted {
		sc, ok := have[w.Config.Name]
		if !ok {
			continue
		}
		if sc.Storage == jetstream.MemoryStorage {
			fs = append(fs, finding.Finding{Check: "storage", Severity: finding.Warning,
				Message: fmt.Sprintf("%s stream %s (%s.stream) is kept in memory: a restart of its server empties it, and the stage needs what it holds afterwards; "+
					"JetStream cannot change a stream's storage: recreate it with file storage (the fix: back up, delete, add)",
					strings.ReplaceAll(w.Field, "_", "-"), sc.Name, w.Field),
				Fix: fmt.Sprintf("nats stream backup %s ./%s-backup && nats stream rm %s -f && %s", sc.Name, sc.Name, sc.Name, natsStreamAdd(w.Config))})
		}
		if f, ok := maxConsumersWarning(cfg, w, sc); ok {
			fs = append(fs, f)
		}
	}
	in, ok := have[cfg.Input.Stream]
	if !ok {
		return fs
	}
	var uncovered []string
	for _, subj := range cfg.Input.Subjects {
		if !slices.ContainsFunc(in.Subjects, func(t string) bool { return server.SubjectMatchesFilter(subj, t) }) {
			uncovered = append(uncovered, subj)
		}
	}
	if len(uncovered) > 0 {
		fs = append(fs, finding.Finding{Check: "input_subjects", Severity: finding.Warning,
			Message: fmt.Sprintf("input stream %s stores subjects %v, which do not cover input.subjects %v (not %v): what is published there as configured is not stored in it. "+
				"Add them to the stream (the fix), or set input.subjects to what the stream stores",
				in.Name, in.Subjects, cfg.Input.Subjects, uncovered),
			Fix: fmt.Sprintf("nats stream edit %s --subjects '%s' --force", in.Name, strings.Join(append(slices.Clone(in.Subjects), uncovered...), ","))})
	}
	return fs
}

// maxConsumersWarning warns when sc, the stream w names as it exists,
// allows fewer consumers than the stage may hold on it at once with its
// partitions (minConsumers): a stream that sets no limit gets the
// server's default of 1,000 (nats-server 2.15 on), which a group of a
// thousand partitions fills with its own member consumers and restore
// readers, after which a takeover cannot start. The fix gives it what
// the stage creates its streams with (StreamMaxConsumers).
func maxConsumersWarning(cfg config.Config, w StreamToCreate, sc jetstream.StreamConfig) (finding.Finding, bool) {
	want, have := w.Config.MaxConsumers, sc.MaxConsumers
	what := fmt.Sprintf("max_consumers %d", have)
	if have <= 0 {
		have, what = DefaultServerMaxConsumers, fmt.Sprintf("no max_consumers of its own (the server's default, %d since nats-server 2.15)", DefaultServerMaxConsumers)
	}
	if have >= minConsumers(cfg.State.Partitions) {
		return finding.Finding{}, false
	}
	return finding.Finding{Check: "max_consumers", Severity: finding.Warning,
		Message: fmt.Sprintf("%s stream %s (%s.stream) has %s, fewer than the %d consumers the stage may hold on it with %d partitions (one per partition to pull, readers at takeovers and for warm standbys, and 100 for others); "+
			"past the limit a partition's member or restore cannot start. Raise it to what the stage creates its streams with, %d",
			strings.ReplaceAll(w.Field, "_", "-"), sc.Name, w.Field, what, minConsumers(cfg.State.Partitions), cfg.State.Partitions, want),
		Fix: fmt.Sprintf("nats stream edit %s --max-consumers %d --force", sc.Name, want)}, true
}

// checkDataDir returns the findings on the data dir run would use, as
// this host sees it: what boot.LockDataDir refuses (a dir that cannot be
// written: an error; one another process holds, as a running stage does:
// a warning, since run starts once it stops, and running is true), and
// what the store refuses to open (another partition count, placement or
// partition key: state.ErrLayout).
func checkDataDir(cfg config.Config, w window.Window) (fs []finding.Finding, running bool) {
	dir := cfg.State.DataDir
	err := boot.CheckDataDir(dir)
	switch {
	case errors.Is(err, boot.ErrInUse):
		running = true
		fs = append(fs, finding.FromError("data_dir", finding.Warning,
			fmt.Errorf("%w; run refuses to start on it while that process runs", err)))
	case err != nil:
		return []finding.Finding{finding.FromError("data_dir", finding.Error, err)}, false
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return []finding.Finding{{Check: "data_dir", Severity: finding.Info,
			Message: fmt.Sprintf("data dir %s (state.data_dir) does not exist on this host; run creates it", dir)}}, false
	}
	so := cfg.StateOptions(w)
	if err := state.VerifyRouting(so.Dir, so.Partitions, cfg.Routing()); err != nil {
		return append(fs, finding.FromError("data_dir", finding.Error, err)), running
	}
	if err := state.VerifyLayout(so.Dir, so.Partitions, so.Partitioning); err != nil {
		return append(fs, finding.FromError("data_dir", finding.Error, layoutRefusal(err))), running
	}
	return fs, running
}

// layoutRefusal is the error run gives for err, the store's refusal to
// open a data dir made with another partition count or placement: with
// what to do.
func layoutRefusal(err error) error {
	if !errors.Is(err, state.ErrLayout) {
		return fmt.Errorf("state: %w", err)
	}
	return fmt.Errorf("%w; set state.partitions (--partitions) back to the data dir's count, or start on a new, empty data dir "+
		"(state.data_dir, --data-dir): see configs/README.md, \"Changing the partition count\"", err)
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
	if sc.MaxConsumers > 0 {
		args = append(args, "--max-consumers", fmt.Sprint(sc.MaxConsumers))
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
