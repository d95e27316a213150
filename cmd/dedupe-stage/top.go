package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dedupe-stage/dedupe-stage/internal/top"
)

// topFlags are top's own flags.
type topFlags struct {
	interval time.Duration
	timeout  time.Duration
	subject  string
	sort     string
	once     bool
}

// topConfigFlags are the configuration flags top takes: inspect's and
// forget's, less --http-addr (top asks over NATS only).
var topConfigFlags = slices.DeleteFunc(slices.Clone(adminFlags), func(n string) bool { return n == "http-addr" })

// Bounds of --interval.
const (
	minTopInterval = 200 * time.Millisecond
	defTopInterval = time.Second
	defTopTimeout  = 500 * time.Millisecond
)

// newTopFlagSet returns the flag set of top's own flags, writing into f.
func newTopFlagSet(f *topFlags, out io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("top", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(out)
	fs.DurationVar(&f.interval, "interval", defTopInterval, "time between refreshes; with --once, between the two samples a rate needs")
	fs.BoolVar(&f.once, "once", false, "print one frame as plain text (colours only on a terminal without NO_COLOR) and exit")
	fs.StringVar(&f.sort, "sort", "name", "column to sort by: "+strings.Join(top.ColumnNames(), ", ")+" (all but name descending)")
	fs.StringVar(&f.subject, "admin-subject", "", "the admin service's subject prefix (admin.subject; default dedupe.admin.<consumer or group>)")
	fs.DurationVar(&f.timeout, "timeout", defTopTimeout, "how long each refresh waits for the instances' answers")
	return fs
}

func (c *cli) newTopCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "top [flags]",
		Short: "Watch each instance and partition live: rate, repeats, p99 age against W, dead letters, backlog",
		Long: `Watch the stage or its whole group live, from any machine that reaches its NATS servers:
every instance's admin service answers with its counts, and top shows, per instance and per
partition, the rate (messages judged per second between two refreshes), the share of repeats,
the 99th percentile of repeat ages against W, dead letters by reason, the backlog, the owner,
restore progress and the NATS connection. Keys change the sort column (s, S, 1-7, r) and quit (q).
--once prints one plain frame for scripts: it takes two samples --interval apart for the rates.
NO_COLOR turns the colours off.`,
		Example: `  dedupe-stage top --context prod --config group.yaml
  dedupe-stage top -s nats://127.0.0.1:4222 --scale-out-group orders --sort rate
  NO_COLOR=1 dedupe-stage top --context prod --config stage.yaml --once`,
		Args: noPositional,
		RunE: func(*cobra.Command, []string) error { return topCmd(c.raw, c.stdout, c.stderr) },
	}
	var f topFlags
	cmd.Flags().AddFlagSet(newTopFlagSet(&f, c.stderr))
	ownGroup(cmd.Flags())
	_ = cmd.RegisterFlagCompletionFunc("sort", fixedCompletion(top.ColumnNames()...))
	addConfigFlags(cmd, topConfigFlags, nil)
	return cmd
}

// topCmd shows the instances' status answers live (internal/top), or with
// --once prints one frame.
func topCmd(args []string, stdout, stderr io.Writer) (err error) {
	var f topFlags
	l, err := loadWithOwnFlags("top", newTopFlagSet(&f, stderr), args, topConfigFlags, false, stderr)
	if err != nil {
		return err
	}
	col, ok := top.ParseColumn(f.sort)
	switch {
	case !ok:
		return &exitError{exitUsage, fmt.Errorf("--sort %q: want one of %s", f.sort, strings.Join(top.ColumnNames(), ", "))}
	case f.interval < minTopInterval:
		return &exitError{exitUsage, fmt.Errorf("--interval %s: want at least %s", f.interval, minTopInterval)}
	case f.timeout <= 0:
		return &exitError{exitUsage, fmt.Errorf("--timeout %s: want a positive duration", f.timeout)}
	}
	cfg := l.cfg
	if cfg.Admin.Disabled {
		return errors.New("top asks the stage's admin service, and admin.disabled is true")
	}
	red := cfg.Redactor()
	defer func() { err = red.Error(err) }()
	c, err := dialAdmin(cfg, adminOwn{subject: f.subject, timeout: f.timeout}, stderr)
	if err != nil {
		return err
	}
	defer c.Conn.Close()
	h := top.Header{Subject: c.Subject, Interval: f.interval}
	s := top.Sort{By: col, Desc: col != top.ByName}
	terminal := isTerminal(stdout)
	st := top.NewStyles(stdout, top.Colour(os.Getenv, terminal))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if f.once {
		out, _, err := top.Once(ctx, c.Status, h, s, st)
		if err != nil {
			return err
		}
		_, err = io.WriteString(stdout, out)
		return err
	}
	if !terminal {
		return &exitError{exitUsage, errors.New("top shows a live view on a terminal; give --once to print one frame")}
	}
	p := tea.NewProgram(top.NewModel(c.Status, h, s, st), tea.WithOutput(stdout), tea.WithAltScreen(), tea.WithContext(ctx))
	if _, err := p.Run(); err != nil && !errors.Is(err, tea.ErrProgramKilled) {
		return fmt.Errorf("top: %w", err)
	}
	return nil
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}
