package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// adminUsers are the users of the server of TestForgetThroughTheBinary:
// the stage's, and a viewer whose permissions let it inspect but not
// forget.
func adminUsers(o *server.Options) {
	o.Users = []*server.User{
		{Username: "stage", Password: "stage-pw"},
		{Username: "viewer", Password: "viewer-pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Deny: []string{"dedupe.admin.*.forget"}},
		}},
	}
}

// TestForgetThroughTheBinary runs the binary against a real server:
// a key is forwarded once and its copy caught; `forget` makes the next copy
// be forwarded again (with an id of its own, which the output's duplicate
// window does not drop) and only that one; a forget of a key not held says
// so; the forget holds after a kill -9 and a restart; `inspect` answers
// over NATS with the record's fields, the output sequence of the key's
// forward among them (the newest forward's after a forget); and a user whose permissions deny
// <prefix>.forget can inspect but not forget.
func TestForgetThroughTheBinary(t *testing.T) {
	srv := natstest.RunServerWith(t, adminUsers)
	port := srv.Addr().(interface{ String() string }).String()
	stageURL := "nats://stage:stage-pw@" + port
	viewerURL := "nats://viewer:viewer-pw@" + port
	dataDir, addr := t.TempDir(), proctest.Addr(t)
	cfgPath := filepath.Join(t.TempDir(), "stage.yaml")
	if err := os.WriteFile(cfgPath, []byte(stageConfig(stageURL, dataDir, addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startBinary(t, addr, nil, "--config", cfgPath)
	_, js := natstest.Connect(t, stageURL)

	send := func(key string) {
		t.Helper()
		natstest.PublishAll(t, js, []*nats.Msg{{Subject: "events.orders", Header: nats.Header{"Event-Id": {key}}, Data: []byte("order " + key)}})
		drained(t, js, 30*time.Second)
	}
	forget := func(key string) admin.ForgetReply {
		t.Helper()
		code, out := output(t, nil, "forget", "--config", cfgPath, key)
		var r admin.ForgetReply
		if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil {
			t.Fatalf("forget %s: exit %d, %v:\n%s", key, code, err, out)
		}
		return r
	}
	inspect := func(url, key string) admin.InspectReply {
		t.Helper()
		code, out := output(t, nil, "inspect", "--config", cfgPath, "--server", url, key)
		var r admin.InspectReply
		if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil {
			t.Fatalf("inspect %s: exit %d, %v:\n%s", key, code, err, out)
		}
		return r
	}

	send("order-1")
	send("order-1")
	if n := outputCount(t, js); n != 1 {
		t.Fatalf("output holds %d messages after a key and its copy, want 1", n)
	}
	in := inspect(stageURL, "order-1")
	if !in.Found || !in.InsideWindow || !in.Owner || in.FirstSeen == nil || in.LeavesAt == nil || in.Forgotten != nil || in.Instance == "" {
		t.Errorf("inspect order-1 before the forget = %+v; want found inside the window, owned, first seen and window end set", in)
	}
	first := natstest.ReadAll(t, js, "EVENTS_DEDUPED")[0]
	if in.OutputSeq == nil || *in.OutputSeq != first.Seq {
		t.Errorf("inspect order-1: output_seq %v, want %d, the sequence of its forward", in.OutputSeq, first.Seq)
	}

	before := time.Now()
	f := forget("order-1")
	if !f.Held || f.Applied.Before(before.Add(-time.Second)) || f.FirstSeen == nil || !f.FirstSeen.Equal(*in.FirstSeen) {
		t.Errorf("forget order-1 = %+v; want held, applied after %v, first seen %v", f, before, in.FirstSeen)
	}
	if again := forget("order-1"); again.Held {
		t.Errorf("forget order-1 twice = %+v; want not held", again)
	}
	if never := forget("never-seen"); never.Held || never.Applied.IsZero() {
		t.Errorf("forget never-seen = %+v; want not held, with the time applied", never)
	}
	if in := inspect(stageURL, "order-1"); in.InsideWindow || in.Forgotten == nil {
		t.Errorf("inspect order-1 after the forget = %+v; want outside the window, forgotten_at set", in)
	}

	send("order-1")             // forwarded again
	send("order-1")             // a repeat of that forward
	var msgs []natstest.Message // the forwards, without the forget's tombstone (a key-state record)
	for _, m := range natstest.ReadAll(t, js, "EVENTS_DEDUPED") {
		if !strings.HasPrefix(m.Subject, changelog.ControlRoot+".") {
			msgs = append(msgs, m)
		}
	}
	if len(msgs) != 2 {
		t.Fatalf("output holds %d forwards after the forget and two copies, want 2", len(msgs))
	}
	h := msgs[1].Header
	if key, ok := changelog.KeyOf(h, h.Get(jetstream.MsgIDHeader)); !ok || key != "order-1" || h.Get(changelog.HeaderForgotten) == "" {
		t.Errorf("the forward after the forget has Nats-Msg-Id %q and %s %q; want an id of key order-1",
			h.Get(jetstream.MsgIDHeader), changelog.HeaderForgotten, h.Get(changelog.HeaderForgotten))
	}
	if in := inspect(stageURL, "order-1"); in.OutputSeq == nil || *in.OutputSeq != msgs[1].Seq {
		t.Errorf("inspect order-1 after its forward since the forget: output_seq %v, want %d", in.OutputSeq, msgs[1].Seq)
	}

	// A forget holds after a kill -9 and a restart.
	if f := forget("order-1"); !f.Held {
		t.Fatalf("forget order-1 after its new forward = %+v; want held", f)
	}
	p.Kill()
	startBinary(t, addr, nil, "--config", cfgPath)
	if in := inspect(stageURL, "order-1"); in.Forgotten == nil {
		t.Errorf("inspect order-1 after the restart = %+v; want forgotten_at set", in)
	}
	send("order-1")
	if n := outputCount(t, js); n != 3 {
		t.Errorf("output holds %d messages after a forget, a restart and a copy, want 3", n)
	}

	// Permissions alone: the viewer may inspect, not forget.
	if in := inspect(viewerURL, "order-1"); !in.Found {
		t.Errorf("the viewer's inspect = %+v; want found", in)
	}
	code, out := output(t, nil, "forget", "--config", cfgPath, "--server", viewerURL, "--timeout", "2s", "order-1")
	if code == 0 || !strings.Contains(strings.ToLower(out), "permissions violation") {
		t.Errorf("the viewer's forget: exit %d, want a refusal naming the permissions violation:\n%s", code, out)
	}
	if in := inspect(stageURL, "order-1"); in.Forgotten != nil {
		t.Errorf("after the viewer's refused forget, inspect = %+v; want held", in)
	}
}

// TestAdminServiceDiscovery finds the stage's admin service as `nats micro
// ls` does, and asks its status endpoint.
func TestAdminServiceDiscovery(t *testing.T) {
	srv := natstest.RunServer(t, "")
	addr := proctest.Addr(t)
	startStage(t, srv.ClientURL(), t.TempDir(), addr)
	nc, _ := natstest.Connect(t, srv.ClientURL())
	msg, err := nc.Request("$SRV.INFO."+admin.ServiceName, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("$SRV.INFO.%s: %v", admin.ServiceName, err)
	}
	var info struct {
		Name      string `json:"name"`
		Endpoints []struct {
			Subject string `json:"subject"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatal(err)
	}
	var subjects []string
	for _, e := range info.Endpoints {
		subjects = append(subjects, e.Subject)
	}
	want := "[dedupe.admin.dedupe-stage.forget dedupe.admin.dedupe-stage.inspect dedupe.admin.dedupe-stage.status]"
	if got := fmt.Sprint(slices.Sorted(slices.Values(subjects))); got != want {
		t.Errorf("the service's endpoints are %s, want %s", got, want)
	}
	c := admin.Client{Conn: nc, Subject: "dedupe.admin.dedupe-stage", Timeout: 2 * time.Second}
	st, err := c.Status(context.Background())
	if err != nil || len(st) != 1 || !st[0].Ready || len(st[0].Owned) != 4 {
		t.Errorf("status = %+v, %v; want one ready instance owning the 4 partitions", st, err)
	}
}
