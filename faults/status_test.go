package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// statusReport is the part of `dedupe-stage status --json` the test reads.
type statusReport struct {
	Partitions []struct {
		Partition int    `json:"partition"`
		State     string `json:"state"`
		LastOwner string `json:"last_owner"`
		Consumer  struct {
			Pending    uint64 `json:"pending"`
			AckPending int    `json:"ack_pending"`
		} `json:"consumer"`
		Waiting *struct {
			For          string `json:"for"`
			HandOverTime string `json:"hand_over_time"`
		} `json:"waiting"`
		LastHandOver *struct {
			RestoreSeconds float64 `json:"restore_seconds"`
		} `json:"last_handover"`
	} `json:"partitions"`
	Stalled []int  `json:"stalled"`
	Health  string `json:"health"`
}

// states counts the partitions of r by state.
func (r statusReport) states() map[string]int {
	n := map[string]int{}
	for _, p := range r.Partitions {
		n[p.State]++
	}
	return n
}

// runStatus runs `dedupe-stage status` on the configuration at path, with
// --json when asJSON, and returns its stdout, stderr and exit code.
func runStatus(tb testing.TB, path string, asJSON bool) (stdout, stderr string, code int) {
	tb.Helper()
	args := []string{"status", "--config", path}
	if asJSON {
		args = append(args, "--json")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, stageBin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && ctx.Err() == nil:
		code = exit.ExitCode()
	default:
		tb.Fatalf("status: %v\n%s%s", err, out.String(), errOut.String())
	}
	return out.String(), errOut.String(), code
}

// statusJSON runs `status --json` and decodes it; the exit code must
// agree with the report's health (0 ok, 2 critical).
func statusJSON(tb testing.TB, path string) (statusReport, int) {
	tb.Helper()
	stdout, stderr, code := runStatus(tb, path, true)
	var r statusReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		tb.Fatalf("status --json (exit %d): %v\n%s%s", code, err, stdout, stderr)
	}
	if want := map[string]int{"ok": 0, "critical": 2}[r.Health]; code != want || (code == 2) != (len(r.Stalled) > 0) {
		tb.Fatalf("status --json exited %d with health %q and partitions %v stalled\n%s", code, r.Health, r.Stalled, stderr)
	}
	return r, code
}

// TestStatusAsACheck runs `dedupe-stage status` as a monitoring check on two
// instances on a 3-node cluster: it exits 0 while every partition is owned
// or idle, and 2, naming the partitions and their wait, once input has
// waited without an owner past the hand-over time (ack_wait 2s + restart
// margin 1s, or the last takeover when that took longer).
func TestStatusAsACheck(t *testing.T) {
	cl := natstest.StartCluster(t, 3)
	var stages []*stage
	for i := range 2 {
		c := scaleOutConfig(t, cl.URLs(), "i"+strconv.Itoa(i))
		c.Partitions = 8
		s := newStage(t, c)
		// The partition key is the second token of events.<key>: the input
		// stream's transform partitions it, and no route step runs.
		yml := strings.Replace(c.yaml(), "key:\n  source: header\n  header: Event-Id\n", "key:\n  source: subject\n  subject_token: 2\n", 1)
		yml = strings.Replace(yml, "input:\n", "input:\n  subjects: [\"events.*\"]\n", 1)
		if err := os.WriteFile(s.cfgPath, []byte(yml), 0o644); err != nil {
			t.Fatal(err)
		}
		s.startReady()
		stages = append(stages, s)
	}
	path := stages[0].cfgPath

	// (a) No input yet.
	table, stderr, code := runStatus(t, path, false)
	t.Logf("status with no input:\n%s%s", table, stderr)
	r, _ := statusJSON(t, path)
	if n := r.states(); code != 0 || len(r.Partitions) != 8 || n["owned"]+n["idle"] != 8 {
		t.Fatalf("status with no input: exit %d, states %v; want 0, every partition owned or idle", code, n)
	}
	if n := regexp.MustCompile(`(?m)^\d +(owned|idle) `).FindAllString(table, -1); len(n) != 8 {
		t.Errorf("%d partitions shown owned or idle in the table, want 8", len(n))
	}

	// (b) 50 inputs, judged.
	js := publisherJS(t, cl.URLs())
	publishKeys(t, js, "first", 50)
	natstest.Poll(t, 60*time.Second, 200*time.Millisecond, "status to show every partition drained", func() (bool, error) {
		r, _ = statusJSON(t, path)
		for _, p := range r.Partitions {
			if p.Consumer.Pending != 0 || p.Consumer.AckPending != 0 {
				return false, nil
			}
		}
		return true, nil
	})
	table, stderr, code = runStatus(t, path, false)
	t.Logf("status with the input judged:\n%s%s", table, stderr)
	r, _ = statusJSON(t, path)
	if n := r.states(); code != 0 || n["owned"]+n["idle"] != 8 {
		t.Fatalf("status with the input judged: exit %d, states %v; want 0, every partition owned or idle", code, n)
	}
	for _, p := range r.Partitions {
		if p.LastOwner != "i0" && p.LastOwner != "i1" {
			t.Errorf("partition %d: last owner %q, want i0 or i1 (the fence's writer)", p.Partition, p.LastOwner)
		}
	}

	// (c) Every instance stopped (a clean stop unpins), then input.
	for _, s := range stages {
		s.last().signal(t, syscall.SIGTERM, 30*time.Second)
	}
	natstest.Poll(t, 30*time.Second, 200*time.Millisecond, "status to show every partition idle", func() (bool, error) {
		r, _ = statusJSON(t, path)
		return r.states()["idle"] == 8, nil
	})
	publishKeys(t, js, "late", 40)
	natstest.Poll(t, 60*time.Second, 200*time.Millisecond, "status to exit 2", func() (bool, error) {
		r, code = statusJSON(t, path)
		return code == 2, nil
	})
	table, stderr, code = runStatus(t, path, false)
	t.Logf("status with input stalled:\n%s%s", table, stderr)
	if code != 2 {
		t.Fatalf("status exited %d after --json exited 2", code)
	}
	for _, p := range r.Partitions {
		if p.Consumer.Pending+uint64(p.Consumer.AckPending) == 0 {
			if p.State != "idle" {
				t.Errorf("partition %d has no input and is %s, want idle", p.Partition, p.State)
			}
			continue
		}
		// input.ack_wait + the longer of output.restart_margin and the
		// partition's last takeover.
		want := scaleOutAckWait + time.Second
		if h := p.LastHandOver; h != nil {
			want = scaleOutAckWait + max(time.Second, time.Duration(h.RestoreSeconds*float64(time.Second)))
		}
		if p.State != "waiting" && p.State != "stalled" || p.Waiting == nil || p.Waiting.HandOverTime != want.String() {
			t.Errorf("partition %d with input waiting: %s, %+v; want waiting or stalled, hand-over time %v", p.Partition, p.State, p.Waiting, want)
			continue
		}
		// Stalled in --json a moment ago, stalled now: the text names it
		// with its wait.
		if p.State == "stalled" && !regexp.MustCompile(fmt.Sprintf(`\b%d \(waiting [\d.]+s, hand-over time [\d.]+s\)`, p.Partition)).MatchString(stderr) {
			t.Errorf("status's message does not name stalled partition %d with its wait:\n%s", p.Partition, stderr)
		}
	}
	if !strings.Contains(stderr, "CRITICAL: input waits without an owner for longer than the hand-over time: partitions ") ||
		!regexp.MustCompile(`(?m)^\d +STALLED: waiting [\d.]+s, hand-over time [\d.]+s +none \(last i[01]\) `).MatchString(table) {
		t.Errorf("status does not show the stalled partitions:\n%s%s", table, stderr)
	}
}

// publishKeys publishes n inputs with new keys, events.<round>-<i>, and
// waits until the input stream has stored each.
func publishKeys(tb testing.TB, js jetstream.JetStream, round string, n int) {
	tb.Helper()
	var msgs []*nats.Msg
	for i := range n {
		key := round + "-" + strconv.Itoa(i)
		m := nats.NewMsg("events." + key)
		m.Header.Set(jetstream.MsgIDHeader, key)
		m.Data = payloadOf(key)
		msgs = append(msgs, m)
	}
	natstest.PublishAll(tb, js, msgs)
}
