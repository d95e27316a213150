package boot

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/redact"
)

// Dial is how Connect reaches the server: the connection values of the
// nats section (config.NATS.Dial builds it, after ApplyContext).
type Dial struct {
	// URL is the server's URL, or a comma-separated list of one cluster's.
	URL string
	// User and Password, Token, NKeySeedFile, CredsFile: the credentials,
	// each used when set.
	User, Password, Token   string
	NKeySeedFile, CredsFile string
	// TLSCAFile verifies the server; TLSCertFile and TLSKeyFile are the
	// client's certificate; TLSHandshakeFirst does the handshake first.
	TLSCAFile, TLSCertFile, TLSKeyFile string
	TLSHandshakeFirst                  bool
	// ConnectTimeout bounds each connection attempt.
	ConnectTimeout time.Duration
	// PingInterval is how often the server is pinged, MaxPingsOut how many
	// pings may go unanswered before the connection is dropped, and
	// StaleAfter how long a write may block before it fails.
	PingInterval time.Duration
	MaxPingsOut  int
	StaleAfter   time.Duration
	// EmbeddedUser and EmbeddedPassword, or EmbeddedToken, are what the
	// embedded server requires of its clients, used in place of the
	// above when Connect is given the embedded server.
	EmbeddedUser, EmbeddedPassword, EmbeddedToken string
}

// Connect opens the stage's NATS connection: in process to embedded when it
// is not nil, otherwise to d.URL with d's credentials and TLS (d from the
// configuration as config.Config.ApplyContext left it, so that a nats CLI
// context has filled what nothing else set). The connection reconnects forever;
// disconnects and reconnects are logged. It pings the server every
// d.PingInterval and drops a connection that leaves d.MaxPingsOut pings
// unanswered, and a write blocked for d.StaleAfter fails: a link that
// stops answering without a reset is noticed within StaleAfter (with
// nats.go's defaults it took minutes). run, status and check-config
// --connect all connect here. A zero PingInterval, MaxPingsOut or
// StaleAfter keeps nats.go's own.
func Connect(d Dial, embedded *server.Server, log *slog.Logger) (*nats.Conn, error) {
	opts := liveness(d)
	opts = append(opts, []nats.Option{
		nats.Name("dedupe-stage"),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(false),
		nats.Timeout(d.ConnectTimeout),
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
	}...)
	url := d.URL
	if embedded != nil {
		opts = append(opts, nats.InProcessServer(embedded))
		url = embedded.ClientURL()
		// The embedded server asks the stage for the credentials it
		// requires of every client.
		if d.EmbeddedUser != "" {
			opts = append(opts, nats.UserInfo(d.EmbeddedUser, d.EmbeddedPassword))
		} else if d.EmbeddedToken != "" {
			opts = append(opts, nats.Token(d.EmbeddedToken))
		}
	} else {
		if d.User != "" || d.Password != "" {
			opts = append(opts, nats.UserInfo(d.User, d.Password))
		}
		if d.Token != "" {
			opts = append(opts, nats.Token(d.Token))
		}
		if d.CredsFile != "" {
			opts = append(opts, nats.UserCredentials(d.CredsFile))
		}
		if d.NKeySeedFile != "" {
			o, err := nats.NkeyOptionFromSeed(d.NKeySeedFile)
			if err != nil {
				return nil, fmt.Errorf("nats.nkey_seed_file %q: %w", d.NKeySeedFile, err)
			}
			opts = append(opts, o)
		}
		if d.TLSCAFile != "" {
			opts = append(opts, nats.RootCAs(d.TLSCAFile))
		}
		if d.TLSCertFile != "" {
			opts = append(opts, nats.ClientCert(d.TLSCertFile, d.TLSKeyFile))
		}
		if d.TLSHandshakeFirst {
			opts = append(opts, nats.TLSHandshakeFirst())
		}
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats at %s: %w", redact.NATSURL(url), err)
	}
	return nc, nil
}

// liveness returns the options that notice a link that stops answering:
// d's ping interval, pings out and write deadline, each where set.
func liveness(d Dial) []nats.Option {
	var opts []nats.Option
	if d.PingInterval > 0 {
		opts = append(opts, nats.PingInterval(d.PingInterval))
	}
	if d.MaxPingsOut > 0 {
		opts = append(opts, nats.MaxPingsOutstanding(d.MaxPingsOut))
	}
	if d.StaleAfter > 0 {
		opts = append(opts, nats.FlusherTimeout(d.StaleAfter))
	}
	return opts
}
