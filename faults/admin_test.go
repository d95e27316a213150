package faults

import (
	"context"
	"encoding/json"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// TestInspectAnyInstanceOfAGroup asks `dedupe-stage inspect` about keys of
// a 3-instance group on a 3-node cluster through each instance's
// configuration: every answer is the owner's (the instance whose status
// lists the key's partition as owned) and names the output sequence of
// the key's forward, and `forget` through any instance is applied and
// answered by the owner. Inspect and forget of a key no instance holds
// answer not found and not held once the three instances have answered
// (their owned partitions cover every partition), well before --timeout.
func TestInspectAnyInstanceOfAGroup(t *testing.T) {
	t.Parallel()
	w := newWorkload(71, "adm", 4096)
	cl, stages, js := scaleOutGroup(t, 3, w, "")
	scaleOutDrained(t, js, stages[0].cfg.Partitions, takeoverWait)

	nc, _ := natstest.Connect(t, cl.URLs())
	c := admin.Client{Conn: nc, Subject: "dedupe.admin.dedupe", Timeout: 5 * time.Second}
	st, err := c.Status(context.Background())
	if err != nil || len(st) != 3 {
		t.Fatalf("status of the group = %+v, %v; want three instances", st, err)
	}
	ownerOf := map[int]string{}
	for _, s := range st {
		for _, p := range s.Owned {
			ownerOf[p] = s.Instance
		}
	}

	output, err := js.Stream(context.Background(), outputStream)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range w.keys[:5] {
		for _, s := range stages {
			out, err := exec.Command(stageBin, "inspect", "--config", s.cfgPath, key).CombinedOutput()
			var r admin.InspectReply
			if err != nil || json.Unmarshal(out, &r) != nil {
				t.Fatalf("inspect %s with %s's configuration: %v\n%s", key, s.cfgPath, err, out)
			}
			if !r.Found || !r.InsideWindow || !r.Owner || r.Instance != ownerOf[r.Partition] {
				t.Errorf("inspect %s = %+v; want the answer of %s, the owner of partition %d", key, r, ownerOf[r.Partition], r.Partition)
			}
			if r.OutputSeq == nil {
				t.Errorf("inspect %s: no output_seq", key)
			} else if raw, err := output.GetMsg(context.Background(), *r.OutputSeq); err != nil || raw.Header.Get(jetstream.MsgIDHeader) != key {
				t.Errorf("inspect %s: output_seq %d holds %v (%v); want the key's forward", key, *r.OutputSeq, raw, err)
			}
		}
	}

	key := w.keys[0]
	out, err := exec.Command(stageBin, "forget", "--config", stages[0].cfgPath, key).CombinedOutput()
	var f admin.ForgetReply
	if err != nil || json.Unmarshal(out, &f) != nil {
		t.Fatalf("forget %s in a group: %v\n%s", key, err, out)
	}
	if f.Partition == nil || !f.Held || !f.Owner || f.Instance != ownerOf[*f.Partition] {
		t.Errorf("forget %s = %+v; want held and forgotten by its partition's owner", key, f)
	}
	r, err := c.Inspect(context.Background(), key)
	if err != nil || r.InsideWindow || r.Forgotten == nil {
		t.Errorf("inspect %s after the forget = %+v, %v; want forgotten", key, r, err)
	}

	const timeout = 30 * time.Second
	start := time.Now()
	out, err = exec.Command(stageBin, "inspect", "--config", stages[1].cfgPath, "--timeout", timeout.String(), "never-seen").CombinedOutput()
	var none admin.InspectReply
	if err != nil || json.Unmarshal(out, &none) != nil || none.Found || none.Owner {
		t.Errorf("inspect of a key no instance holds: %v\n%s\nwant not found", err, out)
	}
	out, err = exec.Command(stageBin, "forget", "--config", stages[2].cfgPath, "--timeout", timeout.String(), "never-seen").CombinedOutput()
	var nothing admin.ForgetReply
	if err != nil || json.Unmarshal(out, &nothing) != nil || nothing.Held || nothing.Owner {
		t.Errorf("forget of a key no instance holds: %v\n%s\nwant nothing held", err, out)
	}
	if took := time.Since(start); took >= timeout/2 {
		t.Errorf("inspect and forget of a key no instance holds took %v; want them answered once every instance has, not at the %v timeout", took, timeout)
	}
	if !slices.ContainsFunc(st, func(s admin.StatusReply) bool { return s.Ready }) {
		t.Errorf("no instance says it is ready: %+v", st)
	}
}
