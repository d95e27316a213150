package boot_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/boot"
	"github.com/dedupe-stage/dedupe-stage/internal/boot/boottest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// external is the default configuration pointed at url, with a connect
// timeout short enough for the cases that must fail.
func external(url string) config.NATS {
	n := config.Default().NATS
	n.URL = url
	n.ConnectTimeout = config.Duration(2 * time.Second)
	return n
}

// useJetStream connects as the stage does with n and asks JetStream for
// the account's information through config.NATS.NewJetStream: the first
// error of the two.
func useJetStream(t *testing.T, n config.NATS) error {
	t.Helper()
	nc, err := boot.Connect(n.Dial(), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := n.NewJetStream(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

func TestConnectTLS(t *testing.T) {
	pki := boottest.NewPKI(t)
	tests := []struct {
		name           string
		serverFirst    bool // the server requires the handshake first
		clientFirst    bool
		clientCert, ok bool
	}{
		{name: "mutual TLS", clientCert: true, ok: true},
		{name: "handshake first", serverFirst: true, clientFirst: true, clientCert: true, ok: true},
		{name: "handshake first expected by the server only", serverFirst: true, clientCert: true, ok: false},
		{name: "no client certificate", clientCert: false, ok: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := natstest.RunServerWith(t, pki.ServerTLS(tt.serverFirst))
			n := external("tls://" + srv.Addr().String())
			n.TLS.CAFile = pki.CAFile
			n.TLS.HandshakeFirst = tt.clientFirst
			if tt.clientCert {
				n.TLS.CertFile, n.TLS.KeyFile = pki.ClientCert, pki.ClientKey
			}
			err := useJetStream(t, n)
			if tt.ok && err != nil {
				t.Fatalf("connect over TLS: %v", err)
			}
			if !tt.ok && err == nil {
				t.Fatal("connected, want a failure")
			}
		})
	}
}

func TestConnectUserPassword(t *testing.T) {
	srv := natstest.RunServerWith(t, func(o *server.Options) { o.Username, o.Password = "stage", "s3cret-pass" })
	n := external(srv.ClientURL())
	n.User, n.Password = "stage", "s3cret-pass"
	if err := useJetStream(t, n); err != nil {
		t.Fatalf("right password: %v", err)
	}
	n.Password = "wrong-pass"
	if err := useJetStream(t, n); err == nil {
		t.Fatal("wrong password connected")
	}
}

func TestConnectNKey(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := natstest.RunServerWith(t, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })
	n := external(srv.ClientURL())
	if err := useJetStream(t, n); err == nil {
		t.Fatal("connected without the NKey to a server that requires one")
	}
	n.NKeySeedFile = seedFile
	if err := useJetStream(t, n); err != nil {
		t.Fatalf("with the NKey seed: %v", err)
	}
}

func TestConnectCredsOperatorMode(t *testing.T) {
	op := boottest.NewOperator(t)
	srv := natstest.RunServerWith(t, op.Configure)
	n := external(srv.ClientURL())
	if err := useJetStream(t, n); err == nil {
		t.Fatal("connected without creds to a server in operator mode")
	}
	n.CredsFile = op.CredsFile
	if err := useJetStream(t, n); err != nil {
		t.Fatalf("with the creds file: %v", err)
	}
}

// writeContext writes a nats CLI context named name under dir (as
// $XDG_CONFIG_HOME) and returns its path.
func writeContext(t *testing.T, dir, name string, settings map[string]any) string {
	t.Helper()
	path := filepath.Join(dir, "nats", "context", name+".json")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(settings)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestConnectThroughContext connects to a server in operator mode with
// nothing configured but a context that gives the URL and the creds, as
// `nats context save` writes it.
func TestConnectThroughContext(t *testing.T) {
	op := boottest.NewOperator(t)
	srv := natstest.RunServerWith(t, op.Configure)
	xdg := t.TempDir()
	path := writeContext(t, xdg, "ops", map[string]any{
		"description": "the stage's account", "url": srv.ClientURL(), "creds": op.CredsFile,
		"socks_proxy": "", "nsc": "", "user_jwt": "", "windows_cert_store": "", "tls_first": false,
	})
	cfg := config.Default()
	cfg.NATS.Context = "ops"
	use, err := cfg.ApplyContext(func(k string) string { return map[string]string{"XDG_CONFIG_HOME": xdg}[k] })
	if err != nil {
		t.Fatal(err)
	}
	if use.Path != path || !slices.Equal(use.Fields, []string{"nats.url", "nats.creds_file"}) {
		t.Errorf("context use %+v, want path %s, fields nats.url nats.creds_file", use, path)
	}
	if cfg.NATS.IsEmbedded() {
		t.Error("a configuration with a context is taken as the embedded server's")
	}
	cfg.NATS.ConnectTimeout = config.Duration(2 * time.Second)
	if err := useJetStream(t, cfg.NATS); err != nil {
		t.Fatalf("through the context: %v", err)
	}
}

// TestJetStreamDomain uses a server whose JetStream is in domain hub: the
// domain, given in the configuration or by a context, and the API prefix
// it stands for reach JetStream; another domain does not, so the setting
// is what routes the requests.
func TestJetStreamDomain(t *testing.T) {
	srv := natstest.RunServerWith(t, func(o *server.Options) { o.JetStreamDomain = "hub" })
	xdg := t.TempDir()
	writeContext(t, xdg, "hub", map[string]any{"url": srv.ClientURL(), "jetstream_domain": "hub"})
	writeContext(t, xdg, "elsewhere", map[string]any{"url": srv.ClientURL(), "jetstream_domain": "elsewhere"})
	getenv := func(k string) string { return map[string]string{"XDG_CONFIG_HOME": xdg}[k] }

	tests := []struct {
		name   string
		edit   func(n *config.NATS)
		reach  bool
		domain string
	}{
		{"domain", func(n *config.NATS) { n.URL, n.JetStreamDomain = srv.ClientURL(), "hub" }, true, "hub"},
		{"API prefix", func(n *config.NATS) { n.URL, n.JetStreamAPIPrefix = srv.ClientURL(), "$JS.hub.API" }, true, ""},
		{"another domain", func(n *config.NATS) { n.URL, n.JetStreamDomain = srv.ClientURL(), "elsewhere" }, false, "elsewhere"},
		{"context's domain", func(n *config.NATS) { n.Context = "hub" }, true, "hub"},
		{"context's other domain", func(n *config.NATS) { n.Context = "elsewhere" }, false, "elsewhere"},
		{"domain set above the context's", func(n *config.NATS) { n.Context, n.JetStreamDomain = "elsewhere", "hub" }, true, "hub"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default()
			tt.edit(&cfg.NATS)
			if _, err := cfg.ApplyContext(getenv); err != nil {
				t.Fatal(err)
			}
			if cfg.NATS.JetStreamDomain != tt.domain {
				t.Errorf("domain %q, want %q", cfg.NATS.JetStreamDomain, tt.domain)
			}
			err := useJetStream(t, cfg.NATS)
			switch {
			case tt.reach && err != nil:
				t.Fatalf("JetStream not reached: %v", err)
			case !tt.reach && err == nil:
				t.Fatal("JetStream answered in a domain the server does not have")
			}
		})
	}
}
