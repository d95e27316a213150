package main

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// TestVersionWins: versions 1, 3, 2, 3, 4 of one key reach the output as
// versions 1, 3 and 4, each with its own Nats-Msg-Id and the key in
// Dedupe-Key; the other two are counted stale; a copy without a version
// and one with a malformed version are dead-lettered with their reasons.
func TestVersionWins(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	addr := proctest.Addr(t)
	cfg := strings.Replace(stageConfig(srv.ClientURL(), t.TempDir(), addr), "  header: Event-Id\n",
		"  header: Event-Id\n  version: {source: header, header: Event-Version}\n", 1)
	startStageWith(t, cfg, addr)

	msg := func(version string) *nats.Msg {
		h := nats.Header{"Event-Id": {"order-7"}}
		if version != "" {
			h.Set("Event-Version", version)
		}
		return &nats.Msg{Subject: "events.orders", Header: h, Data: []byte("state at version " + version)}
	}
	var msgs []*nats.Msg
	for _, v := range []string{"1", "3", "2", "3", "4", "", "v5"} {
		msgs = append(msgs, msg(v))
	}
	natstest.PublishAll(t, js, msgs)
	drained(t, js, 30*time.Second)

	var ids, versions []string
	for _, m := range natstest.ReadAll(t, js, "EVENTS_DEDUPED") {
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
		versions = append(versions, string(m.Data))
		if k := m.Header.Get("Dedupe-Key"); k != "order-7" {
			t.Errorf("output %s carries Dedupe-Key %q, want order-7", m.Header.Get(jetstream.MsgIDHeader), k)
		}
	}
	if want := []string{"order-7:v1", "order-7:v3", "order-7:v4"}; !slices.Equal(ids, want) {
		t.Errorf("output ids %q, want %q (payloads %q)", ids, want, versions)
	}
	if got := scrape(t, addr, "dedupe_messages_total", `outcome="stale"`); got != 2 {
		t.Errorf("stale copies %v, want 2", got)
	}
	if got := scrape(t, addr, "dedupe_messages_total", `outcome="new"`); got != 3 {
		t.Errorf("new copies %v, want 3", got)
	}
	var reasons []string
	for _, m := range natstest.ReadAll(t, js, "DEDUPE_DLQ") {
		reasons = append(reasons, m.Subject)
	}
	slices.Sort(reasons)
	if want := []string{"dedupe.dlq.bad_version", "dedupe.dlq.no_version"}; !slices.Equal(reasons, want) {
		t.Errorf("dead letters on %q, want %q", reasons, want)
	}
}

// TestSlidingWindowOutlivesARestart runs with W = 6s and
// window.refresh_on_repeat: a key repeated every 2s is still a repeat at
// first seen + W + 0.5s, judged by a stage restarted after a kill in
// between (its filter rebuilt from the store), while a key sent once is
// new again by then.
//
// The window is wall-clock time in the subprocess, so the test sleeps; its
// margins allow a restart of up to 3s.
func TestSlidingWindowOutlivesARestart(t *testing.T) {
	const w = 6 * time.Second
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	addr := proctest.Addr(t)
	cfg := stageConfig(srv.ClientURL(), t.TempDir(), addr) +
		"window:\n  paths: [{name: device-retry, max: 5s}]\n  margin: 1s\n  refresh_on_repeat: true\n"
	publish := func(keys ...string) {
		t.Helper()
		var msgs []*nats.Msg
		for _, k := range keys {
			msgs = append(msgs, &nats.Msg{Subject: "events.devices", Header: nats.Header{"Event-Id": {k}}, Data: []byte("hello from " + k)})
		}
		natstest.PublishAll(t, js, msgs)
		drained(t, js, 10*time.Second)
	}

	p := startStageWith(t, cfg, addr)
	start := time.Now()
	publish("retrying", "once")
	for range 2 {
		time.Sleep(w / 3)
		publish("retrying")
	}
	if got := scrape(t, addr, "dedupe_messages_total", `outcome="repeat"`); got != 2 {
		t.Fatalf("before the restart: %v repeats, want 2", got)
	}
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Exited()

	startStageWith(t, cfg, addr)
	if wait := time.Until(start.Add(w + w/12)); wait > 0 {
		time.Sleep(wait)
	}
	publish("retrying", "once")
	if elapsed := time.Since(start); elapsed >= w+2*w/3 {
		t.Fatalf("the copies were judged %v after the first, past the last repeat + W: the machine is too slow for this test's margins", elapsed)
	}
	if got := scrape(t, addr, "dedupe_messages_total", `outcome="repeat"`); got != 1 {
		t.Errorf("after the restart, at first seen + %v: %v repeats, want 1 (the retried key)", w+w/12, got)
	}
	if got := scrape(t, addr, "dedupe_messages_total", `outcome="new"`); got != 1 {
		t.Errorf("after the restart, at first seen + %v: %v new, want 1 (the key sent once, its window ended)", w+w/12, got)
	}
}
