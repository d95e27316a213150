package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dedupe-stage/dedupe-stage/casetest"
	"github.com/dedupe-stage/dedupe-stage/config"
)

// testFlags are test's own flags.
type testFlags struct {
	cases   string
	run     string
	explain bool
	subject string
	headers []string
	payload string
	at      string
}

// testShows are the configuration flags test's help lists.
var testShows = flagSet{"key-header", "partitions"}

func (c *cli) newTestCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "test [FILE] [flags]",
		Short: "Run a configuration's own tests: the cases file beside it",
		Long: `Run the cases of the configuration run would use (FILE, --config or $DEDUPE_CONFIG, with the
environment and flags), from the cases file beside it: configs/<name>.cases.yaml for
configs/<name>.yaml. Each case runs the real stage in this process, on an in-process
nats-server that listens on no port, with its state in a temporary directory: no server,
data dir or port of the configuration is touched. A message whose verdict is not the one
expected is printed with its case, expected against actual.

--explain judges one message instead, given by --subject, --header and --payload or as JSON on
stdin ({"subject": ..., "headers": {...}, "payload": "..."} or "json": {...}), and prints its
key, scope, version, partition and verdict with the reason.`,
		Example: `  dedupe-stage test configs/webhooks.yaml
  dedupe-stage test configs/webhooks.yaml --run 'retried'
  dedupe-stage test configs/webhooks.yaml --explain --subject webhooks.github.push \
      --header Webhook-Source:github --payload '{"id":"evt-1"}'
  echo '{"subject":"webhooks.x","json":{"id":7}}' | dedupe-stage test configs/webhooks.yaml --explain`,
		RunE: func(*cobra.Command, []string) error { return testCmd(c.raw, os.Stdin, c.stdout, c.stderr) },
		Annotations: map[string]string{exitCodesKey: "0 every case passed (with --explain: the message was judged), " +
			"1 a case failed, or the configuration or cases file is invalid, 2 usage"},
	}
	var f testFlags
	cmd.Flags().AddFlagSet(newTestFlagSet(&f, c.stderr))
	_ = cmd.MarkFlagFilename("cases", "yaml", "yml")
	ownGroup(cmd.Flags())
	addConfigFlags(cmd, nil, testShows)
	return cmd
}

// newTestFlagSet returns test's own flags, writing into f.
func newTestFlagSet(f *testFlags, out io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(out)
	fs.StringVar(&f.cases, "cases", "", "the cases file (default: beside the configuration file, <name>.cases.yaml)")
	fs.StringVar(&f.run, "run", "", "run only the cases whose name matches this regular expression")
	fs.BoolVar(&f.explain, "explain", false, "judge one message (--subject, --header, --payload, or JSON on stdin) and say why")
	fs.StringVar(&f.subject, "subject", "", "with --explain: the message's input subject")
	fs.StringArrayVar(&f.headers, "header", nil, "with --explain: a header NAME:VALUE (repeatable)")
	fs.StringVar(&f.payload, "payload", "", "with --explain: the message's payload")
	fs.StringVar(&f.at, "at", "0s", "with --explain: the message's input time, as an offset from the cases file's start")
	return fs
}

// testCmd runs the cases of the configuration, or explains one message.
func testCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	var f testFlags
	l, err := loadWithOwnFlags("test", newTestFlagSet(&f, stderr), args, nil, true, stderr)
	if err != nil {
		return err
	}
	casesPath := f.cases
	if casesPath == "" && l.path != "" {
		casesPath = casetest.CasesPath(l.path)
		if _, err := os.Stat(casesPath); err != nil && f.explain {
			casesPath = "" // --explain needs no cases, only their start when there are
		}
	}
	if casesPath == "" && !f.explain {
		return &exitError{exitUsage, errors.New("test needs a configuration FILE (or --config, $DEDUPE_CONFIG) to find its cases beside, or --cases FILE")}
	}
	start := casetest.DefaultStart
	var file casetest.File
	if casesPath != "" {
		if file, err = casetest.Load(casesPath); err != nil {
			return err
		}
		start = file.Start
	}
	ctx := context.Background()
	if f.explain {
		msg, err := explainMessage(f, stdin)
		if err != nil {
			return &exitError{exitUsage, err}
		}
		e, err := casetest.Explain(ctx, l.cfg, start, msg)
		if err != nil {
			return fmt.Errorf("explain: %w", err)
		}
		fmt.Fprintf(stdout, "%-10s %s\n", "message:", msg.Describe())
		e.Print(stdout)
		return nil
	}
	if f.subject != "" || f.headers != nil || f.payload != "" {
		return &exitError{exitUsage, errors.New("--subject, --header and --payload describe the message of --explain; give --explain")}
	}
	var only *regexp.Regexp
	if f.run != "" {
		if only, err = regexp.Compile(f.run); err != nil {
			return &exitError{exitUsage, fmt.Errorf("--run: %w", err)}
		}
	}
	return runCases(ctx, l, file, only, stdout)
}

// runCases runs the cases of file (those whose name only matches, or
// all) and prints each; it returns exited(1) when one failed.
func runCases(ctx context.Context, l loaded, file casetest.File, only *regexp.Regexp, stdout io.Writer) error {
	fmt.Fprintf(stdout, "testing %s with %s\n", l.sources(), file.Path)
	passed, failed := 0, 0
	started := time.Now()
	for _, c := range file.Cases {
		if only != nil && !only.MatchString(c.Name) {
			continue
		}
		r := casetest.RunCase(ctx, l.cfg, file.Start, c)
		if r.Passed() {
			passed++
			fmt.Fprintf(stdout, "ok    %s (%s)\n", c.Name, plural(len(c.Messages), "message"))
			continue
		}
		failed++
		printFailure(stdout, file.Path, r)
	}
	if passed+failed == 0 {
		return &exitError{exitUsage, fmt.Errorf("--run %q matches no case of %s", only, file.Path)}
	}
	fmt.Fprintf(stdout, "%d passed, %d failed (%v)\n", passed, failed, time.Since(started).Round(time.Millisecond))
	if failed > 0 {
		return exited(exitFindings)
	}
	return nil
}

// printFailure prints a failed case: each message that did not pass,
// what it is, expected against actual.
func printFailure(w io.Writer, path string, r casetest.CaseResult) {
	fmt.Fprintf(w, "FAIL  %s (%s:%d)\n", r.Case.Name, path, r.Case.Line)
	if r.Err != nil {
		fmt.Fprintf(w, "      the case could not run: %v\n", r.Err)
		return
	}
	for i, m := range r.Messages {
		if m.Passed() {
			continue
		}
		fmt.Fprintf(w, "      message %d (line %d): %s\n", i+1, m.Message.Line, m.Message.Describe())
		if m.Err != nil {
			fmt.Fprintf(w, "        could not be judged: %v\n", m.Err)
			continue
		}
		fmt.Fprintf(w, "        expected: %s\n        actual:   %s\n", m.Message.Want.Describe(), m.Got.Describe())
		for _, d := range m.Diffs {
			fmt.Fprintf(w, "        - %s\n", d)
		}
	}
	if n := len(r.Case.Messages) - len(r.Messages); n > 0 {
		fmt.Fprintf(w, "      the %d messages after it were not sent\n", n)
	}
}

// explainMessage is the message --explain judges: from the flags when
// --subject is given, else JSON on stdin.
func explainMessage(f testFlags, stdin io.Reader) (casetest.Message, error) {
	var msg casetest.Message
	var at config.Duration
	if err := at.UnmarshalText([]byte(f.at)); err != nil {
		return msg, fmt.Errorf("--at: %w", err)
	}
	msg.At = at.D()
	if f.subject != "" {
		msg.Subject, msg.Payload = f.subject, []byte(f.payload)
		for _, h := range f.headers {
			name, value, ok := strings.Cut(h, ":")
			if !ok || strings.TrimSpace(name) == "" {
				return msg, fmt.Errorf("--header %q: want NAME:VALUE", h)
			}
			if msg.Headers == nil {
				msg.Headers = map[string]string{}
			}
			msg.Headers[strings.TrimSpace(name)] = strings.TrimSpace(value)
		}
		return msg, nil
	}
	if f.headers != nil || f.payload != "" {
		return msg, errors.New("--explain: --header and --payload need --subject")
	}
	var in struct {
		Subject string            `json:"subject"`
		Headers map[string]string `json:"headers"`
		Payload *string           `json:"payload"`
		JSON    json.RawMessage   `json:"json"`
	}
	data, err := io.ReadAll(stdin)
	if err != nil {
		return msg, fmt.Errorf("--explain: read stdin: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return msg, fmt.Errorf(`--explain without --subject reads the message as JSON on stdin, {"subject": ..., "headers": {...}, "payload": "..."} or "json": {...}: %w`, err)
	}
	if in.Subject == "" {
		return msg, errors.New("--explain: the message on stdin has no subject")
	}
	if in.Payload != nil && in.JSON != nil {
		return msg, errors.New("--explain: the message on stdin has both payload and json: give one")
	}
	msg.Subject, msg.Headers = in.Subject, in.Headers
	if in.Payload != nil {
		msg.Payload = []byte(*in.Payload)
	} else if in.JSON != nil {
		msg.Payload = []byte(in.JSON)
	}
	return msg, nil
}

// plural is n and noun, with an s unless n is 1.
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
