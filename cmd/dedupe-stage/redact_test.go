package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// Secrets used by the redaction tests: each must never appear in anything
// the binary prints.
const (
	secretURLPass   = "url-pw-7Yq2c"
	secretURLToken  = "url-tok-R8s4d"
	secretAuthPass  = "auth-pw-M3x5e"
	secretAuthToken = "auth-tok-P0w9f"
	secretDSNPass   = "pg-pw-Kz91g"
	secretDSNQuoted = `pg q'uo\te-V7h`
)

var allSecrets = []string{secretURLPass, secretURLToken, secretAuthPass, secretAuthToken, secretDSNPass, secretDSNQuoted,
	// The keyword/value form's escaped spelling, and its halves.
	`pg q\'uo\\te-V7h`, `uo\te-V7h`, `uo\\te-V7h`}

// assertNoSecrets fails when out shows any secret.
func assertNoSecrets(t *testing.T, what, out string) {
	t.Helper()
	for _, s := range allSecrets {
		if strings.Contains(out, s) {
			t.Errorf("%s shows the secret %q:\n%s", what, s, grepLines(out, s))
		}
	}
}

// authServer runs a JetStream server that requires a user and password
// (token == "") or a token.
func authServer(t *testing.T, user, pass, token string) *server.Server {
	t.Helper()
	return authServerOn(t, t.TempDir(), -1, user, pass, token)
}

// authServerOn is authServer on a store dir and port (-1: a free one), for
// a restart on the same address.
func authServerOn(t *testing.T, dir string, port int, user, pass, token string) *server.Server {
	t.Helper()
	return natstest.RunServerWith(t, func(o *server.Options) {
		o.Port, o.StoreDir, o.Username, o.Password, o.Authorization = port, dir, user, pass, token
	})
}

// writeConfig writes a config for the binary: the NATS section given, a
// debug JSON log and a free HTTP address.
func writeConfig(t *testing.T, natsSection, extra string) (path, httpAddr string) {
	t.Helper()
	httpAddr = proctest.Addr(t)
	cfg := fmt.Sprintf(`nats:
%s
  create_streams: true
key:
  source: header
  header: Event-Id
input:
  ack_wait: 2s
state:
  data_dir: %s
  partitions: 2
  memory_budget: 32MiB
filter:
  expected_keys: 10000
http:
  addr: %s
log:
  level: debug
  format: json
%s`, natsSection, t.TempDir(), httpAddr, extra)
	path = filepath.Join(t.TempDir(), "stage.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, httpAddr
}

// runBinary runs the binary with args until it exits (bounded) and returns
// everything it printed.
func runBinary(t *testing.T, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%v still running after %v:\n%s", args, timeout, proctest.Tail(out.String(), 4000))
		return "", nil
	}
}

// TestSecretsNeverPrintedWhileRunning runs the binary against servers that
// require credentials, given in the URL and in the auth fields: it connects,
// forwards an event, logs at debug level and stops; nothing it printed shows
// a secret.
func TestSecretsNeverPrintedWhileRunning(t *testing.T) {
	userSrv := authServer(t, "app", secretURLPass, "")
	authSrv := authServer(t, "app", secretAuthPass, "")
	urlTokDir := t.TempDir()
	urlTokSrv := authServerOn(t, urlTokDir, -1, "", "", secretURLToken)
	tokSrv := authServer(t, "", "", secretAuthToken)
	hostPort := func(s *server.Server) string { return strings.TrimPrefix(s.ClientURL(), "nats://") }
	cases := []struct {
		name, natsSection string
		srv               *server.Server
		connect           nats.Option
		restart           func() // restarts the server mid-run, to log a reconnect
	}{
		{"password in the URL", "  url: nats://app:" + secretURLPass + "@" + hostPort(userSrv), userSrv, nats.UserInfo("app", secretURLPass), nil},
		{"token in the URL", "  url: nats://" + secretURLToken + "@" + hostPort(urlTokSrv), urlTokSrv, nats.Token(secretURLToken), func() {
			// nats.go's redacted URL keeps a token given as the user name.
			port := urlTokSrv.Addr().(*net.TCPAddr).Port
			urlTokSrv.Shutdown()
			urlTokSrv.WaitForShutdown()
			authServerOn(t, urlTokDir, port, "", "", secretURLToken)
		}},
		{"user and password fields", "  url: " + authSrv.ClientURL() + "\n  user: app\n  password: " + secretAuthPass, authSrv, nats.UserInfo("app", secretAuthPass), nil},
		{"token field", "  url: " + tokSrv.ClientURL() + "\n  token: " + secretAuthToken, tokSrv, nats.Token(secretAuthToken), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfgPath, addr := writeConfig(t, tc.natsSection, "")
			out, err := runBinary(t, 30*time.Second, "check-config", cfgPath)
			if err != nil {
				t.Fatalf("check-config: %v\n%s", err, out)
			}
			assertNoSecrets(t, "check-config", out)
			if !strings.Contains(out, "xxxxx") && strings.Contains(tc.natsSection, "@") {
				t.Errorf("check-config does not show the URL redacted:\n%s", out)
			}

			logf, err := os.CreateTemp(t.TempDir(), "log")
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(binary, "run", "--config", cfgPath)
			cmd.Stdout, cmd.Stderr = logf, logf
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
			})
			natstest.WaitFor(t, 60*time.Second, "the stage to be ready", func() bool {
				resp, err := http.Get("http://" + addr + "/readyz")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK
			})
			if tc.restart != nil {
				tc.restart()
				natstest.WaitFor(t, 30*time.Second, "the stage to log its reconnect", func() bool {
					b, _ := os.ReadFile(logf.Name())
					return strings.Contains(string(b), "nats reconnected")
				})
			}
			nc, err := nats.Connect(tc.srv.ClientURL(), tc.connect)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			if err := nc.PublishMsg(&nats.Msg{Subject: "events.redact", Header: nats.Header{"Event-Id": {"r-1"}}, Data: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			natstest.WaitFor(t, 30*time.Second, "the event forwarded", func() bool {
				m, err := nc.Request("$JS.API.STREAM.INFO.EVENTS_DEDUPED", nil, 2*time.Second)
				return err == nil && strings.Contains(string(m.Data), `"messages":1`)
			})
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				if err != nil {
					t.Errorf("exit after SIGTERM: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("still running 20s after SIGTERM")
			}
			b, _ := os.ReadFile(logf.Name())
			log := string(b)
			if !strings.Contains(log, "stopped cleanly") {
				t.Errorf("the log is not the whole run:\n%s", proctest.Tail(log, 3000))
			}
			assertNoSecrets(t, "the log", log)
		})
	}
}

// TestSecretsNeverPrintedOnFailure covers what the binary prints when it
// fails: a connect to an unreachable loopback URL with a password, a token
// in an unreachable URL, a PostgreSQL sink that cannot be reached (URL and
// quoted keyword/value DSNs), and check-config on valid and invalid configs
// that hold every kind of secret.
func TestSecretsNeverPrintedOnFailure(t *testing.T) {
	srv := natstest.RunServer(t, "")
	totals := func(dsn string) string {
		return fmt.Sprintf(`totals:
  enabled: true
  group: {source: header, header: Group}
  bucket: 1m
  sinks:
    postgres:
      dsn: %q
      create_schema: true
`, dsn)
	}
	dsnURL := "postgres://app:" + secretDSNPass + "@127.0.0.1:1/ads?sslmode=disable&connect_timeout=2"
	dsnKV := `host=127.0.0.1 port=1 user=app password='` + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(secretDSNQuoted) + `' dbname=ads sslmode=disable connect_timeout=2`
	dsnBroken := "host=127.0.0.1 port=1 user=app password='" + secretDSNPass + " dbname=ads"
	// An NKey seed written where the seed file's path belongs.
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	allSecrets = append(allSecrets, string(seed))
	t.Cleanup(func() { allSecrets = allSecrets[:len(allSecrets)-1] })
	runs := []struct {
		name, natsSection, extra string
		wantInOutput             string // the failure must still be told
	}{
		{"unreachable URL with a password", "  url: nats://app:" + secretURLPass + "@127.0.0.1:1", "", "127.0.0.1:1"},
		{"unreachable URL with a token", "  url: nats://" + secretURLToken + "@127.0.0.1:1", "", "127.0.0.1:1"},
		{"NKey seed instead of its file", "  url: nats://127.0.0.1:1\n  nkey_seed_file: " + string(seed), "", "nkey_seed_file"},
		{"unreachable with auth fields", "  url: nats://127.0.0.1:1\n  user: app\n  password: " + secretAuthPass, "", "127.0.0.1:1"},
		{"unreachable PostgreSQL, URL DSN", "  url: " + srv.ClientURL(), totals(dsnURL), "postgres"},
		{"unreachable PostgreSQL, quoted keyword/value DSN", "  url: " + srv.ClientURL() + "\n  token: " + secretAuthToken, totals(dsnKV), "postgres"},
		{"PostgreSQL DSN that does not parse", "  url: " + srv.ClientURL(), totals(dsnBroken), "postgres"},
	}
	for _, tc := range runs {
		t.Run(tc.name, func(t *testing.T) {
			cfgPath, _ := writeConfig(t, tc.natsSection, tc.extra)
			out, _ := runBinary(t, 30*time.Second, "check-config", cfgPath)
			assertNoSecrets(t, "check-config", out)
			out, err := runBinary(t, 60*time.Second, "run", "--config", cfgPath)
			if err == nil {
				t.Fatalf("run succeeded; want a failure:\n%s", proctest.Tail(out, 3000))
			}
			if !strings.Contains(out, tc.wantInOutput) {
				t.Errorf("the failure does not name %q:\n%s", tc.wantInOutput, proctest.Tail(out, 3000))
			}
			assertNoSecrets(t, "run", out)
		})
	}

	// The usage text printed for -h shows the flags' defaults, which come
	// from the config and the environment; a bad flag is named in a line
	// or two. inspect and forget list only theirs (--config, the
	// connection's, --http-addr).
	for _, args := range [][]string{{"run", "--bogus"}, {"run", "-h"}, {"inspect", "-h"}, {"forget", "-h"}, {"check-config", "-h"}} {
		cmd := exec.Command(binary, args...)
		cmd.Env = append(os.Environ(), "DEDUPE_NATS_URL=nats://app:"+secretURLPass+"@127.0.0.1:1", "DEDUPE_NATS_TOKEN="+secretAuthToken)
		out, _ := cmd.CombinedOutput()
		flagShown := "nats-url"
		switch {
		case args[1] == "--bogus":
			flagShown = "unknown flag --bogus"
		case args[0] == "inspect" || args[0] == "forget":
			flagShown = "http-addr"
		}
		if !strings.Contains(string(out), flagShown) {
			t.Errorf("%v does not print the usage:\n%s", args, out)
		}
		assertNoSecrets(t, fmt.Sprint(args), string(out))
	}

	// check-config on invalid configurations: the errors name the values.
	bad := map[string]string{
		"URL that does not parse":   "nats:\n  url: nats://app:" + secretURLPass + "@127.0.0.1:notaport\n",
		"URL list, one bad":         "nats:\n  url: nats://app:" + secretURLPass + "@127.0.0.1:4222,ftp://" + secretURLToken + "@h\n",
		"secret in the wrong place": "nats: nats://app:" + secretURLPass + "@127.0.0.1:4222\n",
		"password without user":     "nats:\n  url: nats://127.0.0.1:4222\n  password: " + secretAuthPass + "\n",
		"two auth methods":          "nats:\n  url: nats://127.0.0.1:4222\n  user: app\n  password: " + secretAuthPass + "\n  token: " + secretAuthToken + "\n",
		"token of the wrong type":   "nats:\n  url: nats://127.0.0.1:4222\n  token: [" + secretAuthToken + "]\n",
		"unknown field beside dsn":  "totals:\n  sinks:\n    postgres:\n      dsn: " + dsnURL + "\n      nope: 1\n",
	}
	for name, yaml := range bad {
		t.Run("check-config "+name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad.yaml")
			if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := runBinary(t, 30*time.Second, "check-config", path)
			if err == nil {
				t.Fatalf("check-config accepted it:\n%s", out)
			}
			assertNoSecrets(t, "check-config", out)
			// The same through run, which also reads the environment.
			out, _ = runBinary(t, 30*time.Second, "run", "--config", path)
			assertNoSecrets(t, "run", out)
		})
	}
}
