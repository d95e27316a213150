package boot

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrEmbeddedStart means the embedded nats-server could not start; the
// error says why (a port in use, a store directory it cannot write).
var ErrEmbeddedStart = errors.New("embedded nats-server did not start")

// embeddedStartTimeout bounds the wait for the embedded server to accept
// connections when it reports no error.
const embeddedStartTimeout = 30 * time.Second

// systemAccount is the name of nats-server's system account.
const systemAccount = "$SYS"

// Embedded is how StartEmbedded runs the in-process server: the values
// of nats.embedded, with its store directory resolved
// (config.Config.EmbeddedServer builds it).
type Embedded struct {
	// Host and Port are where it listens (Port -1: a free port).
	Host string
	Port int
	// StoreDir is JetStream's storage directory.
	StoreDir string
	// SyncAlways syncs every JetStream write before acknowledging it.
	SyncAlways bool
	// MonitorPort serves HTTP monitoring on Host; 0: off, -1: a free port.
	MonitorPort int
	// User and Password, or Token, when set, are required of every client.
	User, Password, Token string
	// SystemAccount adds the system account with the user SystemUser,
	// SystemPassword.
	SystemAccount              bool
	SystemUser, SystemPassword string
}

// HasAuth reports whether clients of the embedded server must
// authenticate (a user and password, or a token).
func (e Embedded) HasAuth() bool { return e.User != "" || e.Token != "" }

// StartEmbedded starts an in-process nats-server with JetStream for the
// embedded default: listening on e.Host:e.Port, storing under
// e.StoreDir, syncing every write before acknowledging it when
// sync_always is set, serving HTTP monitoring on monitor_port when it is
// not 0, requiring the configured user/password or token of every client,
// and adding the system account when system_account is set. The server does
// not install signal handlers, so the process keeps its own. A server that
// cannot start (a port in use, an unwritable store) fails at once with the
// server's own reason, wrapping ErrEmbeddedStart. The caller shuts it down.
func StartEmbedded(e Embedded, log *slog.Logger) (*server.Server, error) {
	storeDir := e.StoreDir
	opts := &server.Options{
		ServerName: "dedupe-stage-embedded",
		Host:       e.Host,
		Port:       e.Port,
		JetStream:  true,
		StoreDir:   storeDir,
		NoSigs:     true,
		SyncAlways: e.SyncAlways,
	}
	if e.MonitorPort != 0 {
		opts.HTTPHost, opts.HTTPPort = e.Host, e.MonitorPort
	}
	if err := embeddedAuth(opts, e); err != nil {
		return nil, err
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEmbeddedStart, err)
	}
	sl := serverLogger{log: log.With("component", "nats-server"), fatal: make(chan string, 1)}
	s.SetLoggerV2(sl, false, false, false)
	go s.Start()
	hostPort := net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
	deadline := time.Now().Add(embeddedStartTimeout)
	for !s.ReadyForConnections(100 * time.Millisecond) {
		select {
		case reason := <-sl.fatal:
			s.Shutdown()
			s.WaitForShutdown()
			return nil, fmt.Errorf("%w (listening on %s, JetStream store %s): %s; "+
				"nats.embedded.host and port (--embedded-host, --embedded-port) choose where it listens",
				ErrEmbeddedStart, hostPort, storeDir, reason)
		default:
		}
		if time.Now().After(deadline) {
			s.Shutdown()
			return nil, fmt.Errorf("%w: on %s, not accepting connections after %v", ErrEmbeddedStart, hostPort, embeddedStartTimeout)
		}
	}
	attrs := []any{"url", s.ClientURL(), "store_dir", storeDir, "sync_always", e.SyncAlways, "auth", embeddedAuthName(e)}
	if e.MonitorPort != 0 {
		if a := s.MonitorAddr(); a != nil {
			attrs = append(attrs, "monitor", "http://"+a.String())
		}
	}
	if e.SystemAccount {
		attrs = append(attrs, "system_user", e.SystemUser)
	}
	log.Info("embedded nats-server started", attrs...)
	if !isLoopback(e.Host) && !e.HasAuth() {
		log.Warn("the embedded nats-server is reachable from other machines and requires no authentication; set nats.embedded.user and password, or token",
			"host", e.Host)
	}
	return s, nil
}

// embeddedAuth sets the server's authentication from the configuration.
// Without the system account, a user/password or a token is the server's
// single credential. With it, the system account gets its user, and
// producers stay in the global account (where JetStream keeps its
// streams), logging in as the configured user; without one, nats-server
// maps clients that bring no credentials to the global account.
func embeddedAuth(opts *server.Options, e Embedded) error {
	if !e.SystemAccount {
		opts.Username, opts.Password = e.User, e.Password
		opts.Authorization = e.Token
		return nil
	}
	if e.User != "" {
		// An authorization block, even empty, stops nats-server from
		// letting clients without credentials into the global account.
		if err := opts.ProcessConfigString("authorization {}"); err != nil {
			return fmt.Errorf("embedded nats-server: %w", err)
		}
	}
	sys := server.NewAccount(systemAccount)
	opts.SystemAccount = systemAccount
	opts.Accounts = []*server.Account{sys}
	opts.Users = []*server.User{{Username: e.SystemUser, Password: e.SystemPassword, Account: sys}}
	if e.User != "" {
		opts.Users = append(opts.Users, &server.User{Username: e.User, Password: e.Password})
	}
	return nil
}

// embeddedAuthName names the authentication clients need, without secrets.
func embeddedAuthName(e Embedded) string {
	switch {
	case e.User != "":
		return "user " + e.User
	case e.Token != "":
		return "token"
	default:
		return "none"
	}
}

// isLoopback reports whether host is a loopback address or localhost.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// serverLogger routes nats-server's logs to slog. Its notices (the start-up
// banner among them) become debug: the stage logs what an operator needs.
// The first fatal error is also sent on fatal, so that a start that fails
// is reported at once.
type serverLogger struct {
	log   *slog.Logger
	fatal chan string
}

func (l serverLogger) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l serverLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l serverLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.Error(msg)
	select {
	case l.fatal <- msg:
	default:
	}
}
func (l serverLogger) Errorf(format string, v ...any) { l.log.Error(fmt.Sprintf(format, v...)) }
func (l serverLogger) Debugf(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l serverLogger) Tracef(format string, v ...any) {}
