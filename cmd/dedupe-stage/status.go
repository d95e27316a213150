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
	"github.com/dedupe-stage/dedupe-stage/internal/status"
)

// statusTimeout bounds the whole of `status`: every request to the cluster.
const statusTimeout = 30 * time.Second

// statusCmd prints how the stage or its group stands, read from the
// cluster (internal/status), with the configuration run would use. It
// fails when a partition of a group has no owner, so it serves as a check.
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
