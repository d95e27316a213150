package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/redrive"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// redriveJSON runs `dedupe-stage redrive --json args...` and returns its
// exit code and summary.
func redriveJSON(t *testing.T, args ...string) (int, redrive.Summary) {
	t.Helper()
	code, out := output(t, nil, append([]string{"redrive", "--json"}, args...)...)
	var sum redrive.Summary
	start := strings.IndexByte(out, '{')
	if start < 0 || json.Unmarshal([]byte(out[start:strings.LastIndexByte(out, '}')+1]), &sum) != nil {
		t.Fatalf("redrive %v exited %d without a JSON summary:\n%s", args, code, out)
	}
	return code, sum
}

// TestRedriveThroughTheBinary runs the stage and redrive as users do: the
// output stream refuses large events (output_rejected), the operator
// raises its limit, then redrives the dead letters in two runs (the first
// cut off by --limit) and a third. Each copy reaches the stage, which
// forwards each key once; no run doubles a copy; a dead letter stored
// shrunk is refused with its reason (exit 1); a dead letter of another
// reason is republished and judged again like any input. Redriven again
// with fresh marks once the input's duplicate window has passed, the
// copies are recognised as repeats and nothing more is forwarded.
func TestRedriveThroughTheBinary(t *testing.T) {
	srv := natstest.RunServer(t, "")
	url := srv.ClientURL()
	_, js := natstest.Connect(t, url)
	ctx := context.Background()
	for _, sc := range []jetstream.StreamConfig{
		// A short duplicate window on the input, so that the last step can wait it out.
		{Name: "EVENTS", Subjects: []string{"events.>"}, Duplicates: time.Second},
		{Name: "EVENTS_DEDUPED", Subjects: []string{"deduped.>", "_dedupe.deduped.>"}, Duplicates: time.Hour, MaxMsgSize: 4096},
		{Name: "DEDUPE_DLQ", Subjects: []string{"dedupe.dlq.>"}, MaxMsgSize: 8192},
	} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	addr := proctest.Addr(t)
	startStage(t, url, t.TempDir(), addr)

	event := func(id string, size int) *nats.Msg {
		m := &nats.Msg{Subject: "events.orders", Header: nats.Header{"Trace": {"tr-" + id}}, Data: make([]byte, size)}
		if id != "" {
			m.Header.Set("Event-Id", id)
		}
		return m
	}
	msgs := []*nats.Msg{event("ok", 10)}
	for i := 1; i <= 5; i++ {
		msgs = append(msgs, event(fmt.Sprintf("big-%d", i), 5000)) // output_rejected
	}
	msgs = append(msgs, event("", 10)) // no_key
	natstest.PublishAll(t, js, msgs)
	natstest.WaitFor(t, 30*time.Second, "the good event forwarded", func() bool { return outputCount(t, js) == 1 })
	drained(t, js, 30*time.Second)
	natstest.WaitFor(t, 30*time.Second, "6 dead letters", func() bool { return streamMsgs(t, js, "DEDUPE_DLQ") == 6 })
	// The one stored shrunk goes last, so that the runs below meet it in a
	// known place: the stage's partitions dead-letter side by side, in no
	// set order.
	natstest.PublishAll(t, js, []*nats.Msg{event("huge", 10000)}) // output_rejected, stored shrunk
	drained(t, js, 30*time.Second)
	natstest.WaitFor(t, 30*time.Second, "7 dead letters", func() bool { return streamMsgs(t, js, "DEDUPE_DLQ") == 7 })

	// The cause is fixed: the output takes large events now.
	if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: "EVENTS_DEDUPED", Subjects: []string{"deduped.>", "_dedupe.deduped.>"},
		Duplicates: time.Hour, MaxMsgSize: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	conn := []string{"-s", url, "--reason", "output_rejected"}
	code, dry := redriveJSON(t, append(conn, "--dry-run")...)
	if code != 1 || dry.Republished != 5 || dry.Refused[redrive.RefusedHeadersTruncated] != 1 || !dry.DryRun {
		t.Fatalf("dry run: exit %d, %+v; want 5 to republish, the shrunk one refused, exit 1", code, dry)
	}
	if n := streamMsgs(t, js, "EVENTS"); n != 8 {
		t.Fatalf("the dry run published: %d inputs, want 8", n)
	}

	code, first := redriveJSON(t, append(conn, "--limit", "2")...)
	if code != 0 || first.Republished != 2 || !first.LimitReached {
		t.Fatalf("first run: exit %d, %+v; want 2 republished and the limit reached", code, first)
	}
	code, second := redriveJSON(t, conn...)
	if code != 1 || second.AlreadyRedriven != 2 || second.Republished != 3 || second.Refused[redrive.RefusedHeadersTruncated] != 1 {
		t.Fatalf("second run: exit %d, %+v; want 2 already, 3 republished, 1 refused", code, second)
	}
	code, third := redriveJSON(t, conn...)
	if code != 1 || third.AlreadyRedriven != 5 || third.Republished != 0 {
		t.Fatalf("third run: exit %d, %+v; want all 5 already republished", code, third)
	}
	natstest.WaitFor(t, 30*time.Second, "the 5 redriven events forwarded", func() bool { return outputCount(t, js) == 6 })
	drained(t, js, 30*time.Second)
	if n := streamMsgs(t, js, "EVENTS"); n != 8+5 {
		t.Errorf("%d inputs after three runs, want the 8 published and 5 copies", n)
	}
	forwarded := map[string]int{}
	for _, m := range natstest.ReadAll(t, js, "EVENTS_DEDUPED") {
		forwarded[m.Header.Get(jetstream.MsgIDHeader)]++
	}
	for i := 1; i <= 5; i++ {
		if id := fmt.Sprintf("big-%d", i); forwarded[id] != 1 {
			t.Errorf("%s forwarded %d times, want once (all: %v)", id, forwarded[id], forwarded)
		}
	}

	// Every reason: no_key lies in the input, and is refused unless forced.
	code, out := output(t, nil, "redrive", "-s", url)
	if code != 1 || !strings.Contains(out, "no_key  events.orders  refused reason_in_input: no_key lies in the input itself") ||
		!strings.Contains(out, "selected 7, republished 0, already republished 5, refused 2 (headers_truncated 1, reason_in_input 1)") {
		t.Fatalf("redrive of every reason: exit %d\n%s", code, out)
	}
	// Forced, it is republished and, still without a key, dead-lettered
	// again, saying where it came from and why it was redriven.
	code, out = output(t, nil, "redrive", "-s", url, "--reason", "no_key", "--force")
	if code != 0 || !strings.Contains(out, "no_key  events.orders  republished as EVENTS 14") {
		t.Fatalf("redrive --reason no_key --force: exit %d\n%s", code, out)
	}
	natstest.WaitFor(t, 30*time.Second, "the no_key copy dead-lettered again", func() bool { return streamMsgs(t, js, "DEDUPE_DLQ") == 8 })
	dls := natstest.ReadAll(t, js, "DEDUPE_DLQ")
	var from uint64
	for _, m := range dls[:7] {
		if m.Header.Get(deadletter.HeaderReason) == "no_key" {
			from = m.Seq
		}
	}
	last := dls[len(dls)-1]
	if last.Header.Get(deadletter.HeaderReason) != "no_key" || last.Header.Get(redrive.HeaderRedrivenFrom) != fmt.Sprintf("DEDUPE_DLQ:%d", from) ||
		last.Header.Get(redrive.HeaderRedrivenReason) != "no_key" || last.Header.Get("Trace") != "tr-" {
		t.Errorf("last dead letter %v, want the no_key copy with its Trace and where and why it was redriven", last.Header)
	}
	// Run again, as on a schedule: the copy's dead letter is skipped, the
	// dry run says why, and the dead-letter stream does not grow.
	code, out = output(t, nil, "redrive", "-s", url, "--reason", "no_key", "--dry-run")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("seq %d  no_key  events.orders  skipped dead_lettered_again: a copy of dead letter DEDUPE_DLQ:%d", last.Seq, from)) ||
		!strings.Contains(out, "skipped 1 (dead_lettered_again 1)") {
		t.Errorf("redrive --reason no_key --dry-run after the loop: exit %d\n%s", code, out)
	}
	for i := range 2 {
		code, out = output(t, nil, "redrive", "-s", url, "--reason", "no_key")
		if code != 0 || !strings.Contains(out, "republished 0, already republished 1, refused 0, skipped 1") {
			t.Errorf("scheduled redrive %d of no_key: exit %d\n%s", i+1, code, out)
		}
	}
	drained(t, js, 30*time.Second)
	if n := streamMsgs(t, js, "DEDUPE_DLQ"); n != 8 {
		t.Errorf("%d dead letters after the scheduled redrives, want still 8", n)
	}

	// With fresh marks, after the input's duplicate window: the copies
	// reach the stage again and are judged repeats.
	repeats := scrape(t, addr, "dedupe_messages_total", `outcome="repeat"`)
	time.Sleep(1100 * time.Millisecond) // EVENTS' duplicate window
	code, again := redriveJSON(t, append(conn, "--progress-bucket", "SECOND")...)
	if code != 1 || again.Republished != 5 {
		t.Fatalf("redrive with fresh marks: exit %d, %+v; want 5 republished", code, again)
	}
	drained(t, js, 30*time.Second)
	natstest.WaitFor(t, 30*time.Second, "5 more repeats", func() bool {
		return scrape(t, addr, "dedupe_messages_total", `outcome="repeat"`) == repeats+5
	})
	if n := outputCount(t, js); n != 6 {
		t.Errorf("%d forwarded after the copies came again, want still 6", n)
	}
}

// redrive's exit statuses: 2 usage, 3 no server, as check-config's.
func TestRedriveExitCodes(t *testing.T) {
	srv := natstest.RunServer(t, "")
	for _, tc := range []struct {
		name string
		args []string
		code int
		says string
	}{
		{"unknown reason", []string{"-s", srv.ClientURL(), "--reason", "nope"}, 2, `unknown dead-letter reason "nope"`},
		{"bad time", []string{"-s", srv.ClientURL(), "--since", "yesterday"}, 2, "RFC 3339"},
		{"unknown flag", []string{"-s", srv.ClientURL(), "--bogus"}, 2, "bogus"},
		{"no server configured", nil, 2, "give -s/--server"},
		{"no server there", []string{"-s", "nats://127.0.0.1:1"}, 3, ""},
		{"no dead-letter stream", []string{"-s", srv.ClientURL()}, 1, "DEDUPE_DLQ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := output(t, []string{"NATS_URL=", "DEDUPE_CONFIG="}, append([]string{"redrive"}, tc.args...)...)
			if code != tc.code || !strings.Contains(out, tc.says) {
				t.Errorf("exit %d, want %d saying %q:\n%s", code, tc.code, tc.says, out)
			}
		})
	}
}

// TestRedriveStoppedMidwayDoesNotDouble stops a redrive while it
// publishes and runs it again: every dead letter ends with exactly one
// copy in the input stream. SIGKILL may leave a copy stored without its
// mark, which the input stream's duplicate window then drops; SIGINT ends
// the run after the copy in hand is marked, with exit 1 and the summary.
func TestRedriveStoppedMidwayDoesNotDouble(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) { redriveStoppedMidway(t, sig) })
	}
}

func redriveStoppedMidway(t *testing.T, sig syscall.Signal) {
	const n = 2000 // about 2s of redrive here; the stop comes after a tenth
	srv := natstest.RunServer(t, "")
	url := srv.ClientURL()
	_, js := natstest.Connect(t, url)
	ctx := context.Background()
	for _, sc := range []jetstream.StreamConfig{
		{Name: "EVENTS", Subjects: []string{"events.>"}},
		{Name: "DEDUPE_DLQ", Subjects: []string{"dedupe.dlq.>"}},
	} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	inputs, dls := make([]*nats.Msg, n), make([]*nats.Msg, n)
	for i := range n {
		inputs[i] = &nats.Msg{Subject: "events.orders", Header: nats.Header{"Event-Id": {fmt.Sprint(i)}}, Data: []byte("x")}
		in := deadletter.Input{Reason: deadletter.ReasonOutputRejected, Header: inputs[i].Header, Data: inputs[i].Data,
			Subject: "events.orders", Stream: "EVENTS", Sequence: uint64(i + 1)}
		dls[i] = deadletter.Build(in, "dedupe.dlq.output_rejected", 1<<20, deadletter.OmittedTooLarge)
	}
	natstest.PublishAll(t, js, inputs)
	natstest.PublishAll(t, js, dls)

	// The stage keys by Event-Id, so the copies carry redrive's Nats-Msg-Id.
	args := []string{"-s", url, "--key-header", "Event-Id"}
	p := spawn(t, nil, append([]string{"redrive"}, args...)...)
	natstest.WaitFor(t, 60*time.Second, "a tenth of the copies", func() bool { return streamMsgs(t, js, "EVENTS") >= n+n/10 })
	if !p.Running() {
		t.Fatalf("redrive finished before it could be stopped: %v\n%s", p.Err(), p.LogTail(2000))
	}
	p.signal(t, sig)
	code := p.waitExit(t, 30*time.Second)
	stopped := streamMsgs(t, js, "EVENTS") - n
	if stopped >= n {
		t.Fatalf("all %d copies were stored before the signal", n)
	}
	if sig == syscall.SIGINT && (code != 1 || !strings.Contains(p.Log(), "interrupted") || !strings.Contains(p.Log(), "republished")) {
		t.Errorf("after SIGINT: exit %d, want 1 with the summary and why:\n%s", code, p.LogTail(1000))
	}

	code, sum := redriveJSON(t, args...)
	if code != 0 || sum.Selected != n || sum.Republished+sum.AlreadyRedriven != n || sum.AlreadyRedriven < int(stopped) {
		t.Fatalf("the run after the stop (%v, at %d copies): exit %d, selected %d, republished %d, already %d; want all %d, at least %d already",
			sig, stopped, code, sum.Selected, sum.Republished, sum.AlreadyRedriven, n, stopped)
	}
	for _, r := range sum.Results {
		if r.Outcome == redrive.AlreadyRedriven && strings.Contains(r.Detail, "duplicate window") {
			if sig == syscall.SIGINT {
				t.Errorf("dead letter %d: SIGINT left its copy without its mark", r.Seq)
			}
			t.Logf("dead letter %d: its copy was stored without its mark before the stop (%v): %s", r.Seq, sig, r.Detail)
		}
	}
	per := map[string]int{}
	for _, m := range natstest.ReadAll(t, js, "EVENTS") {
		if from := m.Header.Get(redrive.HeaderRedrivenFrom); from != "" {
			per[from]++
		}
	}
	for from, c := range per {
		if c != 1 {
			t.Errorf("dead letter %s has %d copies, want 1", from, c)
		}
	}
	if len(per) != n {
		t.Errorf("%d dead letters have a copy, want %d", len(per), n)
	}
}
