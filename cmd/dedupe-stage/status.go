package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/boot"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/status"
)

// statusTimeout bounds the whole of `status`: every request to the cluster.
const statusTimeout = 30 * time.Second

// Exit codes of `status`, as a monitoring check's (Nagios plugins', and
// `nats server check`'s): configs/README.md, "status as a monitoring check".
const (
	// statusOK: every partition is owned, idle, or waiting within its
	// hand-over time.
	statusOK = 0
	// statusCritical: input has waited without an owner for longer than
	// the hand-over time (status.ErrStalled).
	statusCritical = 2
	// statusUnknown: the cluster could not be read, or the flags or the
	// configuration are wrong (status.ErrGroupMismatch among them).
	statusUnknown = 3
)

// statusMain runs statusCmd and returns its exit code: statusOK,
// statusCritical or statusUnknown, with the error on stderr.
func statusMain(args []string, stdout, stderr io.Writer) int {
	err := statusCmd(args, stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return statusOK
	case errors.Is(err, status.ErrStalled):
		fmt.Fprintln(stderr, "dedupe-stage: CRITICAL:", err)
		return statusCritical
	}
	fmt.Fprintln(stderr, "dedupe-stage: UNKNOWN:", err)
	return statusUnknown
}

// statusCmd prints how the stage or its group stands, read from the
// cluster (internal/scaleout/status), with the configuration run would use. It
// returns an error wrapping status.ErrStalled when input has waited
// without an owner for longer than the hand-over time, so it serves as a
// check; an idle partition is healthy.
func statusCmd(args []string, stdout, stderr io.Writer) (err error) {
	asJSON := false
	var rest []string
	for _, a := range args {
		if a == "--json" || a == "-json" {
			asJSON = true
			continue
		}
		rest = append(rest, a)
	}
	l, err := loadConfig("status", rest, nil, false, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "  -json\n    \tprint JSON for scripts instead of the table")
			fmt.Fprintln(stderr, "\nExit status: 0 OK (every partition owned, idle, or waiting within the hand-over time), 2 CRITICAL (input waited without an owner for longer), 3 UNKNOWN (cluster unreadable, bad flags or configuration).")
		}
		return err
	}
	if err := noArgs("status", l.args); err != nil {
		return err
	}
	cfg := l.cfg
	red := cfg.Redactor()
	defer func() { err = red.Error(err) }()
	if cfg.NATS.IsEmbedded() {
		return errors.New("status reads the cluster, and no server is configured (the embedded server lives inside run); give --server, $NATS_URL or --context")
	}
	log := slog.New(red.Handler(newLogger(cfg.Log, stderr).Handler()))
	nc, err := boot.Connect(cfg.NATS, nil, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := cfg.NATS.NewJetStream(nc)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	r, err := status.Read(ctx, js, cfg, time.Now())
	if err != nil {
		return err
	}
	if asJSON {
		err = r.WriteJSON(stdout)
	} else {
		err = r.WriteTable(stdout)
	}
	if err != nil {
		return err
	}
	return r.Check()
}
