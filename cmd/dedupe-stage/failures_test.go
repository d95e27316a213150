package main

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// padded returns msg with a Pad header that brings its headers to size
// bytes as sent.
func padded(m *nats.Msg, size int) *nats.Msg {
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	m.Header.Set("Pad", "")
	m.Header.Set("Pad", strings.Repeat("p", size-forward.HeaderSize(m.Header)))
	return m
}

// TestPermanentFailuresSurviveRestart feeds the binary inputs that no retry
// can forward or dead-letter as they are: dead letters over the 64 KiB
// header limit and over the dead-letter stream's max_msg_size, a forward
// over the output's max_msg_size, a forward whose Nats-Msg-Id pushes its
// headers over 64 KiB. Each is dead-lettered with its reason (shrunk where
// needed), a good event after them is forwarded, /healthz answers 200, and
// after a restart nothing comes back and the next good event is forwarded.
func TestPermanentFailuresSurviveRestart(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx := context.Background()
	for _, sc := range []jetstream.StreamConfig{
		{Name: "EVENTS_DEDUPED", Subjects: []string{"deduped.>", "_dedupe.deduped.>"}, Duplicates: time.Hour, MaxMsgSize: 4096},
		{Name: "DEDUPE_DLQ", Subjects: []string{"dedupe.dlq.>"}, MaxMsgSize: 2048},
	} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	addr, dataDir := proctest.Addr(t), t.TempDir()
	p := startStage(t, srv.ClientURL(), dataDir, addr)

	key := func(k string, data []byte) *nats.Msg {
		return &nats.Msg{Subject: "events.x", Header: nats.Header{"Event-Id": {k}}, Data: data}
	}
	bad := []*nats.Msg{
		padded(&nats.Msg{Subject: "events.x", Data: []byte("x")}, retry.MaxHeaderBytes-10),   // no_key, dead letter over 64 KiB of headers
		{Subject: "events.x", Header: nats.Header{"Trace": {"t"}}, Data: make([]byte, 3000)}, // no_key, dead letter over max_msg_size
		key("bad-output-size", make([]byte, 5000)),                                           // output_rejected
		padded(key("bad-output-headers", []byte("x")), retry.MaxHeaderBytes-10),              // oversized
	}
	natstest.PublishAll(t, js, append(bad, key("good-1", []byte("good"))))
	natstest.WaitFor(t, 30*time.Second, "good-1 forwarded", func() bool { return outputCount(t, js) == 1 })
	drained(t, js, 30*time.Second)
	check := func(run string) {
		t.Helper()
		reasons := map[string]int{}
		for _, m := range natstest.ReadAll(t, js, "DEDUPE_DLQ") {
			reasons[m.Header.Get(deadletter.HeaderReason)]++
			if m.Header.Get(deadletter.HeaderReason) == "no_key" && m.Header.Get(deadletter.HeaderHeadersTruncated) == "" {
				t.Errorf("%s: a no_key dead letter is not shrunk: %v bytes of payload", run, len(m.Data))
			}
		}
		want := map[string]int{"no_key": 2, string(deadletter.ReasonOutputRejected): 1, string(deadletter.ReasonOversized): 1}
		for r, n := range want {
			if reasons[r] != n {
				t.Errorf("%s: %d dead letters with reason %s, want %d (all: %v)", run, reasons[r], r, n, reasons)
			}
		}
		if code, body := get(t, "http://"+addr+"/healthz"); code != http.StatusOK {
			t.Errorf("%s: /healthz %d %s", run, code, body)
		}
		if _, body := get(t, "http://"+addr+"/metrics"); !strings.Contains(body, "dedupe_healthy 1") {
			t.Errorf("%s: /metrics does not say dedupe_healthy 1:\n%s", run, grepLines(body, "healthy"))
		}
	}
	check("first run")

	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("still running 30s after SIGTERM")
	}
	p = startStage(t, srv.ClientURL(), dataDir, addr)
	natstest.PublishAll(t, js, []*nats.Msg{key("good-2", []byte("good"))})
	natstest.WaitFor(t, 30*time.Second, "good-2 forwarded", func() bool { return outputCount(t, js) == 2 })
	drained(t, js, 30*time.Second)
	check("after a restart")
	if log := p.Log(); strings.Contains(log, "dead letter refused") || strings.Contains(log, "retrying") {
		t.Errorf("after the restart the stage met a refusal or retried:\n%s", grepLines(log, "refused")+grepLines(log, "retrying"))
	}
}
