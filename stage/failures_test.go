package stage_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// The rows of docs/failures.md that a message can cause, on the forward
// path and on the dead-letter path, each against a real server: the
// offending input is dead-lettered (or counted as unstorable) with its
// reason, a good event published after it is forwarded, /healthz answers
// 200, nothing stays unacked, and a restart does not bring anything back.

// failureCase is one hostile input and what the stage must make of it.
type failureCase struct {
	name       string
	maxPayload int32                      // the server's max_payload; 0: default
	setup      func(t *testing.T, e *env) // changes streams after the stage created them
	bad        func(e *env) *nats.Msg
	reason     deadletter.Reason // the dead letter's reason; "" when none is stored
	detail     string            // a part of its detail
	shrunk     bool              // the dead letter is stored without payload, headers cut
	unstorable bool              // no dead letter: counted in dedupe_dead_letters_unstorable_total
	goodDead   bool              // the good event after it is dead-lettered too (sealed output)
}

// headerPad returns a header value that makes the headers of a message
// with h plus a "Pad" header exactly size bytes as sent.
func headerPad(h nats.Header, size int) string {
	base := forward.HeaderSize(h)
	if base == 0 {
		base = len("NATS/1.0\r\n\r\n")
	}
	return strings.Repeat("p", size-base-len("Pad: \r\n"))
}

// keyed returns an input message with key k (header Event-Id).
func keyed(k string, data []byte) *nats.Msg {
	return &nats.Msg{Subject: "events.orders", Header: nats.Header{"Event-Id": {k}}, Data: data}
}

// keyless returns an input message without a key, with headers of
// headerBytes in all (0: a small header only) and the payload.
func keyless(headerBytes int, data []byte) *nats.Msg {
	h := nats.Header{"Trace": {"keyless"}}
	if headerBytes > 0 {
		h.Set("Pad", headerPad(h, headerBytes))
	}
	return &nats.Msg{Subject: "events.orders", Header: h, Data: data}
}

func updateStream(t *testing.T, e *env, name string, edit func(*jetstream.StreamConfig)) {
	t.Helper()
	ctx := context.Background()
	st, err := e.js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sc := st.CachedInfo().Config
	edit(&sc)
	if _, err := e.js.UpdateStream(ctx, sc); err != nil {
		t.Fatalf("update stream %s: %v", name, err)
	}
}

var failureCases = []failureCase{
	{
		name: "forward larger than the output's max_msg_size",
		setup: func(t *testing.T, e *env) {
			updateStream(t, e, e.cfg.Output.Stream, func(sc *jetstream.StreamConfig) { sc.MaxMsgSize = 4096 })
		},
		bad:    func(*env) *nats.Msg { return keyed("bad-1", make([]byte, 5000)) },
		reason: deadletter.ReasonOutputRejected, detail: "err_code=10054",
	},
	{
		name: "forward to a sealed output stream",
		setup: func(t *testing.T, e *env) {
			updateStream(t, e, e.cfg.Output.Stream, func(sc *jetstream.StreamConfig) { sc.Sealed = true })
		},
		bad:    func(*env) *nats.Msg { return keyed("bad-1", []byte("x")) },
		reason: deadletter.ReasonOutputRejected, detail: "err_code=10109", goodDead: true,
	},
	{
		name: "forward carrying a header the output stream refuses",
		setup: func(t *testing.T, e *env) {
			updateStream(t, e, e.cfg.Input.Stream, func(sc *jetstream.StreamConfig) { sc.AllowMsgTTL = true })
		},
		bad: func(*env) *nats.Msg {
			m := keyed("bad-1", []byte("x"))
			m.Header.Set("Nats-TTL", "1h")
			return m
		},
		reason: deadletter.ReasonOutputRejected, detail: "code=400",
	},
	{
		name: "forward whose Nats-Msg-Id pushes the headers over 64 KiB",
		bad: func(*env) *nats.Msg {
			m := keyed("bad-1", []byte("x"))
			m.Header.Set("Pad", headerPad(m.Header, retry.MaxHeaderBytes-10))
			return m
		},
		reason: deadletter.ReasonOversized, detail: "headers are",
	},
	{
		name:       "forward whose Nats-Msg-Id pushes it over max_payload",
		maxPayload: 16384,
		bad: func(*env) *nats.Msg {
			m := keyed("bad-1", nil)
			m.Data = make([]byte, 16384-5-forward.HeaderSize(m.Header))
			return m
		},
		reason: deadletter.ReasonOversized, detail: "max_payload is 16384",
	},
	{
		name: "dead letter larger than the dead-letter stream's max_msg_size",
		setup: func(t *testing.T, e *env) {
			updateStream(t, e, e.cfg.DeadLetter.Stream, func(sc *jetstream.StreamConfig) { sc.MaxMsgSize = 1024 })
		},
		bad:    func(*env) *nats.Msg { return keyless(0, make([]byte, 1800)) },
		reason: "no_key", shrunk: true,
	},
	{
		name: "dead letter refused even shrunk",
		setup: func(t *testing.T, e *env) {
			updateStream(t, e, e.cfg.DeadLetter.Stream, func(sc *jetstream.StreamConfig) { sc.MaxMsgSize = 150 })
		},
		bad:        func(*env) *nats.Msg { return keyless(0, make([]byte, 1800)) },
		reason:     "no_key",
		unstorable: true,
	},
	{
		name: "dead letter to a sealed dead-letter stream",
		setup: func(t *testing.T, e *env) {
			updateStream(t, e, e.cfg.DeadLetter.Stream, func(sc *jetstream.StreamConfig) { sc.Sealed = true })
		},
		bad:        func(*env) *nats.Msg { return keyless(0, []byte("x")) },
		reason:     "no_key",
		unstorable: true,
	},
	{
		name:   "dead letter whose headers pass 64 KiB",
		bad:    func(*env) *nats.Msg { return keyless(retry.MaxHeaderBytes-10, []byte("x")) },
		reason: "no_key", shrunk: true,
	},
	{
		name:       "dead letter whose headers pass max_payload",
		maxPayload: 16384,
		bad:        func(*env) *nats.Msg { return keyless(16300, nil) },
		reason:     "no_key", shrunk: true,
	},
}

// TestPermanentFailuresDoNotWedge runs every case with output.publish auto
// (here one publish per message, dead letters too) and atomic (the output
// and the dead letters as atomic batches).
func TestPermanentFailuresDoNotWedge(t *testing.T) {
	for _, publish := range []string{config.PublishAuto, config.PublishAtomic} {
		t.Run("publish="+publish, func(t *testing.T) { permanentFailuresDoNotWedge(t, publish) })
	}
}

func permanentFailuresDoNotWedge(t *testing.T, publish string) {
	for _, tc := range failureCases {
		t.Run(tc.name, func(t *testing.T) {
			srv := natstest.RunServerWith(t, func(o *server.Options) {
				if tc.maxPayload > 0 {
					o.MaxPayload = tc.maxPayload
				}
			})
			e := newEnvOn(t, srv)
			e.cfg.Output.Publish = publish
			r := e.start()
			if tc.setup != nil {
				tc.setup(t, e)
			}
			bad := tc.bad(e)
			natstest.PublishAll(t, e.js, []*nats.Msg{bad, keyed("good-1", []byte("good"))})
			e.drained(30 * time.Second)
			checkOutcome(t, e, r, tc, 1)

			// A restart brings back nothing: everything is acked, the same
			// dead letters, and the next good event goes through.
			r.stop(t)
			r = e.start()
			natstest.PublishAll(t, e.js, []*nats.Msg{keyed("good-2", []byte("good"))})
			e.drained(30 * time.Second)
			checkOutcome(t, e, r, tc, 2)
		})
	}
}

// checkOutcome checks what the stage made of tc's input followed by goods
// good events (good-1, good-2, ...).
func checkOutcome(t *testing.T, e *env, r *running, tc failureCase, goods int) {
	t.Helper()
	out := e.outputByKey()
	dead := map[deadletter.Reason][]natstest.Message{}
	for _, m := range natstest.ReadAll(t, e.js, e.cfg.DeadLetter.Stream) {
		r := deadletter.Reason(m.Header.Get(deadletter.HeaderReason))
		dead[r] = append(dead[r], m)
	}
	wantDead := 1
	if tc.goodDead {
		wantDead += goods
	}
	if tc.unstorable {
		wantDead = 0
	}
	if n := len(dead[tc.reason]); n != wantDead {
		t.Errorf("%d dead letters with reason %s, want %d", n, tc.reason, wantDead)
	}
	for g := 1; g <= goods; g++ {
		k := fmt.Sprintf("good-%d", g)
		if n := len(out[k]); !tc.goodDead && n != 1 {
			t.Errorf("good event %s forwarded %d times, want 1", k, n)
		}
	}
	if n := len(out["bad-1"]); n != 0 {
		t.Errorf("the bad input was forwarded %d times", n)
	}
	for _, m := range dead[tc.reason] {
		if m.Header.Get(deadletter.HeaderOriginalSequence) != "1" {
			continue // a good event dead-lettered after it
		}
		if d := m.Header.Get(deadletter.HeaderDetail); !strings.Contains(d, tc.detail) {
			t.Errorf("detail %q does not contain %q", d, tc.detail)
		} else if goods == 1 {
			t.Logf("dead letter %s: %s", tc.reason, d)
		}
		if m.Header.Get(deadletter.HeaderOriginalStream) != e.cfg.Input.Stream {
			t.Errorf("dead letter does not point at stream %s: %v", e.cfg.Input.Stream, m.Header)
		}
		if tc.shrunk {
			if len(m.Data) != 0 || m.Header.Get(deadletter.HeaderPayloadOmitted) == "" || m.Header.Get(deadletter.HeaderHeadersTruncated) == "" {
				t.Errorf("dead letter not shrunk: %d bytes of payload, headers %d bytes, omitted %q, truncated %q",
					len(m.Data), forward.HeaderSize(m.Header), m.Header.Get(deadletter.HeaderPayloadOmitted), m.Header.Get(deadletter.HeaderHeadersTruncated))
			}
			if m.Header.Get("Trace") != "keyless" {
				t.Errorf("shrunk dead letter lost the input's Trace header: %v", m.Header.Get("Trace"))
			}
		}
	}
	// After a restart the bad input is not judged again: nothing counted.
	if v := counter(t, r.reg, "dedupe_dead_letters_unstorable_total", nil); (tc.unstorable && goods == 1) != (v == 1) {
		t.Errorf("dedupe_dead_letters_unstorable_total = %v after %d good events; unstorable: %v", v, goods, tc.unstorable)
	}
	assertHealthy(t, r)
}

// assertHealthy checks /healthz and /readyz answer 200 and the gauges say
// healthy and ready.
func assertHealthy(t *testing.T, r *running) {
	t.Helper()
	h := stage.NewHandler(r.reg, r.status)
	for _, path := range []string{"/healthz", "/readyz"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK {
			t.Errorf("%s: %d %s", path, rec.Code, rec.Body)
		}
	}
	if v := gauge(t, r.reg, "dedupe_healthy"); v != 1 {
		t.Errorf("dedupe_healthy = %v, want 1", v)
	}
}

// TestOversizeKeylessInARowDoNotStall publishes 300 keyless messages whose
// dead letters pass the 64 KiB header limit, then good events: every good
// event is forwarded, every bad one is dead-lettered shrunk.
func TestOversizeKeylessInARowDoNotStall(t *testing.T) {
	e := newEnv(t)
	r := e.start()
	const bad, good = 300, 50
	var msgs []*nats.Msg
	for range bad {
		msgs = append(msgs, keyless(retry.MaxHeaderBytes-10, []byte("x")))
	}
	for i := range good {
		msgs = append(msgs, keyed(fmt.Sprint("good-", i), []byte("good")))
	}
	natstest.PublishAll(t, e.js, msgs)
	natstest.WaitFor(t, 60*time.Second, "every good event forwarded", func() bool {
		return len(e.outputByKey()) == good
	})
	e.drained(60 * time.Second)
	dl := natstest.ReadAll(t, e.js, e.cfg.DeadLetter.Stream)
	if len(dl) != bad {
		t.Errorf("%d dead letters, want %d", len(dl), bad)
	}
	for _, m := range dl {
		if m.Header.Get(deadletter.HeaderHeadersTruncated) == "" {
			t.Errorf("dead letter of sequence %s not shrunk", m.Header.Get(deadletter.HeaderOriginalSequence))
			break
		}
	}
	assertHealthy(t, r)
}
