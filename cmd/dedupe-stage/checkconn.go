package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/boot"
	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// checkTimeout bounds check-config --connect: every request to the server.
const checkTimeout = 30 * time.Second

// checkConfigFlags are check-config's own flags, taken out of the
// arguments before the configuration's flags are parsed.
type checkConfigFlags struct {
	connect bool // check against the server at nats.url
	json    bool // print the findings as JSON
}

// splitCheckFlags takes --connect and --json (with their values, if
// given) out of args.
func splitCheckFlags(args []string) (checkConfigFlags, []string, error) {
	var f checkConfigFlags
	fs := pflag.NewFlagSet("check-config", pflag.ContinueOnError)
	fs.BoolVar(&f.connect, "connect", false, "")
	fs.BoolVar(&f.json, "json", false, "")
	own, rest := splitOwnFlags(fs, args)
	if err := fs.Parse(own); err != nil {
		return f, nil, &exitError{exitUsage, err}
	}
	return f, rest, nil
}

// checkConnect runs stage.Check against the server cfg names and prints
// its findings, as text or as a JSON list of {check, severity, message,
// fix}. It fails with exitFindings when one of them stops run, and with
// exitConnect when the server or its JetStream does not answer.
func checkConnect(l loaded, asJSON bool, stdout, stderr io.Writer) (err error) {
	cfg := l.cfg
	red := cfg.Redactor()
	defer func() { err = red.Error(err) }()
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	nc, js, err := connectServer(ctx, cfg, "check-config --connect checks a server", stderr)
	if err != nil {
		return err
	}
	defer nc.Close()
	fs, err := stage.Check(ctx, js, cfg)
	if err != nil {
		return err
	}
	if fs == nil {
		fs = []finding.Finding{}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(fs); err != nil {
			return err
		}
	} else {
		printFindings(stdout, l, nc.ConnectedUrlRedacted(), fs)
	}
	if finding.Stops(fs) {
		n := 0
		for _, f := range fs {
			if f.Severity == finding.Error {
				n++
			}
		}
		return &exitError{exitFindings, fmt.Errorf("%d of the findings would stop run", n)}
	}
	return nil
}

// connectServer connects as run does, for a command that needs a server
// (what says so in the error), and checks that its JetStream answers. Its
// errors carry the exit status: exitUsage when no server is configured,
// exitConnect when it or its JetStream does not answer.
func connectServer(ctx context.Context, cfg config.Config, what string, stderr io.Writer) (*nats.Conn, jetstream.JetStream, error) {
	if cfg.NATS.IsEmbedded() {
		return nil, nil, &exitError{exitUsage, errors.New(what + ", and none is given (the embedded server lives inside run); give -s/--server, $NATS_URL or --context")}
	}
	log := slog.New(cfg.Redactor().Handler(newLogger(cfg.Log, stderr).Handler()))
	nc, err := boot.Connect(cfg.NATS.Dial(), nil, log)
	if err != nil {
		return nil, nil, &exitError{exitConnect, err}
	}
	js, err := cfg.NATS.NewJetStream(nc)
	if err != nil {
		nc.Close()
		return nil, nil, &exitError{exitConnect, fmt.Errorf("jetstream: %w", err)}
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		nc.Close()
		return nil, nil, &exitError{exitConnect, fmt.Errorf("JetStream at %s does not answer: %w", nc.ConnectedUrlRedacted(), err)}
	}
	return nc, js, nil
}

// printFindings prints the configuration and the findings for a reader.
func printFindings(w io.Writer, l loaded, url string, fs []finding.Finding) {
	fmt.Fprintf(w, "The configuration is valid. run would use it with these settings.\n%-12s %s\n%s", "from:", l.sources(), l.cfg.Summary())
	count := map[finding.Severity]int{}
	for _, f := range fs {
		count[f.Severity]++
	}
	fmt.Fprintf(w, "%-12s %s, read only (nothing was created or changed)\n", "server:", url)
	fmt.Fprintf(w, "%-12s %d would stop run, %d warnings, %d to know\n", "findings:",
		count[finding.Error], count[finding.Warning], count[finding.Info])
	for _, f := range fs {
		fmt.Fprintf(w, "  %-8s %s: %s\n", f.Severity, f.Check, f.Message)
		if f.Fix != "" {
			fmt.Fprintf(w, "  %-8s fix: %s\n", "", f.Fix)
		}
	}
}
