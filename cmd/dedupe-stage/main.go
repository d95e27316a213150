// Command dedupe-stage runs the dedupe stage between two NATS JetStream
// streams. See the README for what it guarantees and how to run it.
//
//	dedupe-stage run [--config FILE] [flags]            run the stage (embedded nats-server unless a URL is given)
//	dedupe-stage check-config [FILE] [run's flags]      validate what run would use, print it with the derived window and sizing
//	dedupe-stage check-config --connect [--json] ...    also run run's start-up checks against the server, read only
//	dedupe-stage inspect [--config FILE] KEY            is KEY inside the window? asks the stage's admin service
//	dedupe-stage forget [--config FILE] KEY             make KEY's next copy be forwarded again
//	dedupe-stage healthcheck [--config FILE]            exit 0 when the running stage reports healthy
//	dedupe-stage status [--config FILE] [--json] [flags] who owns each partition and how far behind it is, read from the cluster
//	dedupe-stage redrive [--config FILE] [--reason R] [--dry-run] [flags]   publish dead letters again to their input subjects
//	dedupe-stage version
package main

import (
	"errors"
	"flag"
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
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

const usage = `dedupe-stage: forwards each intent once from an input JetStream stream to an output stream.

Usage:
  dedupe-stage run [--config FILE] [flags]        run the stage (embedded nats-server and ./data unless --nats-url is given)
  dedupe-stage check-config [FILE] [flags]        validate the configuration run would use with the same file,
                                                  environment and flags; print it, the derived window and sizing
  dedupe-stage check-config --connect [--json] [FILE] [flags]
                                                  also run every start-up check of run against the server at
                                                  nats.url, read only; print each finding with the nats command
                                                  that fixes it; exit 0 ok, 1 a finding stops run, 2 usage,
                                                  3 no server
  dedupe-stage inspect [--config FILE] [flags] KEY
                                                  tell whether KEY is inside the window: asks the stage's admin
                                                  service on NATS (the owner of KEY's partition answers), or
                                                  /inspect over HTTP with --http-addr
  dedupe-stage forget [--config FILE] [flags] KEY make KEY's next copy be forwarded again: the owner of KEY's
                                                  partition forgets it and says when
  dedupe-stage healthcheck [--config FILE]        exit 0 when the running stage is healthy (for container health checks)
  dedupe-stage status [--config FILE] [--json] [flags]
                                                  read from the cluster (no instance needs to run): each partition's
                                                  state, owner, backlog and fence; exit 0 OK, 2 input stalled, 3 unknown
  dedupe-stage redrive [--config FILE] [--reason R] [--since T] [--until T] [--from-seq N] [--to-seq N]
                       [--limit N] [--dry-run] [--json] [flags]
                                                  publish the selected dead letters again to the input subjects they
                                                  came from, once each however often it is run; exit 0 all done,
                                                  1 some refused, 2 usage, 3 no server
  dedupe-stage version

The config file is --config FILE, else $DEDUPE_CONFIG; DEDUPE_* variables override it and flags
override both. Run "dedupe-stage run -h" for the flags. Configuration: configs/README.md.
Signals to run: SIGHUP reloads the configuration (log.level applies at once; the log says which
changed fields need a restart); SIGINT or SIGTERM stops cleanly, a second one exits at once.
`

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "run":
		err = runCmd(args[1:], stderr)
	case "check-config":
		err = checkConfigCmd(args[1:], stdout, stderr)
	case "inspect":
		err = inspectCmd(args[1:], stdout, stderr)
	case "forget":
		err = forgetCmd(args[1:], stdout, stderr)
	case "healthcheck":
		err = healthcheckCmd(args[1:], stdout, stderr)
	case "status":
		return statusMain(args[1:], stdout, stderr)
	case "redrive":
		return redriveMain(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		ver, rev := binaryVersion()
		fmt.Fprintf(stdout, "dedupe-stage %s (revision %s)\n", ver, rev)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "dedupe-stage: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		code := 1
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		}
		fmt.Fprintln(stderr, "dedupe-stage:", err)
		return code
	}
	return 0
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

	reg := newRegistry(ver, rev)
	status := &stage.Health{}
	stopHTTP, err := serveHTTP(cfg.HTTP, reg, status, log)
	if err != nil {
		return err
	}
	defer stopHTTP()

	var embedded *server.Server
	if cfg.NATS.URL == "" {
		if embedded, err = boot.StartEmbedded(cfg, log); err != nil {
			return err
		}
		defer func() {
			embedded.Shutdown()
			embedded.WaitForShutdown()
		}()
	}
	nc, err := boot.Connect(cfg.NATS, embedded, log)
	if err != nil {
		return err
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
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		log.Warn("flushing acks", "err", err)
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
func newRegistry(ver, rev string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
		newBuildInfo(ver, rev),
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
	own, args := splitCheckFlags(args)
	if err := usageErrors("check-config", args); err != nil {
		loadConfig("check-config", args, nil, true, stderr) // prints the usage
		return err
	}
	l, err := loadConfig("check-config", args, nil, true, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, "  -connect\n    \tcheck against the server at nats.url, read only (exit 1: findings that stop run, 3: no server)\n"+
				"  -json\n    \twith --connect, print the findings as a JSON list for scripts\n")
		}
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
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return string(b), nil
}
