package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// statusExit runs `status` with args and returns its output (stdout and
// stderr) and exit code.
func statusExit(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := runBinary(t, 60*time.Second, append([]string{"status"}, args...)...)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out, 0
	case errors.As(err, &exit):
		return out, exit.ExitCode()
	}
	t.Fatalf("status %v: %v\n%s", args, err, out)
	return "", 0
}

// statusJSON is the part of `status --json` the tests read.
type statusJSON struct {
	Partitions []struct {
		Partition int    `json:"partition"`
		PinID     string `json:"pin_id"`
		State     string `json:"state"`
		Waiting   *struct {
			For          string `json:"for"`
			HandOverTime string `json:"hand_over_time"`
		} `json:"waiting"`
	} `json:"partitions"`
	Ownerless    []int  `json:"ownerless"`
	Stalled      []int  `json:"stalled"`
	RouteState   string `json:"route_state"`
	RouteWaiting *struct {
		For string `json:"for"`
	} `json:"route_waiting"`
	Health string `json:"health"`
}

// statusJSONExit runs `status --json` with args and returns what it
// printed on stdout, decoded, and its exit code.
func statusJSONExit(t *testing.T, args ...string) (statusJSON, int) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"status", "--json"}, args...)...)
	stdout, err := cmd.Output()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("status --json: %v", err)
	}
	var r statusJSON
	if err := json.Unmarshal(stdout, &r); err != nil {
		t.Fatalf("status --json (exit %d): %v\n%s", code, err, stdout)
	}
	return r, code
}

// TestStatusWithEveryInstanceDown runs `status` against a cluster on which
// no instance of the group has run: with no input, every partition and
// the route step are idle and it exits 0, in the table and with --json;
// once input has waited longer than the hand-over time with no instance
// to route it, it exits 2 naming the route step. Bad flags and an
// unreadable cluster exit 3.
func TestStatusWithEveryInstanceDown(t *testing.T) {
	srv := natstest.RunServer(t, "")
	path := filepath.Join(t.TempDir(), "group.yaml")
	yml := "nats: {url: " + srv.ClientURL() + "}\nstate: {partitions: 4, data_dir: " + t.TempDir() + "}\n" +
		"input: {ack_wait: 2s}\noutput: {restart_margin: 1s}\nscale_out: {enabled: true, instance: a, replicas: 1}\n"
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}

	out, code := statusExit(t, "--config", path)
	if code != 0 {
		t.Fatalf("status with no input exited %d, want 0:\n%s", code, out)
	}
	if n := len(regexp.MustCompile(`(?m)^\d +idle +none `).FindAllString(out, -1)); n != 4 {
		t.Errorf("%d partitions shown idle without an owner, want 4:\n%s", n, out)
	}
	if !strings.Contains(out, "route step consumer dedupe-route on EVENTS: does not exist; no live instance runs it, nothing waits") {
		t.Errorf("status does not show the route step's consumer idle:\n%s", out)
	}
	r, code := statusJSONExit(t, "--config", path)
	if code != 0 || len(r.Partitions) != 4 || len(r.Ownerless) != 4 || len(r.Stalled) != 0 || r.Health != "ok" || r.RouteState != "idle" {
		t.Errorf("status --json with no input (exit %d): %+v", code, r)
	}

	// Input nobody routes: within the hand-over time (2s + 1s) it waits,
	// then it is stalled.
	_, js := natstest.Connect(t, srv.ClientURL())
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		t.Fatal(err)
	}
	natstest.PublishAll(t, js, []*nats.Msg{{Subject: "events.orders", Data: []byte("{}")}})
	natstest.WaitFor(t, 30*time.Second, "status to exit 2 naming the route step", func() bool {
		out, code = statusExit(t, "--config", path)
		return code == 2
	})
	if !regexp.MustCompile(`CRITICAL: .*the route step, with no live instance \(waiting [\d.]+s, hand-over time 3s\)`).MatchString(out) {
		t.Errorf("status does not say the route step's input waits:\n%s", out)
	}
	r, code = statusJSONExit(t, "--config", path)
	if code != 2 || r.Health != "critical" || r.RouteState != "stalled" || r.RouteWaiting == nil {
		t.Errorf("status --json with the route step stalled (exit %d): %+v", code, r)
	}

	for _, bad := range [][]string{
		{"--config", path, "--no-such-flag"},
		{"--config", path, "extra"},
		{"--config", filepath.Join(t.TempDir(), "missing.yaml")},
		{"--nats-url", "nats://127.0.0.1:1", "--scale-out", "--instance", "a"},
	} {
		if out, code := statusExit(t, bad...); code != 3 || !strings.Contains(out, "UNKNOWN") {
			t.Errorf("status %v exited %d, want 3 (UNKNOWN):\n%s", bad, code, out)
		}
	}
	if out, code := statusExit(t, "-h"); code != 0 || !strings.Contains(out, "2 CRITICAL") {
		t.Errorf("status -h exited %d, want 0 with the exit codes:\n%s", code, out)
	}

}

// TestStatusOnTheEmbeddedDefault asks status on the embedded default:
// with no stage running it says so in one line and exits 3 (UNKNOWN); with
// one running it reads it from its embedded server, with the credentials
// that server requires, and exits 0.
func TestStatusOnTheEmbeddedDefault(t *testing.T) {
	port := strconv.Itoa(proctest.Port(t))
	env := []string{"DEDUPE_EMBEDDED_TOKEN=s3cret-token"}
	out, code := statusExit(t, "--data-dir", t.TempDir(), "--embedded-port", port)
	want := "dedupe-stage: UNKNOWN: the stage is not running: nothing answers at nats://127.0.0.1:" + port + ", where run's embedded server listens"
	if code != 3 || !strings.HasPrefix(out, want) || strings.Count(out, "\n") != 1 {
		t.Errorf("status with no stage running exited %d, want 3 and one line %q...:\n%s", code, want, out)
	}
	httpAddr := proctest.Addr(t)
	startBinary(t, httpAddr, env, "--data-dir", t.TempDir(), "--embedded-port", port, "--http-addr", httpAddr)
	natstest.WaitFor(t, 30*time.Second, "status to read the running stage", func() bool {
		out, code = runStatusEnv(t, env, "--embedded-port", port)
		return code == 0 && strings.Contains(out, "single instance, consumer dedupe-stage on EVENTS: 0 pending, 0 ack pending; running")
	})
	if strings.Contains(out, "s3cret-token") {
		t.Errorf("status shows the embedded server's token:\n%s", out)
	}
}

// runStatusEnv runs `status` with env and args and returns its output and
// exit code.
func runStatusEnv(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	code, out := output(t, env, append([]string{"status"}, args...)...)
	return out, code
}

// TestStatusOwnersThenPinsExpired runs one instance of a routed group as a
// process: once input flows, `status` lists every partition with the
// instance as its owner and exits 0. After the instance is killed
// (SIGKILL: nothing unpins) and the pins' TTL (input.ack_wait) has passed,
// every partition is idle and it still exits 0; input published then
// waits for the route step, and once the dead instance has left the
// presence bucket and the input has waited longer than the hand-over
// time it exits 2. With another partition count than the group's it
// exits 3: it cannot tell.
func TestStatusOwnersThenPinsExpired(t *testing.T) {
	srv := natstest.RunServer(t, "")
	httpAddr := proctest.Addr(t)
	path := filepath.Join(t.TempDir(), "group.yaml")
	yml := "nats: {url: " + srv.ClientURL() + ", create_streams: true}\nstate: {partitions: 4, data_dir: " + t.TempDir() + "}\n" +
		"http: {addr: " + httpAddr + "}\ninput: {ack_wait: 2s}\noutput: {restart_margin: 1s}\nscale_out: {enabled: true, instance: inst-a, replicas: 1}\n"
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startBinary(t, httpAddr, nil, "--config", path)
	_, js := natstest.Connect(t, srv.ClientURL())
	publish := func(prefix string, n int) {
		var msgs []*nats.Msg
		for i := range n {
			m := nats.NewMsg("events.orders")
			m.Header.Set("Nats-Msg-Id", prefix+strconv.Itoa(i))
			m.Data = []byte("{}")
			msgs = append(msgs, m)
		}
		natstest.PublishAll(t, js, msgs)
	}
	publish("order-", 100)

	var out string
	var code int
	natstest.WaitFor(t, 60*time.Second, "status to show every partition owned by inst-a and drained", func() bool {
		out, code = statusExit(t, "--config", path)
		// One line per partition whose OWNER column is inst-a (the last
		// hand-over column names it too), with nothing pending.
		return code == 0 && len(ownedBy("inst-a").FindAllString(out, -1)) == 4 &&
			len(regexp.MustCompile(`(?m)^\d+ +owned +inst-a +\S+ ago +0 +0 `).FindAllString(out, -1)) == 4 &&
			strings.Contains(out, "route step consumer dedupe-route on EVENTS: 0 pending, 0 ack pending")
	})
	t.Logf("status:\n%s", out)
	if !strings.Contains(out, "route step consumer dedupe-route on EVENTS: 0 pending") {
		t.Errorf("status does not show the route step's consumer drained:\n%s", out)
	}
	if out, code := statusExit(t, "--config", path, "--partitions", "8"); code != 3 || !strings.Contains(out, "UNKNOWN: the configuration does not describe the group") {
		t.Errorf("status with another partition count than the group's exited %d, want 3:\n%s", code, out)
	}

	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Exited()
	natstest.Poll(t, 60*time.Second, 100*time.Millisecond, "status to show every partition idle once the pins expired", func() (bool, error) {
		out, code = statusExit(t, "--config", path)
		if code != 0 {
			return false, fmt.Errorf("exit %d:\n%s", code, out)
		}
		return strings.Contains(out, "0 owned, 4 idle"), nil
	})
	t.Logf("status after the kill:\n%s", out)
	if n := len(regexp.MustCompile(`(?m)^\d +idle +none \(last inst-a\) `).FindAllString(out, -1)); n != 4 {
		t.Errorf("%d partitions shown idle with inst-a as their last owner, want 4:\n%s", n, out)
	}

	publish("late-", 10)
	natstest.WaitFor(t, 60*time.Second, "status to exit 2 naming the route step", func() bool {
		out, code = statusExit(t, "--config", path)
		return code == 2 && strings.Contains(out, "the route step, with no live instance (waiting ")
	})
	t.Logf("status with input waiting:\n%s", out)
}

// ownedBy matches a line of status's table whose partition is owned by
// instance.
func ownedBy(instance string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^\d+ +owned +` + regexp.QuoteMeta(instance) + ` `)
}
