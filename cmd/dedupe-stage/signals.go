package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"syscall"

	"github.com/dedupe-stage/dedupe-stage/config"
)

// exitSecondSignal is the exit status after a second SIGINT or SIGTERM.
const exitSecondSignal = 130

// handleSignals handles the process's signals as nats-server does: the
// first SIGINT or SIGTERM calls stop (a clean stop), a second one exits at
// once with status 130 (what was not acked comes back), and SIGHUP calls
// reload. The returned function ends the handling; signals then have
// their default effect again.
func handleSignals(stop, reload func(), log *slog.Logger) (end func()) {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		stopping := false
		for {
			select {
			case <-done:
				return
			case sig := <-sigs:
				switch {
				case sig == syscall.SIGHUP:
					reload()
				case !stopping:
					stopping = true
					log.Info("stopping: finishing the batch in flight; a second signal exits at once", "signal", sig.String())
					stop()
				default:
					log.Warn("second signal: exiting at once", "signal", sig.String())
					os.Exit(exitSecondSignal)
				}
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
	}
}

// reloader re-reads the configuration on SIGHUP exactly as run loaded it
// (the same file, environment and flags) and applies what can change while
// the stage runs: log.level. Every other field needs a restart, log.format
// among them, since a log that changes format midway breaks whatever parses
// it. It is used by one goroutine at a time.
type reloader struct {
	args    []string       // run's arguments
	running config.Config  // the configuration in effect
	level   *slog.LevelVar // the log level of every logger of the process
	log     *slog.Logger
}

// reload re-reads the configuration and logs one line saying what it
// applied and which changed fields need a restart. An invalid
// configuration is logged and the running one kept.
func (r *reloader) reload() {
	l, err := loadConfig("run", r.args, nil, false, io.Discard)
	if err != nil {
		r.log.Error("reload on SIGHUP failed: the running configuration is kept", "err", r.running.Redactor().Error(err))
		return
	}
	changed := changedFields(r.running, l.cfg)
	var applied, restart []string
	for _, f := range changed {
		if f == "log.level" {
			applied = append(applied, "log.level "+r.running.Log.Level+" -> "+l.cfg.Log.Level)
		} else {
			restart = append(restart, f)
		}
	}
	attrs := []any{"config", l.sources(), "applied", listOrNone(applied), "needs_restart", listOrNone(restart)}
	msg := "configuration reloaded on SIGHUP"
	if len(changed) == 0 {
		msg = "configuration reloaded on SIGHUP: nothing changed"
	}
	newLevel := r.level.Level()
	if err := newLevel.UnmarshalText([]byte(l.cfg.Log.Level)); err != nil {
		newLevel = r.level.Level() // Validate accepts only known levels
	}
	// The line is logged under whichever of the two levels shows it: the
	// old one before a rise, the new one after a fall.
	if newLevel > r.level.Level() {
		r.logReload(msg, restart, attrs)
		r.level.Set(newLevel)
	} else {
		r.level.Set(newLevel)
		r.logReload(msg, restart, attrs)
	}
	r.running.Log.Level = l.cfg.Log.Level
}

// logReload logs the reload's line: a warning when fields need a restart.
func (r *reloader) logReload(msg string, restart []string, attrs []any) {
	if len(restart) > 0 {
		r.log.Warn(msg+"; restart to apply the fields in needs_restart", attrs...)
		return
	}
	r.log.Info(msg, attrs...)
}

// listOrNone joins items, or says "none".
func listOrNone(items []string) string {
	if len(items) == 0 {
		return "none"
	}
	return strings.Join(items, ", ")
}

// changedFields returns the YAML paths ("input.ack_wait") of the fields
// whose values differ between a and b, in the order of the Config struct.
// It names fields, never their values.
func changedFields(a, b config.Config) []string {
	var out []string
	diffValues(reflect.ValueOf(a), reflect.ValueOf(b), "", &out)
	return out
}

// diffValues appends to out the paths under prefix at which a and b, of
// one type, differ.
func diffValues(a, b reflect.Value, prefix string, out *[]string) {
	if a.Kind() != reflect.Struct || !hasExported(a.Type()) {
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			*out = append(*out, prefix)
		}
		return
	}
	t := a.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		path := name
		if strings.Contains(opts, "inline") {
			path = prefix
		} else if prefix != "" {
			path = prefix + "." + name
		}
		diffValues(a.Field(i), b.Field(i), path, out)
	}
}

// hasExported reports whether struct type t has an exported field.
func hasExported(t reflect.Type) bool {
	for i := range t.NumField() {
		if t.Field(i).IsExported() {
			return true
		}
	}
	return false
}

// runContext returns the context run stops on and starts the signal
// handling; end stops the handling.
func runContext(args []string, cfg config.Config, level *slog.LevelVar, log *slog.Logger) (ctx context.Context, end func()) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &reloader{args: args, running: cfg, level: level, log: log}
	endSignals := handleSignals(cancel, r.reload, log)
	return ctx, func() {
		endSignals()
		cancel()
	}
}
