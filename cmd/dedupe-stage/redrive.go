package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/redrive"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// redriveFlags are redrive's own flags, taken out of the arguments before
// the configuration's flags are parsed.
type redriveFlags struct {
	reasons      []deadletter.Reason
	since, until time.Time
	from, to     uint64
	limit        int
	dryRun, json bool
	force        bool
	bucket       string
}

// newRedriveFlagSet returns the flag set of redrive's own flags, writing into f.
func newRedriveFlagSet(f *redriveFlags, out io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("redrive", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(out)
	fs.Func("reason", "redrive dead letters of this reason (repeatable, or comma-separated; default every reason)", func(s string) error {
		for _, name := range strings.Split(s, ",") {
			r, err := deadletter.ParseReason(strings.TrimSpace(name))
			if err != nil {
				return err
			}
			f.reasons = append(f.reasons, r)
		}
		return nil
	})
	fs.Func("since", "dead letters stored at or after this time: RFC 3339, or a duration ago (2h)", timeFlag(&f.since))
	fs.Func("until", "dead letters stored at or before this time: RFC 3339, or a duration ago (30m)", timeFlag(&f.until))
	fs.Uint64Var(&f.from, "from-seq", 0, "first sequence of the dead-letter stream to read (default its first)")
	fs.Uint64Var(&f.to, "to-seq", 0, "last sequence of the dead-letter stream to read (default its last when the run starts)")
	fs.IntVar(&f.limit, "limit", 0, "publish at most this many copies, then stop; a next run goes on (default no limit)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "list what would be republished or refused; publish nothing, write no mark")
	fs.BoolVar(&f.json, "json", false, "print the summary and each dead letter's result as JSON")
	fs.BoolVar(&f.force, "force", false, "also republish dead letters whose reason lies in the input (no_key, bad_payload, oversized, ...) and copies dead-lettered again for the same reason; once, after a configuration change that accepts them")
	fs.StringVar(&f.bucket, "progress-bucket", redrive.DefaultBucket, "key-value bucket of the marks of the dead letters already republished")
	return fs
}

// timeFlag parses an RFC 3339 time or a duration before now (days as
// 7d allowed) into t.
func timeFlag(t *time.Time) func(string) error {
	return func(s string) error {
		if d, err := config.ParseDuration(s); err == nil {
			*t = time.Now().Add(-d.D())
			return nil
		}
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return fmt.Errorf("%q is neither an RFC 3339 time (2026-03-01T12:00:00Z) nor a duration (2h, 7d)", s)
		}
		*t = v
		return nil
	}
}

// redriveMain runs redriveCmd and returns its exit code: 0 every selected
// dead letter is republished (or was before) or skipped, 1 some were
// refused or the run stopped, 2 usage, 3 the server cannot be reached.
func redriveMain(args []string, stdout, stderr io.Writer) int {
	err := redriveCmd(args, stdout, stderr)
	if err == nil {
		return 0
	}
	code := exitFindings
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	fmt.Fprintln(stderr, "dedupe-stage:", err)
	return code
}

// errRefused is redrive's error when some dead letters were refused.
var errRefused = errors.New("some dead letters were refused; their reasons are above")

// redriveCmd publishes the selected dead letters again to the input
// subjects they came from (internal/redrive), through the connection run
// would use, and prints what it did.
func redriveCmd(args []string, stdout, stderr io.Writer) (err error) {
	var f redriveFlags
	l, err := loadWithOwnFlags("redrive", newRedriveFlagSet(&f, stderr), args, nil, false, stderr)
	if err != nil {
		return err
	}
	cfg := l.cfg
	red := cfg.Redactor()
	defer func() { err = red.Error(err) }()
	o := redrive.Options{Stream: cfg.DeadLetter.Stream, Subject: cfg.DeadLetter.Subject, Reasons: f.reasons,
		FromSeq: f.from, ToSeq: f.to, Since: f.since, Until: f.until, Limit: f.limit, DryRun: f.dryRun, Force: f.force,
		Bucket: f.bucket, KeyFromMsgID: keyFromMsgID(cfg)}
	if err := o.Validate(); err != nil {
		return &exitError{exitUsage, err}
	}
	cctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	nc, js, err := connectServer(cctx, cfg, "redrive publishes through a server", stderr)
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if !f.json {
		o.OnResult = func(r redrive.Result) { fmt.Fprintln(stdout, describeResult(r)) }
	}
	sum, runErr := redrive.Run(ctx, js, o)
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sum); err != nil {
			return err
		}
	} else {
		fmt.Fprint(stdout, describeSummary(sum))
	}
	if ctx.Err() != nil && runErr != nil {
		return fmt.Errorf("interrupted; a next run goes on after the last dead letter republished: %w", runErr)
	}
	if runErr != nil {
		return runErr
	}
	if sum.RefusedCount() > 0 {
		return errRefused
	}
	return nil
}

// keyFromMsgID reports whether the stage reads its key or its scope from the Nats-Msg-Id header.
func keyFromMsgID(cfg config.Config) bool {
	for _, s := range []keys.FieldSpec{cfg.Key.Field, cfg.Key.Scope} {
		if s.Source == keys.SourceHeader && strings.EqualFold(s.Header, jetstream.MsgIDHeader) {
			return true
		}
	}
	return false
}

// describeResult is one line of redrive's text output.
func describeResult(r redrive.Result) string {
	line := fmt.Sprintf("seq %d  %s  %s  ", r.Seq, r.Reason, r.Subject)
	switch r.Outcome {
	case redrive.Republished:
		line += fmt.Sprintf("republished as %s %d", r.Stream, r.StreamSeq)
	case redrive.WouldRepublish:
		line += "would be republished to stream " + r.Stream
	case redrive.AlreadyRedriven:
		line += fmt.Sprintf("already republished as %s %d", r.Stream, r.StreamSeq)
	case redrive.Refused:
		line += fmt.Sprintf("refused %s", r.Refusal)
	case redrive.Skipped:
		line += fmt.Sprintf("skipped %s", r.Skip)
	}
	if r.Detail != "" {
		line += ": " + r.Detail
	}
	return line
}

// counts is " (a 1, b 2)" for the non-empty counts by name, "" for none.
func counts[K ~string](by map[K]int) string {
	var parts []string
	for k, c := range by {
		if c > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, c))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	slices.Sort(parts)
	return " (" + strings.Join(parts, ", ") + ")"
}

// describeSummary is the end of redrive's text output.
func describeSummary(s redrive.Summary) string {
	var b strings.Builder
	verb := "republished"
	if s.DryRun {
		verb = "would republish"
	}
	fmt.Fprintf(&b, "%s sequences %d to %d: selected %d, %s %d, already republished %d, refused %d",
		s.Stream, s.FromSeq, s.ToSeq, s.Selected, verb, s.Republished, s.AlreadyRedriven, s.RefusedCount())
	b.WriteString(counts(s.Refused))
	if n := s.SkippedCount(); n > 0 {
		fmt.Fprintf(&b, ", skipped %d%s", n, counts(s.Skipped))
	}
	b.WriteString("\n")
	if s.LimitReached {
		fmt.Fprintf(&b, "limit reached; run again to go on from sequence %d\n", s.NextSeq)
	}
	if s.DryRun {
		b.WriteString("dry run: nothing was published\n")
	}
	return b.String()
}
