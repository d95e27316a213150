// Command dedupe-stage runs the dedupe stage between two NATS JetStream
// streams. See the README for what it guarantees and how to run it, and
// `dedupe-stage --help` for the commands: run, check-config, status,
// inspect, forget, redrive, healthcheck, version and completion.
//
// cli.go builds the command line (spf13/cobra): help, flag groups,
// suggestions, completion and the exit codes; commands.go has each
// command's text. The commands' work is in the functions they call.
package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/boot"
	vers "github.com/dedupe-stage/dedupe-stage/internal/version"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

// newLogger returns the logger cfg asks for. Durations print as Go
// duration strings ("1h10m0s") in both formats, not as nanoseconds.
func newLogger(cfg config.Log, w io.Writer) *slog.Logger {
	log, _ := newLevelLogger(cfg, w)
	return log
}

// newLevelLogger is newLogger with its level, which can be changed while
// the logger is in use (a reload on SIGHUP).
func newLevelLogger(cfg config.Log, w io.Writer) (*slog.Logger, *slog.LevelVar) {
	level := new(slog.LevelVar)
	_ = level.UnmarshalText([]byte(cfg.Level))
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: durationsAsStrings}
	if cfg.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), level
	}
	return slog.New(slog.NewTextHandler(w, opts)), level
}

// durationsAsStrings is a slog ReplaceAttr that writes time.Duration values
// as strings.
func durationsAsStrings(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// closeConn closes nc and logs it here rather than in the connection's
// handler, which runs on another goroutine and may not before the process
// exits.
func closeConn(nc *nats.Conn, log *slog.Logger) {
	nc.Close()
	log.Debug("nats connection closed")
}

func runCmd(args []string, stderr io.Writer) (err error) {
	l, err := loadConfig("run", args, nil, false, stderr)
	if err != nil {
		return err
	}
	if err := noArgs("run", l.args); err != nil {
		return err
	}
	cfg := l.cfg
	// No log line and no error may show a credential from the config.
	red := cfg.Redactor()
	defer func() { err = red.Error(err) }()
	base, level := newLevelLogger(cfg.Log, stderr)
	log := slog.New(red.Handler(base.Handler()))
	slog.SetDefault(log)
	// Signals as nats-server: SIGINT or SIGTERM stops cleanly, a second
	// one exits at once, SIGHUP reloads the configuration.
	ctx, endSignals := runContext(args, cfg, level, log)
	defer endSignals()
	ver, rev := binaryVersion()
	log.Info("dedupe-stage starting", "version", ver, "revision", rev, "config", l.sources())

	// The data dir first: one that cannot be used, or that another process
	// holds, fails here, before anything (the embedded server above all)
	// writes in it.
	var extraDirs []string
	if cfg.NATS.IsEmbedded() {
		extraDirs = append(extraDirs, cfg.EmbeddedStoreDir())
	}
	lock, err := boot.LockDataDir(cfg.State.DataDir, extraDirs...)
	if err != nil {
		return err
	}
	defer lock.Release()

	reg := newRegistry(buildInfo())
	status := &stage.Health{}
	stopHTTP, err := serveHTTP(cfg.HTTP, reg, status, log)
	if err != nil {
		return err
	}
	defer stopHTTP()

	var embedded *server.Server
	if cfg.NATS.URL == "" {
		if embedded, err = boot.StartEmbedded(cfg.EmbeddedServer(), log); err != nil {
			return err
		}
		defer func() {
			embedded.Shutdown()
			embedded.WaitForShutdown()
		}()
	}
	nc, err := boot.Connect(cfg.NATS.Dial(), embedded, log)
	if err != nil {
		return &exitError{exitConnect, err}
	}
	defer closeConn(nc, log)

	st, err := stage.New(ctx, stage.Options{Config: cfg, Conn: nc, Registry: reg, Logger: log, Health: status})
	if err != nil {
		return err
	}
	stopAdmin, err := serveAdmin(cfg, nc, st, ver, log)
	if err != nil {
		st.Close()
		return err
	}
	if embedded != nil {
		tryIt(log, cfg, embedded.ClientURL())
	}
	runErr := st.Run(ctx)
	stopAdmin()
	// The last acks, when there is a server to send them to: a connection
	// that is down loses them either way, and they come back after
	// input.ack_wait.
	if nc.IsConnected() {
		if err := nc.FlushTimeout(5 * time.Second); err != nil {
			log.Warn("flushing acks", "err", err)
		}
	}
	closeErr := st.Close()
	if runErr != nil {
		return runErr
	}
	if closeErr != nil {
		return fmt.Errorf("closing state: %w", closeErr)
	}
	log.Info("stopped cleanly")
	return nil
}

// newRegistry is the process's metrics registry: the Go runtime, the
// process and the build's information, to which the stage adds its own.
func newRegistry(in vers.Info) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
		newBuildInfo(in),
	)
	return reg
}

// tryIt logs how to see the stage catch a repeat on the embedded server.
func tryIt(log *slog.Logger, cfg config.Config, url string) {
	k := cfg.Key.Field
	if k.Source != keys.SourceHeader || cfg.Key.Scope.Enabled() {
		return // the key's shape is the configuration's; the README shows the header case
	}
	publish := fmt.Sprintf(`nats -s %s pub %s '{"hello":"world"}' -H '%s:order-1'`, url, firstSubject(cfg.Input.Subjects), k.Header)
	attrs := []any{"publish", publish, "read", fmt.Sprintf("nats -s %s stream view %s", url, cfg.Output.Stream)}
	if strings.EqualFold(k.Header, jetstream.MsgIDHeader) {
		attrs = append(attrs, "note", "the input stream itself drops a Nats-Msg-Id repeated within its 2m duplicate window; "+
			"run with --key-header Order-Id to watch the stage catch repeats")
	}
	log.Info("try it: publish an event twice, then read the output", attrs...)
}

// firstSubject turns the first input subject into a concrete one to publish on.
func firstSubject(subjects []string) string {
	if len(subjects) == 0 {
		return "events.test"
	}
	s := strings.ReplaceAll(subjects[0], ">", "test")
	return strings.ReplaceAll(s, "*", "test")
}

func checkConfigCmd(args []string, stdout, stderr io.Writer) error {
	own, args, err := splitCheckFlags(args)
	if err != nil {
		return err
	}
	l, err := loadConfig("check-config", args, nil, true, stderr)
	if err != nil {
		return err
	}
	if err := noArgs("check-config", l.args); err != nil {
		return &exitError{exitUsage, err}
	}
	if own.json && !own.connect {
		return &exitError{exitUsage, errors.New("check-config --json prints the findings of --connect; give both")}
	}
	if own.connect {
		return checkConnect(l, own.json, stdout, stderr)
	}
	fmt.Fprintf(stdout, "The configuration is valid. run would use it with these settings.\n%-12s %s\n%s", "from:", l.sources(), l.cfg.Summary())
	streams, err := stage.StreamsToCreate(l.cfg)
	if err != nil {
		return err
	}
	head := "created when missing (existing streams are left as they are), with:"
	if !l.cfg.NATS.ShouldCreateStreams() {
		head = "must exist; with --create-streams they would be created with:"
	}
	fmt.Fprintf(stdout, "%-12s %s\n", "streams:", head)
	for _, st := range streams {
		fmt.Fprintf(stdout, "%-12s %s\n", "", describeStream(st))
	}
	return nil
}

// describeStream says what a created stream keeps.
func describeStream(st stage.StreamToCreate) string {
	c := st.Config
	age := config.Duration(c.MaxAge).String()
	if st.MaxAgeComputed {
		age += fmt.Sprintf(" (computed: the larger of %v and 2 x W)", config.Duration(stage.DefaultStreamMaxAge))
	} else {
		age += " (" + st.Field + ".max_age)"
	}
	size := "unlimited"
	if c.MaxBytes > 0 {
		size = config.ByteSize(c.MaxBytes).String() + " (" + st.Field + ".max_bytes)"
	}
	dup := "server default (2m)"
	if c.Duplicates > 0 {
		dup = config.Duration(c.Duplicates).String()
	}
	full := "drops its oldest messages"
	if c.Discard == jetstream.DiscardNew {
		full = "refuses new messages"
	}
	return fmt.Sprintf("%s: max_age %s, max_bytes %s (when full it %s), duplicate window %s",
		c.Name, age, size, full, dup)
}

// healthcheckCmd asks the running stage's /healthz. It reads the same
// config file, environment and --http-addr as run, so a container's
// HEALTHCHECK follows $DEDUPE_HTTP_ADDR.
func healthcheckCmd(args []string, stdout, stderr io.Writer) error {
	l, err := loadConfig("healthcheck", args, flagSet{"http-addr"}, false, stderr)
	if err != nil {
		return err
	}
	if err := noArgs("healthcheck", l.args); err != nil {
		return err
	}
	if l.cfg.HTTP.Addr == "" {
		return errNoHTTP
	}
	addr, err := dialAddr(l.cfg.HTTP.Addr)
	if err != nil {
		return err
	}
	body, err := httpGet("http://" + addr + "/healthz")
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, body)
	return nil
}

func httpGet(u string) (string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return "", &exitError{exitConnect, err}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return string(b), nil
}
