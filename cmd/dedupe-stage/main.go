// Command dedupe-stage runs the dedupe stage between two NATS JetStream
// streams. See the README for what it guarantees and how to run it.
//
//	dedupe-stage run [--config FILE] [flags]   run the stage (embedded nats-server unless a URL is given)
//	dedupe-stage check-config FILE             validate a config, print the derived window and sizing
//	dedupe-stage inspect [--config FILE] KEY   is KEY inside the window? asks the running stage
//	dedupe-stage healthcheck [--http-addr A]   exit 0 when the running stage reports healthy
//	dedupe-stage version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

const usage = `dedupe-stage: forwards each intent once from an input JetStream stream to an output stream.

Usage:
  dedupe-stage run [--config FILE] [flags]    run the stage (embedded nats-server and ./data unless --nats-url is given)
  dedupe-stage check-config FILE              validate FILE, print the derived window and sizing
  dedupe-stage inspect [--config FILE] KEY    tell whether KEY is inside the window (asks the running stage)
  dedupe-stage healthcheck [--http-addr ADDR] exit 0 when the running stage is healthy (for container health checks)
  dedupe-stage version

Run "dedupe-stage run -h" for the flags. Configuration: configs/README.md.
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
		err = checkConfigCmd(args[1:], stdout)
	case "inspect":
		err = inspectCmd(args[1:], stdout)
	case "healthcheck":
		err = healthcheckCmd(args[1:], stdout)
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
		fmt.Fprintln(stderr, "dedupe-stage:", err)
		return 1
	}
	return 0
}

// loadConfig reads --config (from anywhere in args), the environment, then
// the flags, which win. It validates the result.
func loadConfig(name string, args []string) (config.Config, *flag.FlagSet, error) {
	path := ""
	for i, a := range args {
		switch {
		case (a == "--config" || a == "-config") && i+1 < len(args):
			path = args[i+1]
		case strings.HasPrefix(a, "--config="):
			path = strings.TrimPrefix(a, "--config=")
		case strings.HasPrefix(a, "-config="):
			path = strings.TrimPrefix(a, "-config=")
		}
	}
	cfg, err := config.Load(path)
	if err != nil {
		return cfg, nil, err
	}
	if err := cfg.ApplyEnv(os.Getenv); err != nil {
		return cfg, nil, err
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.String("config", path, "YAML config file (see configs/)")
	cfg.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return cfg, nil, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, nil, fmt.Errorf("invalid config:\n%w", err)
	}
	return cfg, fs, nil
}

// newLogger returns the logger cfg asks for. Durations print as Go
// duration strings ("1h10m0s") in both formats, not as nanoseconds.
func newLogger(cfg config.Log, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Level))
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: durationsAsStrings}
	if cfg.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// durationsAsStrings is a slog ReplaceAttr that writes time.Duration values
// as strings.
func durationsAsStrings(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

func runCmd(args []string, stderr io.Writer) (err error) {
	cfg, _, err := loadConfig("run", args)
	if err != nil {
		return err
	}
	// No log line and no error may show a credential from the config.
	red := cfg.Redactor()
	defer func() { err = red.Error(err) }()
	log := slog.New(red.Handler(newLogger(cfg.Log, stderr).Handler()))
	slog.SetDefault(log)
	ver, rev := binaryVersion()
	log.Info("dedupe-stage starting", "version", ver, "revision", rev)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		// A second signal exits at once; what was not acked comes back.
		again := make(chan os.Signal, 1)
		signal.Notify(again, syscall.SIGINT, syscall.SIGTERM)
		<-again
		log.Warn("second signal: exiting at once")
		os.Exit(130)
	}()

	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
		newBuildInfo(ver, rev),
	)
	status := &stage.Status{}
	stopHTTP, err := serveHTTP(cfg.HTTP, reg, status, log)
	if err != nil {
		return err
	}
	defer stopHTTP()

	var embedded *server.Server
	if cfg.NATS.URL == "" {
		if embedded, err = stage.StartEmbedded(cfg.NATS.Embedded, cfg.State.DataDir, log); err != nil {
			return err
		}
		defer func() {
			embedded.Shutdown()
			embedded.WaitForShutdown()
		}()
	}
	nc, err := stage.Connect(cfg.NATS, embedded, log)
	if err != nil {
		return err
	}
	defer nc.Close()

	st, err := stage.New(ctx, stage.Options{Config: cfg, Conn: nc, Registry: reg, Logger: log, Status: status})
	if err != nil {
		return err
	}
	if embedded != nil {
		log.Info("try it: publish an event twice, then read the output",
			"publish", fmt.Sprintf(`nats -s %s pub %s '{"hello":"world"}' -H 'Nats-Msg-Id:order-1'`, embedded.ClientURL(), firstSubject(cfg.Input.Subjects)),
			"read", fmt.Sprintf("nats -s %s stream view %s", embedded.ClientURL(), cfg.Output.Stream))
	}
	runErr := st.Run(ctx)
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

// firstSubject turns the first input subject into a concrete one to publish on.
func firstSubject(subjects []string) string {
	if len(subjects) == 0 {
		return "events.test"
	}
	s := strings.ReplaceAll(subjects[0], ">", "test")
	return strings.ReplaceAll(s, "*", "test")
}

func checkConfigCmd(args []string, stdout io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: dedupe-stage check-config FILE")
	}
	cfg, err := config.Load(args[0])
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%s is invalid:\n%w", args[0], err)
	}
	fmt.Fprintf(stdout, "%s is valid.\n%s\n", args[0], cfg.Summary())
	return nil
}

func inspectCmd(args []string, stdout io.Writer) error {
	var key string
	if n := len(args); n > 0 && !strings.HasPrefix(args[n-1], "-") {
		key, args = args[n-1], args[:n-1]
	}
	cfg, _, err := loadConfig("inspect", args)
	if err != nil {
		return err
	}
	if key == "" {
		return errors.New("usage: dedupe-stage inspect [--config FILE] [flags] KEY")
	}
	addr := cfg.HTTP.InspectOn()
	if addr == "" {
		return errors.New("inspect asks the running stage over HTTP, and /inspect is off (http.inspect false or http.addr empty)")
	}
	body, err := httpGet("http://" + addr + "/inspect?key=" + url.QueryEscape(key))
	if err != nil {
		return fmt.Errorf("inspect asks the running stage at %s (is it running?): %w", addr, err)
	}
	fmt.Fprint(stdout, body)
	return nil
}

func healthcheckCmd(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	addr := fs.String("http-addr", envOr("DEDUPE_HTTP_ADDR", config.Default().HTTP.Addr), "the stage's HTTP address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	body, err := httpGet("http://" + *addr + "/healthz")
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, body)
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
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
