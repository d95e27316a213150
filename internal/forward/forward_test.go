package forward_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

func runServer(t *testing.T, maxPayload int32) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	s := natstest.RunServerWith(t, func(o *server.Options) { o.MaxPayload = maxPayload })
	return natstest.Connect(t, s.ClientURL())
}

// TestBatchRejectsOnlyTheRefusedMessage publishes a batch in which some
// messages exceed the output stream's max_msg_size: they come back with
// the server's permanent error, the others are stored once each, and a
// second publish of the same batch reports the stored ones as duplicates.
func TestBatchRejectsOnlyTheRefusedMessage(t *testing.T) {
	_, js := runServer(t, 0)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, MaxMsgSize: 1000, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	var msgs []*nats.Msg
	for i := range 50 {
		size := 10
		if i%10 == 3 {
			size = 2000
		}
		msgs = append(msgs, &nats.Msg{Subject: "out.a", Header: nats.Header{jetstream.MsgIDHeader: {fmt.Sprint("k", i)}}, Data: make([]byte, size)})
	}
	res := make([]forward.Result, len(msgs))
	var reported atomic.Int32
	o := forward.Options{OnRetry: func(int, int, error) { reported.Add(1) }}
	if err := forward.Batch(ctx, js, msgs, res, o); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		var api *jetstream.APIError
		switch {
		case !r.Done:
			t.Errorf("message %d: not done", i)
		case i%10 == 3 && (!errors.As(r.Err, &api) || api.ErrorCode != retry.CodeMessageTooLarge):
			t.Errorf("message %d: err %v, want API error %d", i, r.Err, retry.CodeMessageTooLarge)
		case i%10 != 3 && (r.Err != nil || r.Duplicate):
			t.Errorf("message %d: err %v duplicate %v, want stored", i, r.Err, r.Duplicate)
		}
	}
	if n := reported.Load(); n != 0 {
		t.Errorf("%d retries for permanent refusals, want none", n)
	}
	if n := len(natstest.ReadAll(t, js, "OUT")); n != 45 {
		t.Errorf("output holds %d messages, want 45", n)
	}
	if err := forward.Batch(ctx, js, msgs, res, o); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if i%10 != 3 && !r.Duplicate {
			t.Errorf("message %d published again: not reported as a duplicate", i)
		}
	}
}

// TestBatchRetriesTransientFailures fills the output stream (max_msgs,
// discard new) so that publishes fail, lifts the limit after some retries,
// and expects every message stored; a cancelled ctx ends the retries with
// the unsettled messages not done.
func TestBatchRetriesTransientFailures(t *testing.T) {
	_, js := runServer(t, 0)
	ctx := context.Background()
	cfg := jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, MaxMsgs: 5, Discard: jetstream.DiscardNew}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	msgs := make([]*nats.Msg, 20)
	for i := range msgs {
		msgs[i] = &nats.Msg{Subject: "out.a", Header: nats.Header{jetstream.MsgIDHeader: {fmt.Sprint("k", i)}}, Data: []byte("x")}
	}
	res := make([]forward.Result, len(msgs))
	retries := make(chan int, 100)
	o := forward.Options{OnRetry: func(_, failed int, _ error) { retries <- failed }}

	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := forward.Batch(short, js, msgs, res, o); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Batch with the stream full: %v, want the deadline", err)
	}
	done := 0
	for _, r := range res {
		if r.Done {
			done++
		}
	}
	if done != 5 {
		t.Errorf("%d messages done with room for 5", done)
	}

	go func() {
		<-retries
		<-retries
		cfg.MaxMsgs = -1
		_, _ = js.UpdateStream(ctx, cfg)
	}()
	if err := forward.Batch(ctx, js, msgs, res, o); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if !r.Done || r.Err != nil {
			t.Errorf("message %d: %+v, want stored", i, r)
		}
	}
	if n := len(natstest.ReadAll(t, js, "OUT")); n != 20 {
		t.Errorf("output holds %d messages, want 20", n)
	}
}

// TestCheckSizeMatchesTheServer checks CheckSize at the server's limits: a
// message of exactly max_payload (headers included) is stored, one byte
// more is refused by the client and by CheckSize alike.
func TestCheckSizeMatchesTheServer(t *testing.T) {
	const maxPayload = 4096
	nc, js := runServer(t, maxPayload)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}}); err != nil {
		t.Fatal(err)
	}
	if got := nc.MaxPayload(); got != maxPayload {
		t.Fatalf("MaxPayload() = %d, want %d", got, maxPayload)
	}
	h := nats.Header{jetstream.MsgIDHeader: {"key-1"}, "Trace": {"abc", "def"}}
	data := make([]byte, maxPayload-forward.HeaderSize(h))
	fits := &nats.Msg{Subject: "out.a", Header: h, Data: data}
	if err := forward.CheckSize(fits, nc.MaxPayload()); err != nil {
		t.Errorf("CheckSize of exactly max_payload: %v", err)
	}
	if _, err := js.PublishMsg(ctx, fits); err != nil {
		t.Errorf("publish of exactly max_payload: %v", err)
	}
	over := &nats.Msg{Subject: "out.a", Header: h, Data: append(data, 0)}
	if err := forward.CheckSize(over, nc.MaxPayload()); !errors.Is(err, forward.ErrTooLarge) || !retry.IsPermanent(err) {
		t.Errorf("CheckSize of max_payload+1: %v, want permanent ErrTooLarge", err)
	}
	if _, err := js.PublishMsg(ctx, over); !errors.Is(err, nats.ErrMaxPayload) {
		t.Errorf("publish of max_payload+1: %v, want nats.ErrMaxPayload", err)
	}
	big := &nats.Msg{Subject: "out.a", Header: nats.Header{"X": {strings.Repeat("h", retry.MaxHeaderBytes)}}}
	if err := forward.CheckSize(big, 0); !errors.Is(err, forward.ErrHeadersTooLarge) || !retry.IsPermanent(err) {
		t.Errorf("CheckSize of headers over 64 KiB: %v, want permanent ErrHeadersTooLarge", err)
	}
}

// TestIsDirective: the headers a copy of an input leaves out are those
// nats-server acts on when it stores a message; the message's own headers,
// its id (replaced, not left out) and its TTL are not directives.
func TestIsDirective(t *testing.T) {
	for _, k := range []string{
		jetstream.ExpectedStreamHeader, jetstream.ExpectedLastSubjSeqHeader, jetstream.ExpectedLastMsgIDHeader,
		jetstreamext.BatchIDHeader, jetstreamext.BatchSeqHeader, jetstreamext.BatchCommitHeader,
		"Nats-Rollup", "Nats-Incr", "Nats-Schedule", "Nats-Schedule-TTL", "Nats-Schedule-Target",
		"Nats-Required-Api-Level", "Nats-Trace-Dest", "Nats-Pin-Id",
	} {
		if !forward.IsDirective(k) {
			t.Errorf("IsDirective(%q) = false, want true", k)
		}
	}
	for _, k := range []string{jetstream.MsgIDHeader, "Nats-TTL", "Event-Id", "Trace", "Batch-Id", "Nats-Expected"} {
		if forward.IsDirective(k) {
			t.Errorf("IsDirective(%q) = true, want false", k)
		}
	}
}

// TestStoredUpTo: the highest sequence stored by the batch itself; a
// duplicate, a refusal or an unfinished publish does not count.
func TestStoredUpTo(t *testing.T) {
	res := []forward.Result{
		{Done: true, Seq: 7},
		{Done: true, Seq: 12, Duplicate: true},
		{Done: true, Seq: 11, Err: errors.New("refused")},
		{Seq: 13},
		{Done: true, Seq: 9},
	}
	if got := forward.StoredUpTo(res); got != 9 {
		t.Errorf("StoredUpTo = %d, want 9", got)
	}
	if got := forward.StoredUpTo(res[1:4]); got != 0 {
		t.Errorf("StoredUpTo of a duplicate, a refusal and an unfinished publish = %d, want 0", got)
	}
}

// TestAPIPrefix: a leader's message get goes under the prefix the
// JetStream context itself uses.
func TestAPIPrefix(t *testing.T) {
	for _, c := range []struct {
		opts jetstream.JetStreamOptions
		want string
	}{
		{jetstream.JetStreamOptions{}, "$JS.API."},
		{jetstream.JetStreamOptions{Domain: "hub"}, "$JS.hub.API."},
		{jetstream.JetStreamOptions{APIPrefix: "imp.JS.API"}, "imp.JS.API."},
		{jetstream.JetStreamOptions{APIPrefix: "imp.JS.API."}, "imp.JS.API."},
	} {
		if got := forward.APIPrefix(c.opts); got != c.want {
			t.Errorf("APIPrefix(%+v) = %q, want %q", c.opts, got, c.want)
		}
	}
}
