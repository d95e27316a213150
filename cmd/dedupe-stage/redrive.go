package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
	bucket       string
}

// newRedriveFlagSet returns the flag set of redrive's own flags, writing into f.
func newRedriveFlagSet(f *redriveFlags, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("redrive", flag.ContinueOnError)
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
	fs.StringVar(&f.bucket, "progress-bucket", redrive.DefaultBucket, "key-value bucket of the marks of the dead letters already republished")
	return fs
}

// timeFlag parses an RFC 3339 time or a duration before now into t.
func timeFlag(t *time.Time) func(string) error {
	return func(s string) error {
		if d, err := time.ParseDuration(s); err == nil {
			*t = time.Now().Add(-d)
			return nil
		}
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return fmt.Errorf("%q is neither an RFC 3339 time (2026-03-01T12:00:00Z) nor a duration (2h)", s)
		}
		*t = v
		return nil
	}
}

// splitOwnFlags takes the flags fs defines (with their values) out of args
// and returns them and the rest, in order.
func splitOwnFlags(fs *flag.FlagSet, args []string) (own, rest []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := fs.Lookup(name)
		if !strings.HasPrefix(a, "-") || f == nil {
			rest = append(rest, a)
			continue
		}
		own = append(own, a)
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); hasValue || (ok && b.IsBoolFlag()) {
			continue
		}
		if i+1 < len(args) {
			own = append(own, args[i+1])
			i++
		}
	}
	return own, rest
}

// redriveMain runs redriveCmd and returns its exit code: 0 every selected
// dead letter is republished (or was before), 1 some were refused or the
// run stopped, 2 usage, 3 the server cannot be reached.
func redriveMain(args []string, stdout, stderr io.Writer) int {
	err := redriveCmd(args, stdout, stderr)
	if err == nil || errors.Is(err, flag.ErrHelp) {
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
	ownFS := newRedriveFlagSet(&f, stderr)
	own, rest := splitOwnFlags(ownFS, args)
	if err := ownFS.Parse(own); err != nil {
		return &exitError{exitUsage, err}
	}
	if err := usageErrors("redrive", rest); err != nil {
		return err
	}
	l, err := loadConfig("redrive", rest, nil, false, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			ownFS.PrintDefaults()
			fmt.Fprintln(stderr, "\nExit status: 0 every selected dead letter republished (now or by an earlier run), 1 some refused or the run stopped, 2 usage, 3 no server.")
		}
		return err
	}
	if err := noArgs("redrive", l.args); err != nil {
		return &exitError{exitUsage, err}
	}
	cfg := l.cfg
	red := cfg.Redactor()
	defer func() { err = red.Error(err) }()
	o := redrive.Options{Stream: cfg.DeadLetter.Stream, Subject: cfg.DeadLetter.Subject, Reasons: f.reasons,
		FromSeq: f.from, ToSeq: f.to, Since: f.since, Until: f.until, Limit: f.limit, DryRun: f.dryRun,
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
	}
	if r.Detail != "" {
		line += ": " + r.Detail
	}
	return line
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
	if n := s.RefusedCount(); n > 0 {
		var parts []string
		for r, c := range s.Refused {
			parts = append(parts, fmt.Sprintf("%s %d", r, c))
		}
		slices.Sort(parts)
		fmt.Fprintf(&b, " (%s)", strings.Join(parts, ", "))
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
