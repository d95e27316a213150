package boot

import (
	"fmt"
	"log/slog"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/redact"
)

// Connect opens the stage's NATS connection: in process to embedded when it
// is not nil, otherwise to cfg.URL with the configured credentials and TLS
// (cfg as config.Config.ApplyContext left it, so that a nats CLI context
// has filled what nothing else set). The connection reconnects forever;
// disconnects and reconnects are logged. run, status and check-config
// --connect all connect here.
func Connect(cfg config.NATS, embedded *server.Server, log *slog.Logger) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name("dedupe-stage"),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(false),
		nats.Timeout(cfg.ConnectTimeout.D()),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			// A nil error is the connection being closed on purpose (a clean
			// stop), which the closer logs.
			if err == nil {
				return
			}
			log.Warn("nats disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("nats reconnected", "url", c.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Warn("nats async error", "subject", subj, "err", err)
		}),
	}
	url := cfg.URL
	if embedded != nil {
		opts = append(opts, nats.InProcessServer(embedded))
		url = embedded.ClientURL()
		// The embedded server asks the stage for the credentials it
		// requires of every client.
		if e := cfg.Embedded; e.User != "" {
			opts = append(opts, nats.UserInfo(e.User, e.Password))
		} else if e.Token != "" {
			opts = append(opts, nats.Token(e.Token))
		}
	} else {
		if cfg.User != "" || cfg.Password != "" {
			opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
		}
		if cfg.Token != "" {
			opts = append(opts, nats.Token(cfg.Token))
		}
		if cfg.CredsFile != "" {
			opts = append(opts, nats.UserCredentials(cfg.CredsFile))
		}
		if cfg.NKeySeedFile != "" {
			o, err := nats.NkeyOptionFromSeed(cfg.NKeySeedFile)
			if err != nil {
				return nil, fmt.Errorf("nats.nkey_seed_file %q: %w", cfg.NKeySeedFile, err)
			}
			opts = append(opts, o)
		}
		if cfg.TLS.CAFile != "" {
			opts = append(opts, nats.RootCAs(cfg.TLS.CAFile))
		}
		if cfg.TLS.CertFile != "" {
			opts = append(opts, nats.ClientCert(cfg.TLS.CertFile, cfg.TLS.KeyFile))
		}
		if cfg.TLS.HandshakeFirst {
			opts = append(opts, nats.TLSHandshakeFirst())
		}
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats at %s: %w", redact.NATSURL(url), err)
	}
	return nc, nil
}
