package boot_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/boot"
)

// embeddedConfig is the embedded default on a free loopback port, storing
// in a temporary directory.
func embeddedConfig(t *testing.T) config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.NATS.Embedded.Port = -1
	cfg.State.DataDir = t.TempDir()
	return cfg
}

func startEmbedded(t *testing.T, cfg config.Config) *server.Server {
	t.Helper()
	s, err := boot.StartEmbedded(cfg.EmbeddedServer(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// createInputAsTheStage connects as the stage does (with the configured
// credentials, in process) and creates the input stream.
func createInputAsTheStage(t *testing.T, cfg config.Config, s *server.Server) {
	t.Helper()
	nc, err := boot.Connect(cfg.NATS.Dial(), s, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("the stage cannot connect to its own server: %v", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		t.Fatal(err)
	}
}

// jsPublish publishes one message to JetStream on a new connection made
// with opts and reports the error of connecting or publishing.
func jsPublish(url string, opts ...nats.Option) error {
	nc, err := nats.Connect(url, append(opts, nats.MaxReconnects(0))...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = js.Publish(ctx, "events.auth", []byte("x"))
	return err
}

func TestEmbeddedAuthRefusesProducersWithoutCredentials(t *testing.T) {
	cases := []struct {
		name   string
		set    func(e *config.Embedded)
		good   []nats.Option
		bad    []nats.Option
		system bool
	}{
		{"user and password", func(e *config.Embedded) { e.User, e.Password = "producer", "s3cret" },
			[]nats.Option{nats.UserInfo("producer", "s3cret")}, []nats.Option{nats.UserInfo("producer", "wrong")}, false},
		{"token", func(e *config.Embedded) { e.Token = "t0ken" },
			[]nats.Option{nats.Token("t0ken")}, []nats.Option{nats.Token("wrong")}, false},
		{"user and password with the system account", func(e *config.Embedded) {
			e.User, e.Password = "producer", "s3cret"
			e.SystemAccount, e.SystemPassword = true, "sys-s3cret"
		}, []nats.Option{nats.UserInfo("producer", "s3cret")}, []nats.Option{nats.UserInfo("sys", "wrong")}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := embeddedConfig(t)
			c.set(&cfg.NATS.Embedded)
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			s := startEmbedded(t, cfg)
			createInputAsTheStage(t, cfg, s)

			if err := jsPublish(s.ClientURL()); !errors.Is(err, nats.ErrAuthorization) {
				t.Errorf("a producer without credentials: %v, want an authorization violation", err)
			}
			if err := jsPublish(s.ClientURL(), c.bad...); !errors.Is(err, nats.ErrAuthorization) {
				t.Errorf("a producer with wrong credentials: %v, want an authorization violation", err)
			}
			if err := jsPublish(s.ClientURL(), c.good...); err != nil {
				t.Errorf("a producer with the credentials: %v", err)
			}
			if c.system {
				assertServerPing(t, s.ClientURL(), nats.UserInfo("sys", "sys-s3cret"))
			}
		})
	}
}

// assertServerPing does what `nats server ping` does.
func assertServerPing(t *testing.T, url string, opts ...nats.Option) {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect as the system user: %v", err)
	}
	defer nc.Close()
	msg, err := nc.Request("$SYS.REQ.SERVER.PING", nil, 5*time.Second)
	if err != nil {
		t.Fatalf("server ping: %v", err)
	}
	if !strings.Contains(string(msg.Data), `"dedupe-stage-embedded"`) {
		t.Errorf("server ping answered %s, want the embedded server's name", msg.Data)
	}
}

func TestEmbeddedSystemAccountWithoutProducerAuth(t *testing.T) {
	cfg := embeddedConfig(t)
	cfg.NATS.Embedded.SystemAccount, cfg.NATS.Embedded.SystemPassword = true, "sys-s3cret"
	s := startEmbedded(t, cfg)
	createInputAsTheStage(t, cfg, s)
	// Producers need no credentials, as without the system account.
	if err := jsPublish(s.ClientURL()); err != nil {
		t.Errorf("a producer without credentials: %v", err)
	}
	assertServerPing(t, s.ClientURL(), nats.UserInfo("sys", "sys-s3cret"))
}

func TestEmbeddedDefaultsWidenNothing(t *testing.T) {
	cfg := embeddedConfig(t)
	s := startEmbedded(t, cfg)
	if a := s.MonitorAddr(); a != nil {
		t.Errorf("monitoring served on %v by default", a)
	}
	// No system user: the ping has no responder a producer may reach.
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if msg, err := nc.Request("$SYS.REQ.SERVER.PING", nil, 2*time.Second); err == nil && !strings.Contains(string(msg.Data), "error") {
		t.Errorf("server ping answered a client without credentials: %s", msg.Data)
	}
	if !strings.HasPrefix(s.ClientURL(), "nats://127.0.0.1:") {
		t.Errorf("embedded server at %s, want loopback", s.ClientURL())
	}
}

func TestEmbeddedMonitorPort(t *testing.T) {
	cfg := embeddedConfig(t)
	cfg.NATS.Embedded.MonitorPort = -1
	s := startEmbedded(t, cfg)
	a := s.MonitorAddr()
	if a == nil {
		t.Fatal("no monitoring listener")
	}
	for _, path := range []string{"/varz", "/jsz"} {
		resp, err := http.Get("http://" + a.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"server_id"`) {
			t.Errorf("GET %s: %s %.200s", path, resp.Status, body)
		}
	}
}

func TestEmbeddedPortTakenFailsAtOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := embeddedConfig(t)
	cfg.NATS.Embedded.Port = ln.Addr().(*net.TCPAddr).Port
	done := make(chan error, 1)
	go func() {
		s, err := boot.StartEmbedded(cfg.EmbeddedServer(), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if s != nil {
			s.Shutdown()
		}
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("StartEmbedded on a port in use still waiting after 20s")
	}
	if !errors.Is(err, boot.ErrEmbeddedStart) || !strings.Contains(err.Error(), "address already in use") ||
		!strings.Contains(err.Error(), strconv.Itoa(cfg.NATS.Embedded.Port)) {
		t.Errorf("StartEmbedded on a port in use: %v; want ErrEmbeddedStart naming the port and 'address already in use'", err)
	}
}
