package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// startBinary runs `dedupe-stage run args...` with env added to this
// process's environment, and waits until /readyz on httpAddr answers 200.
func startBinary(t *testing.T, httpAddr string, env []string, args ...string) *proc {
	t.Helper()
	p := spawn(t, env, append([]string{"run"}, args...)...)
	natstest.WaitFor(t, 60*time.Second, "the stage to be ready", func() bool {
		if !p.Running() {
			t.Fatalf("the stage exited: %v\n%s", p.Err(), p.LogTail(3000))
		}
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// spawn starts the binary with args and env added to this process's
// environment; it is killed when the test ends.
func spawn(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	pp, err := proctest.Start(proctest.Spec{Name: "dedupe-stage", Bin: binary, Args: args, Env: env,
		LogPath: filepath.Join(t.TempDir(), "stage.log")})
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{pp}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("stage log:\n%s", p.LogTail(4000))
		}
	})
	return p
}

// output runs the binary to completion and returns its exit code and
// combined output.
func output(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

// streamMsgs returns the number of messages in stream.
func streamMsgs(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	st, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// metricLines returns the /metrics lines that start with prefix.
func metricLines(t *testing.T, httpAddr, prefix string) []string {
	t.Helper()
	body, err := httpGet("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// quickstartSection returns the README's Quickstart section.
func quickstartSection(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "## Quickstart")
	if i < 0 {
		t.Fatal("README.md has no Quickstart section")
	}
	s = s[i+len("## Quickstart"):]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	return s
}

// TestQuickstart does what the README's quickstart does, against the
// embedded default (only the ports and the data dir moved so that the test
// can run anywhere), and checks that the stage does what the README says
// each command shows.
func TestQuickstart(t *testing.T) {
	readme := quickstartSection(t)
	// The commands and what the README says they show.
	for _, want := range []string{
		"dedupe-stage run --key-header Order-Id",
		`nats pub events.orders '{"order":1}' -H 'Order-Id:order-1'`,
		`nats pub events.orders 'no key'`,
		"EVENTS 3, EVENTS_DEDUPED 1, DEDUPE_DLQ 1",
		"deduped.events.orders, Nats-Msg-Id: order-1",
		"Dedupe-Reason: no_key",
		`"found": true`,
		`"inside_window": true`,
		`dedupe_messages_total{outcome="new",partition="5"} 1`,
		`dedupe_messages_total{outcome="repeat",partition="5"} 1`,
		`dedupe_unpartitioned_dead_letters_total 1`,
		`dedupe_dead_letters_total{reason="no_key"} 1`,
	} {
		if !strings.Contains(readme, want) {
			t.Errorf("the README's quickstart no longer says %q; keep it and this test in step", want)
		}
	}

	dir := t.TempDir()
	httpAddr := proctest.Addr(t)
	natsPort := proctest.Port(t)
	startBinary(t, httpAddr, nil, "--key-header", "Order-Id",
		"--embedded-port", strconv.Itoa(natsPort), "--http-addr", httpAddr, "--data-dir", filepath.Join(dir, "data"))

	// nats pub is a core publish; the stream stores what it receives.
	nc, js := natstest.Connect(t, fmt.Sprintf("nats://127.0.0.1:%d", natsPort))
	pub := func(data string, hdr nats.Header) {
		if err := nc.PublishMsg(&nats.Msg{Subject: "events.orders", Data: []byte(data), Header: hdr}); err != nil {
			t.Fatal(err)
		}
	}
	pub(`{"order":1}`, nats.Header{"Order-Id": {"order-1"}})
	pub(`{"order":1}`, nats.Header{"Order-Id": {"order-1"}})
	pub(`no key`, nil)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 30*time.Second, "the three messages to be stored and judged", func() bool {
		return streamMsgs(t, js, "EVENTS") == 3 && streamMsgs(t, js, "DEDUPE_DLQ") == 1
	})
	natstest.WaitDrained(t, js, "EVENTS", "dedupe-stage", 30*time.Second)

	// nats stream ls: EVENTS 3, EVENTS_DEDUPED 1, DEDUPE_DLQ 1.
	for stream, want := range map[string]uint64{"EVENTS": 3, "EVENTS_DEDUPED": 1, "DEDUPE_DLQ": 1} {
		if got := streamMsgs(t, js, stream); got != want {
			t.Errorf("%s holds %d messages, the README says %d", stream, got, want)
		}
	}
	// nats stream get EVENTS_DEDUPED 1
	ctx := context.Background()
	out, _ := js.Stream(ctx, "EVENTS_DEDUPED")
	m, err := out.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != "deduped.events.orders" || m.Header.Get(jetstream.MsgIDHeader) != "order-1" {
		t.Errorf("EVENTS_DEDUPED 1 is on %s with Nats-Msg-Id %q; the README says deduped.events.orders, order-1",
			m.Subject, m.Header.Get(jetstream.MsgIDHeader))
	}
	// nats stream get DEDUPE_DLQ 1
	dlq, _ := js.Stream(ctx, "DEDUPE_DLQ")
	if m, err = dlq.GetMsg(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if m.Header.Get("Dedupe-Reason") != "no_key" || m.Header.Get("Dedupe-Original-Sequence") != "3" {
		t.Errorf("DEDUPE_DLQ 1 headers %v; the README says Dedupe-Reason: no_key, original sequence 3", m.Header)
	}
	// dedupe-stage inspect order-1
	code, body := output(t, nil, "inspect", "--http-addr", httpAddr, "order-1")
	if code != 0 || !strings.Contains(body, `"found": true`) || !strings.Contains(body, `"inside_window": true`) {
		t.Errorf("inspect order-1: exit %d:\n%s", code, body)
	}
	// curl .../metrics | grep -E '^dedupe_(messages|dead_letters|unpartitioned_dead_letters)_total' | grep -v ' 0$'
	all := metricLines(t, httpAddr, "dedupe_messages_total")
	all = append(all, metricLines(t, httpAddr, "dedupe_dead_letters_total")...)
	all = append(all, metricLines(t, httpAddr, "dedupe_unpartitioned_dead_letters_total")...)
	var got []string
	for _, l := range all {
		if !strings.HasSuffix(l, " 0") {
			got = append(got, l)
		}
	}
	// Every outcome of every partition and every reason is there from the
	// start, at 0.
	for _, zero := range []string{`dedupe_messages_total{outcome="stale",partition="7"} 0`, `dedupe_dead_letters_total{reason="bad_payload"} 0`} {
		if !slices.Contains(all, zero) {
			t.Errorf("/metrics lacks %s", zero)
		}
	}
	joined := strings.Join(got, "\n")
	for _, want := range []string{
		`dedupe_messages_total{outcome="new",partition="5"} 1`,
		`dedupe_messages_total{outcome="repeat",partition="5"} 1`,
		`dedupe_unpartitioned_dead_letters_total 1`,
		`dedupe_dead_letters_total{reason="no_key"} 1`,
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("/metrics lacks %s; it has:\n%s", want, joined)
		}
	}
	if len(got) != 4 {
		t.Errorf("/metrics has %d message and dead-letter series, the README shows 4:\n%s", len(got), joined)
	}
	if lines := metricLines(t, httpAddr, "dedupe_build_info{"); len(lines) != 1 {
		t.Errorf("/metrics has no dedupe_build_info: %v", lines)
	}
	// The healthcheck finds the stage from the environment alone.
	if code, body := output(t, []string{"DEDUPE_HTTP_ADDR=" + httpAddr}, "healthcheck"); code != 0 {
		t.Errorf("healthcheck with DEDUPE_HTTP_ADDR: exit %d: %s", code, body)
	}
}

// TestCheckConfigAgreesWithRun gives check-config and run the same file,
// environment and flags, and checks that what check-config prints is what
// run then does.
func TestCheckConfigAgreesWithRun(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "stage.yaml")
	if err := os.WriteFile(cfgPath, []byte("state:\n  partitions: 2\n  memory_budget: 64MiB\nfilter:\n  expected_keys: 10000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	httpAddr := proctest.Addr(t)
	natsPort := proctest.Port(t)
	dataDir := filepath.Join(dir, "data")
	env := []string{
		"DEDUPE_HTTP_ADDR=" + httpAddr,
		"DEDUPE_DATA_DIR=" + dataDir,
		"DEDUPE_EMBEDDED_PORT=" + strconv.Itoa(natsPort),
		"DEDUPE_EMBEDDED_TOKEN=t0ken-value",
		"DEDUPE_PARTITIONS=3", // the flag below wins
	}
	args := []string{"-config", cfgPath, "--partitions", "4", "--key-header", "Order-Id", "--log-level", "debug"}

	code, out := output(t, env, append([]string{"check-config"}, args...)...)
	if code != 0 {
		t.Fatalf("check-config: exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"file " + cfgPath + ", then environment DEDUPE_DATA_DIR DEDUPE_EMBEDDED_PORT DEDUPE_EMBEDDED_TOKEN DEDUPE_HTTP_ADDR DEDUPE_PARTITIONS, then flags --key-header --log-level --partitions",
		"partitions:  4",
		`key:         header "Order-Id"`,
		fmt.Sprintf("embedded nats-server on 127.0.0.1:%d", natsPort),
		"JetStream store " + filepath.Join(dataDir, "nats"),
		"http:        " + httpAddr,
		"EVENTS: max_age 7d",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("check-config output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "t0ken-value") {
		t.Errorf("check-config prints the token:\n%s", out)
	}

	// run with the same file, environment and flags does what it said.
	p := startBinary(t, httpAddr, env, args...) // ready on the http.addr from the environment
	layout, err := os.ReadFile(filepath.Join(dataDir, "state", "LAYOUT"))
	if err != nil || strings.TrimSpace(string(layout)) != "partitions 4\nstore one-badger" {
		t.Errorf("run's state LAYOUT %q, %v; check-config said 4 partitions in %s", layout, err, dataDir)
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	if nc, err := nats.Connect(url); err == nil {
		nc.Close()
		t.Errorf("the embedded server on %s takes a client without the token", url)
	}
	nc, err := nats.Connect(url, nats.Token("t0ken-value"))
	if err != nil {
		t.Fatalf("connect with the token to the port check-config named: %v", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for range 2 {
		if err := nc.PublishMsg(&nats.Msg{Subject: "events.x", Header: nats.Header{"Order-Id": {"k1"}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 30*time.Second, "both copies stored", func() bool { return streamMsgs(t, js, "EVENTS") == 2 })
	natstest.WaitDrained(t, js, "EVENTS", "dedupe-stage", 30*time.Second)
	if n := streamMsgs(t, js, "EVENTS_DEDUPED"); n != 1 {
		t.Errorf("two copies keyed by Order-Id forwarded %d times, want 1 (the key check-config printed)", n)
	}
	st, _ := js.Stream(context.Background(), "EVENTS")
	if age := st.CachedInfo().Config.MaxAge; age != 7*24*time.Hour {
		t.Errorf("EVENTS created with max_age %v; check-config said 7d", age)
	}
	// The embedded server's token is a secret like any other, even at debug.
	if b := p.Log(); strings.Contains(b, "t0ken-value") {
		t.Errorf("run's log shows the embedded token:\n%s", grepLines(b, "t0ken-value"))
	}
}

func TestCheckConfigForms(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(cfgPath, []byte("state: {partitions: 3}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DEDUPE_PARTITIONS", "")
	cases := []struct {
		name string
		env  string
		args []string
		want string
	}{
		{"bare file", "", []string{cfgPath}, "partitions:  3"},
		{"-config file", "", []string{"-config", cfgPath}, "partitions:  3"},
		{"--config=file", "", []string{"--config=" + cfgPath}, "partitions:  3"},
		{"flags after a bare file", "", []string{cfgPath, "--partitions", "5"}, "partitions:  5"},
		{"flags before a bare file", "", []string{"--partitions=6", cfgPath}, "partitions:  6"},
		{"DEDUPE_CONFIG", cfgPath, nil, "partitions:  3"},
		{"no file", "", nil, "partitions:  8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(configEnv, c.env)
			var out, errb strings.Builder
			if code := realMain(append([]string{"check-config"}, c.args...), &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			if !strings.Contains(out.String(), c.want) {
				t.Errorf("output lacks %q:\n%s", c.want, out.String())
			}
		})
	}
	var out, errb strings.Builder
	other := filepath.Join(dir, "other.yaml")
	if code := realMain([]string{"check-config", "--config", cfgPath, other}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "two config files") {
		t.Errorf("two config files: exit %d, %q", code, errb.String())
	}
}

func TestInspectHelpListsOnlyItsFlags(t *testing.T) {
	for _, cmd := range []string{"inspect", "forget", "healthcheck"} {
		t.Run(cmd, func(t *testing.T) {
			var out, errb strings.Builder
			if code := realMain([]string{cmd, "--help"}, &out, &errb); code != 0 {
				t.Fatalf("%s --help: exit %d", cmd, code)
			}
			help := out.String() // help goes to stdout, as kubectl's and helm's
			want := []string{"-config", "-http-addr"}
			if cmd != "healthcheck" { // they ask over NATS, connected as run is
				want = append(want, "-server", "-context", "-creds", "-admin-subject", "-timeout")
			}
			for _, want := range want {
				if !strings.Contains(help, want) {
					t.Errorf("%s --help lacks %s:\n%s", cmd, want, help)
				}
			}
			for _, not := range []string{"-nats-url", "-partitions", "-data-dir", "-embedded-port", "-key-header"} {
				if strings.Contains(help, not) {
					t.Errorf("%s --help lists run's flag %s:\n%s", cmd, not, help)
				}
			}
		})
	}
	// run's own help still lists them.
	var out, errb strings.Builder
	realMain([]string{"run", "--help"}, &out, &errb)
	if !strings.Contains(out.String(), "-nats-url") || !strings.Contains(out.String(), "-embedded-monitor-port") {
		t.Errorf("run --help:\n%s", out.String())
	}
}

func TestHealthcheckFollowsTheConfiguredAddress(t *testing.T) {
	healthy := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" || !healthy {
			http.Error(w, "unhealthy", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	cfgPath := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfgPath, []byte("http: {addr: '127.0.0.1:"+port+"'}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DEDUPE_HTTP_ADDR", "")
	t.Setenv(configEnv, "")
	cases := []struct {
		name string
		env  map[string]string
		args []string
	}{
		// What the image sets: a listen address on every interface.
		{"DEDUPE_HTTP_ADDR on 0.0.0.0", map[string]string{"DEDUPE_HTTP_ADDR": "0.0.0.0:" + port}, nil},
		{"DEDUPE_HTTP_ADDR", map[string]string{"DEDUPE_HTTP_ADDR": "127.0.0.1:" + port}, nil},
		{"DEDUPE_CONFIG", map[string]string{configEnv: cfgPath}, nil},
		{"--config", nil, []string{"--config", cfgPath}},
		{"--http-addr", nil, []string{"--http-addr", ":" + port}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			var out, errb strings.Builder
			if code := realMain(append([]string{"healthcheck"}, c.args...), &out, &errb); code != 0 {
				t.Errorf("healthcheck: exit %d: %s", code, errb.String())
			}
		})
	}
	healthy = false
	t.Setenv("DEDUPE_HTTP_ADDR", "127.0.0.1:"+port)
	var out, errb strings.Builder
	if code := realMain([]string{"healthcheck"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "503") {
		t.Errorf("healthcheck of an unhealthy stage: exit %d, %q", code, errb.String())
	}
	t.Setenv("DEDUPE_HTTP_ADDR", "127.0.0.1:1")
	if code := realMain([]string{"healthcheck"}, &out, &errb); code == 0 {
		t.Error("healthcheck of nothing listening: exit 0")
	}
}

// TestStartupErrorsToldAtOnce: each bad start exits with its cause well
// before the old 30 s wait for the embedded server ran out.
func TestStartupErrorsToldAtOnce(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := strconv.Itoa(taken.Addr().(*net.TCPAddr).Port)
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	// A stage that holds a data dir, for the lock case.
	heldDir := filepath.Join(t.TempDir(), "data")
	heldHTTP := proctest.Addr(t)
	startBinary(t, heldHTTP, nil, "--data-dir", heldDir, "--embedded-port", strconv.Itoa(proctest.Port(t)), "--http-addr", heldHTTP)

	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"embedded port taken", []string{"--data-dir", filepath.Join(t.TempDir(), "d"), "--embedded-port", takenPort},
			[]string{"embedded nats-server did not start", "127.0.0.1:" + takenPort, "address already in use", "--embedded-port"}},
		{"data dir cannot be created", []string{"--data-dir", filepath.Join(file, "data"), "--embedded-port", strconv.Itoa(proctest.Port(t))},
			[]string{"state.data_dir not usable", "cannot create", "not a directory"}},
		{"data dir held by another stage", []string{"--data-dir", heldDir, "--embedded-port", strconv.Itoa(proctest.Port(t))},
			[]string{"state.data_dir not usable", heldDir + " is in use by another process"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := spawn(t, nil, append([]string{"run", "--http-addr", proctest.Addr(t)}, c.args...)...)
			select {
			case <-p.Exited():
			case <-time.After(20 * time.Second):
				t.Fatal("still starting after 20s")
			}
			if p.Err() == nil {
				t.Fatal("exit 0")
			}
			b := p.Log()
			for _, want := range c.want {
				if !strings.Contains(b, want) {
					t.Errorf("output lacks %q:\n%s", want, proctest.Tail(b, 2000))
				}
			}
			// The data dir is checked and locked before the embedded
			// server starts on it.
			if c.name != "embedded port taken" && strings.Contains(b, "embedded nats-server started") {
				t.Errorf("the embedded server started before the data dir was checked:\n%s", b)
			}
		})
	}
}
