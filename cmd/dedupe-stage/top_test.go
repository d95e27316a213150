package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// TestTopOnceOfARunningGroup runs a group of two instances, sends 40 keys,
// 10 copies of them and one key too long (the key is the subject's second token, so
// the servers partition the input and no route step runs), and reads `top --once`
// with NO_COLOR: no escape sequence; both instances ready and connected;
// every partition on a line, owned by the instance `status --json` (the
// cluster's pins and fences) names, the fence's holder where nobody is
// pinned, or by none as status says; the partitions' counts add up to what was sent
// (40 new, 10 repeats, 1 dead letter) and the instances' to all 51 with the dead letter
// by its reason.
func TestTopOnceOfARunningGroup(t *testing.T) {
	srv := natstest.RunServer(t, "")
	var paths []string
	for _, name := range []string{"a", "b"} {
		httpAddr := proctest.Addr(t)
		path := filepath.Join(t.TempDir(), name+".yaml")
		yml := "nats: {url: " + srv.ClientURL() + ", create_streams: true}\nkey: {source: subject, subject_token: 2}\n" +
			"state: {partitions: 4, data_dir: " + t.TempDir() + "}\nhttp: {addr: " + httpAddr + "}\ninput: {ack_wait: 2s, subjects: [\"events.*\"]}\n" +
			"output: {restart_margin: 1s}\nscale_out: {enabled: true, instance: " + name + ", replicas: 1}\nlog: {format: json}\n"
		if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
			t.Fatal(err)
		}
		startBinary(t, httpAddr, nil, "--config", path)
		paths = append(paths, path)
	}
	_, js := natstest.Connect(t, srv.ClientURL())
	var msgs []*nats.Msg
	for i := range 50 {
		// 40 keys, then 10 copies
		msgs = append(msgs, &nats.Msg{Subject: "events.order-" + strconv.Itoa(i%40), Data: []byte("{}")})
	}
	// A key longer than key.max_length (256 bytes): dead-lettered by its
	// partition's owner.
	msgs = append(msgs, &nats.Msg{Subject: "events." + strings.Repeat("k", 300), Data: []byte("{}")})
	natstest.PublishAll(t, js, msgs)

	var out string
	var last error
	natstest.Poll(t, 90*time.Second, 200*time.Millisecond, "top --once to show every message judged, both instances and owners as status has them", func() (bool, error) {
		cmd := exec.Command(binary, "top", "--once", "--config", paths[0], "--interval", "300ms", "--timeout", "500ms")
		cmd.Env = append(os.Environ(), "NO_COLOR=1")
		b, err := cmd.CombinedOutput()
		out = string(b)
		if err != nil {
			return false, fmt.Errorf("top --once: %v\n%s", err, out)
		}
		last = checkTopFrame(t, out, paths[0])
		return last == nil, last
	})
	t.Logf("top --once:\n%s", out)
	if regexp.MustCompile("\x1b").MatchString(out) {
		t.Errorf("top --once with NO_COLOR printed escape sequences:\n%q", out)
	}
}

// checkTopFrame checks a frame of the group of TestTopOnceOfARunningGroup
// against what was sent and what `status --json` says of the owners.
func checkTopFrame(t *testing.T, out, path string) error {
	t.Helper()
	inst := regexp.MustCompile(`(?m)^([ab]) +ready +up +([0-9,]*) +\S+ +(\d+) +\S+ +(.+?) +(key_too_long 1|0) +\S+ +\S+$`)
	rows := inst.FindAllStringSubmatch(out, -1)
	if len(rows) != 2 || rows[0][1] == rows[1][1] {
		return fmt.Errorf("want a line for each of a and b, ready and connected; got %d", len(rows))
	}
	judged, deadLines := 0, 0
	for _, r := range rows {
		n, _ := strconv.Atoi(r[3])
		judged += n
		if r[5] == "key_too_long 1" {
			deadLines++
		}
	}
	if judged != 51 || deadLines != 1 {
		return fmt.Errorf("the instances judged %d (want 51), %d name the key_too_long dead letter (want 1)", judged, deadLines)
	}
	// A partition released for balance has no owner until its next
	// message: "none", and no backlog ("-").
	part := regexp.MustCompile(`(?m)^ +(\d) +(a|b|none) +\S+ +(\d+) +(\d+) +(\d+) +\S+ +(\d+) +(\d+) +(\d+|-) +(\d+|-)$`)
	prows := part.FindAllStringSubmatch(out, -1)
	if len(prows) != 4 {
		return fmt.Errorf("%d partition lines, want 4:\n%s", len(prows), out)
	}
	owners := statusOwners(t, path)
	news, repeats := 0, 0
	for _, r := range prows {
		p, _ := strconv.Atoi(r[1])
		if owner := strings.TrimPrefix(r[2], "none"); owners[p] != owner {
			return fmt.Errorf("partition %d: top says owner %s, status %q:\n%s\nstatus --json:\n%s", p, r[2], owners[p], out, lastStatus)
		}
		n, _ := strconv.Atoi(r[4])
		rp, _ := strconv.Atoi(r[5])
		news += n
		repeats += rp
	}
	if news != 40 || repeats != 10 {
		return fmt.Errorf("the partitions count %d new and %d repeats, want 40 and 10", news, repeats)
	}
	return nil
}

// statusOwners is each partition's owner as `status --json` reads it from
// the cluster: the confirmed owner of a pinned partition, the fence's
// holder of one nobody is pinned to, "" when unconfirmed or none.
func statusOwners(t *testing.T, path string) map[int]string {
	t.Helper()
	b, err := exec.Command(binary, "status", "--json", "--config", path).Output()
	if err != nil && len(b) == 0 {
		t.Fatalf("status --json: %v", err)
	}
	var r struct {
		Partitions []struct {
			Partition      int    `json:"partition"`
			Owner          string `json:"owner"`
			OwnerConfirmed bool   `json:"owner_confirmed"`
			PinID          string `json:"pin_id"`
			FenceInstance  string `json:"fence_instance"`
		} `json:"partitions"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("status --json: %v\n%s", err, b)
	}
	out := map[int]string{}
	for _, p := range r.Partitions {
		switch {
		case p.OwnerConfirmed:
			out[p.Partition] = strings.TrimSpace(p.Owner)
		case p.PinID == "":
			// Nobody pinned: an instance that took the partition before
			// its next message (a release for balance gives it to its
			// assigned instance that way) holds its fence.
			out[p.Partition] = p.FenceInstance
		}
	}
	lastStatus = string(b)
	return out
}

// lastStatus is the last answer of `status --json` statusOwners read, for
// the failure's message.
var lastStatus string
