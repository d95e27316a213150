package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/history"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// analyzeFlags are analyze's own flags.
type analyzeFlags struct {
	since   time.Time
	from    uint64
	json    bool
	slowest int
	tempDir string
}

// newAnalyzeFlagSet returns the flag set of analyze's own flags, writing into f.
func newAnalyzeFlagSet(f *analyzeFlags, out io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("analyze", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(out)
	fs.Func("since", "read the messages stored at or after this time: RFC 3339, or a duration ago (7d) (default the whole stream)", timeFlag(&f.since))
	fs.Uint64Var(&f.from, "from-seq", 0, "first sequence of the input stream to read (default its first)")
	fs.BoolVar(&f.json, "json", false, "print the report as JSON for scripts")
	fs.IntVar(&f.slowest, "slowest", 10, "how many of the slowest repeats to list")
	fs.StringVar(&f.tempDir, "temp-dir", "", "where the temporary key store goes, removed at the end (default the system's temporary directory)")
	return fs
}

// analyzeShows are the configuration flags analyze's help lists.
var analyzeShows = append(flagSet{"key-header", "input-stream", "log-level"}, connFlags...)

func (c *cli) newAnalyzeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "analyze [flags]",
		Short: "Measure the window from the input stream's history",
		Long: `Read the input stream's history, read only (an ordered consumer; no durable consumer, nothing
written, the data dir untouched), judge each message's key, scope and version as run does, and
report: messages, distinct keys, repeats, the dead letters run would make, the ages of the
repeats by the input's clock, the slowest repeats, and for the configured W and other windows how
many repeats each would forward again and the filter, memory and disk it needs.`,
		Example: `  dedupe-stage analyze --context prod --config stage.yaml --since 7d
  dedupe-stage analyze -s nats://127.0.0.1:4222 --key-header Order-Id --from-seq 1000000 --json`,
		Args: noPositional,
		RunE: func(*cobra.Command, []string) error { return analyzeCmd(c.raw, c.stdout, c.stderr) },
	}
	var f analyzeFlags
	cmd.Flags().AddFlagSet(newAnalyzeFlagSet(&f, c.stderr))
	ownGroup(cmd.Flags())
	addConfigFlags(cmd, nil, analyzeShows)
	return cmd
}

// analyzeCmd reads the input's history (internal/history) through the
// connection run would use, judging keys with run's key functions, and
// prints the report.
func analyzeCmd(args []string, stdout, stderr io.Writer) (err error) {
	var f analyzeFlags
	l, err := loadWithOwnFlags("analyze", newAnalyzeFlagSet(&f, stderr), args, nil, false, stderr)
	if err != nil {
		return err
	}
	if f.from > 0 && !f.since.IsZero() {
		return &exitError{exitUsage, fmt.Errorf("give --since or --from-seq, not both")}
	}
	cfg := l.cfg
	red := cfg.Redactor()
	defer func() { err = red.Error(err) }()
	o, err := analyzeOptions(cfg)
	if err != nil {
		return err
	}
	o.FromSeq, o.Since, o.Slowest, o.TempDir = f.from, f.since, f.slowest, f.tempDir
	if cfg.Totals.Enabled {
		fmt.Fprintln(stderr, "dedupe-stage: totals are on; analyze does not judge their group, time and value, so their dead letters are not counted")
	}
	cctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	nc, js, err := connectServer(cctx, cfg, "analyze reads the input stream from a server", stderr)
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if isTerminal(stderr) && !f.json {
		bar := &progressBar{w: stderr}
		o.Progress = bar.show
		defer bar.clear()
	}
	rep, err := history.Run(ctx, js, o)
	if err != nil {
		return err
	}
	if f.json {
		return printJSON(stdout, rep)
	}
	history.WriteText(stdout, rep)
	return nil
}

// analyzeOptions are the options of history.Run for cfg: run's key and
// version functions, its size limit, its window and the candidates.
func analyzeOptions(cfg config.Config) (history.Options, error) {
	w, err := cfg.Window.Derive()
	if err != nil {
		return history.Options{}, fmt.Errorf("window: %w", err)
	}
	keyFn, err := keys.NewKeyFunc(cfg.Key)
	if err != nil {
		return history.Options{}, fmt.Errorf("key: %w", err)
	}
	var version *keys.Versioner
	if cfg.Key.Version.Enabled() {
		if version, err = keys.NewVersioner(cfg.Key.Version); err != nil {
			return history.Options{}, fmt.Errorf("key.version: %w", err)
		}
	}
	limit := int(cfg.Pipeline.MaxMessageBytes)
	judge := func(subject string, hdr nats.Header, data []byte) history.Verdict {
		if len(data) > limit {
			return history.Verdict{Reason: string(deadletter.ReasonOversized),
				Detail: fmt.Sprintf("payload is %d bytes, pipeline.max_message_bytes is %d", len(data), limit)}
		}
		key, err := keyFn.Key(subject, hdr, data)
		if err != nil {
			reason, detail := deadletter.KeyReason(err, deadletter.ReasonNoKey)
			return history.Verdict{Reason: string(reason), Detail: detail}
		}
		v := history.Verdict{Key: key}
		if version != nil {
			if v.Version, err = version.Version(subject, hdr, data); err != nil {
				reason, detail := deadletter.KeyReason(err, deadletter.ReasonBadVersion)
				return history.Verdict{Key: key, Reason: string(reason), Detail: detail}
			}
			v.Versioned = true
		}
		return v
	}
	cands := make([]history.Candidate, 0, len(w.Paths)+2)
	for _, p := range w.Paths {
		cands = append(cands, history.Candidate{Name: "path " + p.Name, W: p.Max + w.Margin})
	}
	cands = append(cands, history.Candidate{Name: "half W", W: w.W / 2}, history.Candidate{Name: "twice W", W: 2 * w.W})
	return history.Options{
		Stream: cfg.Input.Stream, FilterSubject: cfg.Input.FilterSubject, Judge: judge,
		Refresh: cfg.Window.RefreshOnRepeat, MismatchIsRepeat: cfg.Pipeline.OnFingerprintMismatch == config.FingerprintRepeat,
		W: w.W, Candidates: cands,
		Size: func(w time.Duration, keysPerSecond, keyBytes float64) history.Sizing {
			s, err := cfg.SizeWindow(w, keysPerSecond, keyBytes)
			out := history.Sizing{ExpectedKeys: s.ExpectedKeys, FilterBytes: s.FilterBytes, MemoryBytes: s.MemoryBytes, DiskBytes: s.DiskBytes}
			if err != nil {
				out.Error = err.Error()
			}
			return out
		},
	}, nil
}

// progressBar draws analyze's progress on one terminal line, at most five
// times a second.
type progressBar struct {
	w     io.Writer
	last  time.Time
	drawn bool
}

func (p *progressBar) show(done, total uint64) {
	if now := time.Now(); now.Sub(p.last) >= 200*time.Millisecond || done == total {
		p.last = now
		const width = 30
		n := int(done * width / max(total, 1))
		fmt.Fprintf(p.w, "\r[%-*s] %s of %s messages", width, strings.Repeat("#", n), history.Count(done), history.Count(total))
		p.drawn = true
	}
}

func (p *progressBar) clear() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
