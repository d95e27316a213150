package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/admin"
	"github.com/dedupe-stage/dedupe-stage/internal/boot"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// adminFlags are the configuration flags of inspect and forget: the
// connection's, as run and status take them, the group's name, and
// --http-addr (inspect over HTTP).
var adminFlags = flagSet{"http-addr", "server", "s", "context", "user", "password", "token", "creds", "nkey",
	"tlscert", "tlskey", "tlsca", "tlsfirst", "scale-out", "scale-out-group"}

// adminOwn are inspect's and forget's own flags, outside the
// configuration.
type adminOwn struct {
	subject string        // --admin-subject: admin.subject
	timeout time.Duration // --timeout: how long to wait for answers
}

// splitAdminFlags takes --admin-subject S and --timeout D (or with =) out
// of args.
func splitAdminFlags(args []string) (adminOwn, []string, error) {
	own := adminOwn{timeout: admin.DefaultTimeout}
	var rest []string
	for i := 0; i < len(args); i++ {
		name, val, hasVal := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if !strings.HasPrefix(args[i], "-") || (name != "admin-subject" && name != "timeout") {
			rest = append(rest, args[i])
			continue
		}
		if !hasVal {
			if i+1 == len(args) {
				return own, nil, fmt.Errorf("--%s needs a value", name)
			}
			i++
			val = args[i]
		}
		if name == "admin-subject" {
			own.subject = val
			continue
		}
		d, err := time.ParseDuration(val)
		if err != nil || d <= 0 {
			return own, nil, fmt.Errorf("--timeout %q: want a positive duration such as 5s", val)
		}
		own.timeout = d
	}
	return own, rest, nil
}

// adminCall loads the configuration of cmd (inspect or forget), connects
// as run does (to the embedded server's client port when no server is
// configured) and calls fn with a client of the stage's admin service.
// http is set, and fn not called, when inspect should ask over HTTP as
// before: --http-addr given, or admin.disabled.
func adminCall(cmd string, args []string, stderr io.Writer, fn func(context.Context, admin.Client, string) error) (l loaded, http bool, err error) {
	own, args, err := splitAdminFlags(args)
	if err != nil {
		return l, false, &exitError{exitUsage, err}
	}
	l, err = loadConfig(cmd, args, adminFlags, false, stderr)
	if err != nil {
		return l, false, err
	}
	if len(l.args) != 1 {
		return l, false, &exitError{exitUsage, fmt.Errorf("usage: dedupe-stage %s [--config FILE] [connection flags] [--admin-subject S] [--timeout D] KEY", cmd)}
	}
	cfg := l.cfg
	if cmd == "inspect" && (slices.Contains(l.set, "--http-addr") || cfg.Admin.Disabled) {
		return l, true, nil
	}
	if cfg.Admin.Disabled {
		return l, false, errors.New(cmd + " asks the stage's admin service, and admin.disabled is true")
	}
	red := cfg.Redactor()
	defer func() { err = red.Error(err) }()
	c, err := dialAdmin(cfg, own, stderr)
	if err != nil {
		return l, false, err
	}
	defer c.Conn.Close()
	return l, false, fn(context.Background(), c, l.args[0])
}

// dialAdmin connects as run does (to the embedded server's client port
// when no server is configured) and returns a client of the stage's admin
// service on cfg's admin subject (own.subject when given); the caller
// closes its connection. A connection refused is exitConnect.
func dialAdmin(cfg config.Config, own adminOwn, stderr io.Writer) (admin.Client, error) {
	if own.subject != "" {
		cfg.Admin.Subject = own.subject
	}
	n := cfg.NATS
	if n.IsEmbedded() {
		n = embeddedClient(cfg)
	}
	log := slog.New(cfg.Redactor().Handler(newLogger(config.Log{Level: "error"}, stderr).Handler()))
	nc, err := boot.Connect(n.Dial(), nil, log)
	if err != nil {
		return admin.Client{}, &exitError{exitConnect, err}
	}
	return admin.Client{Conn: nc, Subject: cfg.AdminSubject(), Timeout: own.timeout}, nil
}

// embeddedClient is the connection to the embedded server of a running
// stage: its client port, with the credentials it requires.
func embeddedClient(cfg config.Config) config.NATS {
	n := cfg.NATS
	e := n.Embedded
	host, _ := dialAddr(net.JoinHostPort(e.Host, strconv.Itoa(e.Port)))
	n.URL = "nats://" + host
	n.User, n.Password, n.Token = e.User, e.Password, e.Token
	return n
}

// inspectCmd tells whether KEY is inside the window: it asks the stage's
// admin service on NATS (the owner of the key's partition answers), or
// /inspect over HTTP with --http-addr or admin.disabled.
func inspectCmd(args []string, stdout, stderr io.Writer) error {
	l, http, err := adminCall("inspect", args, stderr, func(ctx context.Context, c admin.Client, key string) error {
		r, err := c.Inspect(ctx, key)
		if err != nil {
			return err
		}
		return printJSON(stdout, r)
	})
	if err != nil || !http {
		return err
	}
	return inspectHTTP(l, stdout)
}

// forgetCmd asks the owner of KEY's partition to forget it, so that its
// next copy is forwarded, and prints when it was applied.
func forgetCmd(args []string, stdout, stderr io.Writer) error {
	_, _, err := adminCall("forget", args, stderr, func(ctx context.Context, c admin.Client, key string) error {
		r, err := c.Forget(ctx, key)
		if err != nil {
			return err
		}
		return printJSON(stdout, r)
	})
	return err
}

// inspectHTTP asks /inspect of the running stage, as inspect did before
// the admin service.
func inspectHTTP(l loaded, stdout io.Writer) error {
	on := l.cfg.HTTP.InspectOn()
	if on == "" {
		return errors.New("inspect asks the running stage over HTTP, and /inspect is off (http.inspect false or http.addr empty)")
	}
	addr, err := dialAddr(on)
	if err != nil {
		return err
	}
	body, err := httpGet("http://" + addr + "/inspect?key=" + url.QueryEscape(l.args[0]))
	if err != nil {
		return fmt.Errorf("inspect asks the running stage at %s (is it running?): %w", addr, err)
	}
	fmt.Fprint(stdout, body)
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// serveAdmin starts the admin service of st on nc, unless admin.disabled.
// The returned stop is safe to call when nothing was started.
func serveAdmin(cfg config.Config, nc *nats.Conn, st *stage.Stage, ver string, log *slog.Logger) (stop func(), err error) {
	if cfg.Admin.Disabled {
		log.Info("admin service off (admin.disabled)")
		return func() {}, nil
	}
	svc, err := admin.Serve(admin.Options{Conn: nc, Subject: cfg.AdminSubject(), Instance: cfg.ScaleOut.InstanceName(),
		Version: serviceVersion(ver), Stage: st, Logger: log})
	if err != nil {
		return nil, err
	}
	log.Info("admin service on NATS", "service", admin.ServiceName, "subjects", cfg.AdminSubject()+".{inspect,forget,status}")
	return func() { _ = svc.Stop() }, nil
}

// semver is the form micro requires of a service's version.
var semver = regexp.MustCompile(`^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

// serviceVersion returns the binary's version as the service's, or
// "0.0.0" for a build without one.
func serviceVersion(ver string) string {
	if semver.MatchString(ver) {
		return strings.TrimPrefix(ver, "v")
	}
	return "0.0.0"
}
