package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/boot/boottest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// TestRunStatusAndCheckConfigThroughContext runs the binary against a
// server that requires mutual TLS with the handshake first and keeps its
// JetStream in domain hub, with nothing in the config file about the
// server: a nats CLI context gives the URL, the CA, the client
// certificate, TLS first and the domain. run forwards each key once,
// status reads the consumer, check-config names the context; a flag beats
// the context's domain (for status and run alike), and without the context
// there is no server.
func TestRunStatusAndCheckConfigThroughContext(t *testing.T) {
	pki := boottest.NewPKI(t)
	srv := natstest.RunServerWith(t, func(o *server.Options) {
		pki.ServerTLS(true)(o)
		o.JetStreamDomain = "hub"
	})
	url := "tls://" + srv.Addr().String()
	xdg := t.TempDir()
	ctxPath := filepath.Join(xdg, "nats", "context", "secure.json")
	ctx, err := json.Marshal(map[string]any{
		"description": "mutual TLS, handshake first", "url": url, "ca": pki.CAFile,
		"cert": pki.ClientCert, "key": pki.ClientKey, "tls_first": true, "jetstream_domain": "hub",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(ctxPath), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ctxPath, ctx, 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"XDG_CONFIG_HOME=" + xdg}

	addr := proctest.Addr(t)
	cfgPath := filepath.Join(t.TempDir(), "stage.yaml")
	if err := os.WriteFile(cfgPath, []byte(stageConfig("", t.TempDir(), addr)), 0o600); err != nil {
		t.Fatal(err)
	}

	code, out := output(t, env, "check-config", "--config", cfgPath, "--context", "secure")
	if code != 0 {
		t.Fatalf("check-config: exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"nats context secure (" + ctxPath + ") for nats.url nats.tls.cert_file nats.tls.key_file nats.tls.ca_file nats.tls.handshake_first nats.jetstream_domain",
		"server " + url + " (no authentication, TLS, handshake first), JetStream domain hub",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("check-config does not say %q:\n%s", want, out)
		}
	}

	p := startBinary(t, addr, env, "--config", cfgPath, "--context", "secure")
	nc, err := nats.Connect(url, nats.RootCAs(pki.CAFile), nats.ClientCert(pki.ClientCert, pki.ClientKey), nats.TLSHandshakeFirst())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.NewWithDomain(nc, "hub")
	if err != nil {
		t.Fatal(err)
	}
	unique := publishWithRepeats(t, js, "ctx", 300)
	drained(t, js, 60*time.Second)
	assertOutputOnce(t, js, unique)
	if log := p.Log(); !strings.Contains(log, "nats context secure") {
		t.Errorf("run does not log the context it used:\n%s", grepLines(log, "starting"))
	}

	// status connects the same way, the context named by $NATS_CONTEXT.
	code, out = output(t, append(env, "NATS_CONTEXT=secure"), "status", "--config", cfgPath)
	if code != 0 || !strings.Contains(out, "consumer dedupe-stage on EVENTS: 0 pending") {
		t.Errorf("status through the context: exit %d:\n%s", code, out)
	}
	// A flag beats the context: JetStream in domain elsewhere does not exist.
	code, out = output(t, append(env, "NATS_CONTEXT=secure"), "status", "--config", cfgPath, "--js-domain", "elsewhere")
	if code == 0 || !strings.Contains(out, "no responders") {
		t.Errorf("status with --js-domain elsewhere: exit %d, want no JetStream to answer:\n%s", code, out)
	}
	// Without the context, the file names no server: the embedded
	// default, where no stage runs (on a port nothing listens on).
	code, out = output(t, env, "status", "--config", cfgPath, "--embedded-port", strconv.Itoa(proctest.Port(t)))
	if code != 3 || !strings.Contains(out, "the stage is not running") {
		t.Errorf("status without a server: exit %d:\n%s", code, out)
	}
	// run too makes its JetStream API in the domain given: in domain
	// elsewhere, nothing answers its stream set-up (which it retries, as
	// for a JetStream still starting).
	other := spawn(t, env, "run", "--config", cfgPath, "--context", "secure", "--js-domain", "elsewhere",
		"--data-dir", t.TempDir(), "--http-addr", "")
	natstest.WaitFor(t, 60*time.Second, "run in domain elsewhere to find no JetStream", func() bool {
		return strings.Contains(other.Log(), "start-up: waiting for the server") && strings.Contains(other.Log(), "no JetStream answered")
	})
	if err := other.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("the stage is not ready after the checks: %v", err)
	}
	if resp != nil {
		resp.Body.Close()
	}
}

// TestConnectionSecretsNotPrinted: the nats CLI's variables and flags for
// a password and a token never show in check-config's output, its
// errors, or the usage text.
func TestConnectionSecretsNotPrinted(t *testing.T) {
	const pw, tok = "pw-never-printed", "token-never-printed"
	env := []string{"NATS_URL=nats://127.0.0.1:1", "NATS_USER=stage", "NATS_PASSWORD=" + pw}
	code, out := output(t, env, "check-config")
	if code != 0 || strings.Contains(out, pw) || !strings.Contains(out, "user stage") {
		t.Errorf("check-config with NATS_PASSWORD: exit %d:\n%s", code, out)
	}
	code, out = output(t, nil, "check-config", "-s", "nats://127.0.0.1:1", "--user", "stage", "--password", pw, "--token", tok)
	if code == 0 || strings.Contains(out, pw) || strings.Contains(out, tok) || !strings.Contains(out, "nats.token") {
		t.Errorf("check-config with two authentication methods: exit %d, want an error naming nats.token, no secret:\n%s", code, out)
	}
	code, out = output(t, append(env, "NATS_TOKEN="+tok), "run", "-h")
	if code != 0 || strings.Contains(out, pw) || strings.Contains(out, tok) || !strings.Contains(out, "-tlsfirst") {
		t.Errorf("run -h: exit %d:\n%s", code, out)
	}
}
