package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/boot"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/status"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// statusTimeout bounds the whole of `status`: every request to the cluster.
const statusTimeout = 30 * time.Second

// Exit codes of `status`, as a monitoring check's (Nagios plugins', and
// `nats server check`'s): configs/README.md, "status as a monitoring check".
const (
	// statusOK: every partition is owned, idle, or waiting within its
	// hand-over time; one instance runs, or nothing waits for it.
	statusOK = 0
	// statusCritical: input has waited without an owner (one instance:
	// with no consumer activity) for longer than the hand-over time
	// (status.ErrStalled).
	statusCritical = 2
	// statusUnknown: the cluster could not be read (on the embedded
	// default: the stage is not running), or the flags or the
	// configuration are wrong (status.ErrGroupMismatch among them).
	statusUnknown = 3
)

// statusMain runs statusCmd and returns its exit code: statusOK,
// statusCritical or statusUnknown, with the error on stderr.
func statusMain(args []string, stdout, stderr io.Writer) int {
	err := statusCmd(args, stdout, stderr)
	switch {
	case err == nil:
		return statusOK
	case errors.Is(err, status.ErrStalled):
		fmt.Fprintln(stderr, "dedupe-stage: CRITICAL:", err)
		return statusCritical
	}
	fmt.Fprintln(stderr, "dedupe-stage: UNKNOWN:", err)
	return statusUnknown
}

// statusCmd prints how the stage or its group stands, read from the
// cluster (internal/scaleout/status), with the configuration run would use;
// on the embedded default, from the embedded server run starts, and when
// that does not answer, that the stage is not running. It returns an error
// wrapping status.ErrStalled when input has waited without an owner (for
// one instance: with no consumer activity) for longer than the hand-over
// time, so it serves as a check; an idle partition is healthy.
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
		return err
	}
	if err := noArgs("status", l.args); err != nil {
		return err
	}
	cfg := l.cfg
	red := cfg.Redactor()
	defer func() { err = red.Error(err) }()
	log := slog.New(red.Handler(newLogger(cfg.Log, stderr).Handler()))
	conn := cfg.NATS
	if cfg.NATS.IsEmbedded() {
		// The embedded server lives inside run: no answer there is no stage.
		var ok bool
		if conn, ok = cfg.NATS.EmbeddedClient(); !ok {
			return errors.New("the stage is not running where status can tell: its embedded server's port is chosen at start (nats.embedded.port -1); give --server, $NATS_URL or --context")
		}
	}
	nc, err := boot.Connect(conn.Dial(), nil, log)
	if err != nil && cfg.NATS.IsEmbedded() {
		cause := err
		if u := errors.Unwrap(err); u != nil {
			cause = u
		}
		return fmt.Errorf("the stage is not running: nothing answers at %s, where run's embedded server listens (%v)", conn.URL, cause)
	}
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
	r, err := status.Read(ctx, js, stage.StatusTarget(cfg), time.Now())
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
