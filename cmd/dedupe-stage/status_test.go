package main

import (
	"encoding/json"
	"errors"
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

	"github.com/dedupe-stage/dedupe-stage/internal/natstest"
)

// TestStatusWithEveryInstanceDown runs `status` against a cluster on which
// no instance of the group runs: it reads everything from the cluster,
// lists every partition without an owner, and exits 1 naming them, in the
// table and with --json.
func TestStatusWithEveryInstanceDown(t *testing.T) {
	srv := natstest.RunServer(t, "")
	path := filepath.Join(t.TempDir(), "group.yaml")
	yml := "nats: {url: " + srv.ClientURL() + "}\nstate: {partitions: 4, data_dir: " + t.TempDir() + "}\n" +
		"input: {ack_wait: 2s}\nscale_out: {enabled: true, instance: a, replicas: 1}\n"
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}

	out, err := runBinary(t, 60*time.Second, "status", "--config", path)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("status exited with %v, want 1:\n%s", err, out)
	}
	if !strings.Contains(out, "partitions without an owner: 0, 1, 2, 3 of 4") {
		t.Errorf("status does not name the partitions without an owner:\n%s", out)
	}
	if n := strings.Count(out, "NONE"); n != 4 {
		t.Errorf("%d partitions shown without an owner, want 4:\n%s", n, out)
	}
	if !strings.Contains(out, "route step consumer dedupe-route on EVENTS: does not exist") {
		t.Errorf("status does not show the route step's consumer:\n%s", out)
	}

	cmd := exec.Command(binary, "status", "--json", "--config", path)
	stdout, err := cmd.Output()
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("status --json exited with %v, want 1:\n%s", err, stdout)
	}
	var r struct {
		Partitions []struct {
			Partition int    `json:"partition"`
			PinID     string `json:"pin_id"`
		} `json:"partitions"`
		Ownerless []int `json:"ownerless"`
	}
	if err := json.Unmarshal(stdout, &r); err != nil {
		t.Fatalf("status --json: %v\n%s", err, stdout)
	}
	if len(r.Partitions) != 4 || len(r.Ownerless) != 4 {
		t.Errorf("status --json: %s", stdout)
	}

	// A single instance on the embedded server: nothing to read while it is down.
	out, err = runBinary(t, 30*time.Second, "status", "--data-dir", t.TempDir())
	if err == nil || !strings.Contains(out, "status reads the cluster") {
		t.Errorf("status with the embedded server: %v\n%s", err, out)
	}
}

// TestStatusOwnersThenPinsExpired runs one instance of a routed group as a
// process: once input flows, `status` lists every partition with the
// instance as its owner and exits 0; after the instance is killed
// (SIGKILL: nothing unpins) and the pins' TTL (input.ack_wait) has passed,
// it exits 1 naming every partition.
func TestStatusOwnersThenPinsExpired(t *testing.T) {
	srv := natstest.RunServer(t, "")
	httpAddr := freeAddr(t)
	path := filepath.Join(t.TempDir(), "group.yaml")
	yml := "nats: {url: " + srv.ClientURL() + ", create_streams: true}\nstate: {partitions: 4, data_dir: " + t.TempDir() + "}\n" +
		"http: {addr: " + httpAddr + "}\ninput: {ack_wait: 2s}\nscale_out: {enabled: true, instance: inst-a, replicas: 1}\n"
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startBinary(t, httpAddr, nil, "--config", path)
	_, js := natstest.Connect(t, srv.ClientURL())
	var msgs []*nats.Msg
	for i := range 100 {
		m := nats.NewMsg("events.orders")
		m.Header.Set("Nats-Msg-Id", "order-"+strconv.Itoa(i))
		m.Data = []byte("{}")
		msgs = append(msgs, m)
	}
	natstest.PublishAll(t, js, msgs)

	var out string
	natstest.WaitFor(t, 60*time.Second, "status to show every partition owned by inst-a", func() bool {
		var err error
		out, err = runBinary(t, 30*time.Second, "status", "--config", path)
		// One line per partition whose OWNER column is inst-a (the last
		// hand-over column names it too).
		return err == nil && len(ownedBy("inst-a").FindAllString(out, -1)) == 4
	})
	t.Logf("status:\n%s", out)
	if !strings.Contains(out, "route step consumer dedupe-route on EVENTS: 0 pending") {
		t.Errorf("status does not show the route step's consumer drained:\n%s", out)
	}

	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	natstest.WaitFor(t, 60*time.Second, "status to exit 1 naming every partition once the pins expired", func() bool {
		var err error
		out, err = runBinary(t, 30*time.Second, "status", "--config", path)
		var exit *exec.ExitError
		return errors.As(err, &exit) && exit.ExitCode() == 1 &&
			strings.Contains(out, "partitions without an owner: 0, 1, 2, 3 of 4")
	})
	t.Logf("status after the kill:\n%s", out)
}

// ownedBy matches a line of status's table whose partition is owned by
// instance.
func ownedBy(instance string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^\d+ +` + regexp.QuoteMeta(instance) + ` `)
}
