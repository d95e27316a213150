package stage_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/stage"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// env is one test's server, connection and configuration.
type env struct {
	t       *testing.T
	srv     *server.Server
	nc      *nats.Conn
	js      jetstream.JetStream
	cfg     config.Config
	clock   window.Clock
	dataDir string
	// inputClock, when set, gives every message its time as its input
	// time (Stage.SetInputTimeHook) instead of the time the input stream
	// stored it: a test steps it between publishes.
	inputClock *window.ManualClock
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvOn(t, natstest.RunServer(t, ""))
}

// newEnvOn is newEnv on a server the test started.
func newEnvOn(t *testing.T, srv *server.Server) *env {
	t.Helper()
	return newEnvAt(t, srv, srv.ClientURL())
}

// newEnvAt is newEnvOn connecting to url (a URL of srv with credentials).
func newEnvAt(t *testing.T, srv *server.Server, url string) *env {
	t.Helper()
	nc, js := natstest.Connect(t, url)
	cfg := config.Default()
	yes := true
	cfg.NATS.URL = url
	cfg.NATS.CreateStreams = &yes
	cfg.State.DataDir = t.TempDir()
	cfg.State.Partitions = 4
	no := false
	cfg.State.SyncWrites = &no
	cfg.State.MemoryBudget = 64 << 20
	cfg.Filter.ExpectedKeys = 100_000
	cfg.HTTP.Addr = ""
	cfg.Input.AckWait = config.Duration(5 * time.Second)
	// The input stream has its own duplicate window on Nats-Msg-Id; key on
	// another header so the stage sees every copy.
	cfg.Key = keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceHeader, Header: "Event-Id"}, MaxLength: 256}
	return &env{t: t, srv: srv, nc: nc, js: js, cfg: cfg, clock: window.SystemClock{}, dataDir: cfg.State.DataDir}
}

// running is a stage running in the background.
type running struct {
	st     *stage.Stage
	status *stage.Health
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

func (e *env) start() *running {
	e.t.Helper()
	return e.startWith(nil)
}

// startWith starts the stage logging to log (nil: slog.Default()).
func (e *env) startWith(log *slog.Logger) *running {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	status := &stage.Health{}
	st, err := stage.New(context.Background(), stage.Options{Config: e.cfg, Conn: e.nc, Registry: reg, Clock: e.clock, Health: status, Logger: log})
	if err != nil {
		e.t.Fatalf("stage.New: %v", err)
	}
	if c := e.inputClock; c != nil {
		st.SetInputTimeHook(func(jetstream.Msg, time.Time) time.Time { return c.Now() })
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{st: st, status: status, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- st.Run(ctx) }()
	e.t.Cleanup(func() { r.stop(e.t) })
	return r
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return 60s after stop")
	}
	if err := r.st.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// event is one published input message.
type event struct {
	key     string
	payload []byte
}

func (e *env) publish(evs []event) {
	e.t.Helper()
	msgs := make([]*nats.Msg, len(evs))
	for i, ev := range evs {
		m := &nats.Msg{Subject: "events.orders", Header: nats.Header{}, Data: ev.payload}
		if ev.key != "" {
			m.Header.Set("Event-Id", ev.key)
		}
		m.Header.Set("Trace", "t-"+ev.key)
		msgs[i] = m
	}
	natstest.PublishAll(e.t, e.js, msgs)
}

// drained waits until the stage's consumer has acked everything.
func (e *env) drained(timeout time.Duration) {
	e.t.Helper()
	natstest.WaitDrained(e.t, e.js, e.cfg.Input.Stream, e.cfg.Input.Consumer, timeout)
}

// holdUntilRedelivered blocks until the server has delivered an input
// message a second time (its AckWait expired), polling the consumer, for at
// most 30s. It is called from the stage's own goroutines (hooks), so it
// reports a timeout with Errorf.
func (e *env) holdUntilRedelivered() {
	if !natstest.Until(30*time.Second, 20*time.Millisecond, func() bool {
		c, err := e.js.Consumer(context.Background(), e.cfg.Input.Stream, e.cfg.Input.Consumer)
		if err != nil {
			return false
		}
		info, err := c.Info(context.Background())
		return err == nil && info.Delivered.Consumer > info.Delivered.Stream
	}) {
		e.t.Errorf("no input message was redelivered within 30s")
	}
}

// outputByKey reads the output stream and groups it by Nats-Msg-Id.
func (e *env) outputByKey() map[string][]natstest.Message {
	e.t.Helper()
	out := map[string][]natstest.Message{}
	for _, m := range natstest.ReadAll(e.t, e.js, e.cfg.Output.Stream) {
		id := m.Header.Get(jetstream.MsgIDHeader)
		out[id] = append(out[id], m)
	}
	return out
}

// workload makes n events over unique keys with the given repeat ratio:
// some copies adjacent (same batch), some thousands of events later.
func workload(seed uint64, n int, repeatRatio float64) (evs []event, unique map[string][]byte) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	unique = map[string][]byte{}
	var keys []string
	for len(evs) < n {
		if len(keys) > 0 && rng.Float64() < repeatRatio {
			var k string
			if rng.IntN(2) == 0 {
				k = keys[len(keys)-1] // adjacent: same batch
			} else {
				k = keys[rng.IntN(len(keys))] // anywhere earlier, often thousands back
			}
			evs = append(evs, event{key: k, payload: unique[k]})
			continue
		}
		k := fmt.Sprintf("order-%d-%d", seed, len(keys))
		unique[k] = fmt.Appendf(nil, `{"id":%q,"amount":%d}`, k, rng.IntN(10000))
		keys = append(keys, k)
		evs = append(evs, event{key: k, payload: unique[k]})
	}
	return evs, unique
}

// assertExactlyOnce checks the output holds each unique key once, with its
// payload and headers, and nothing else.
func (e *env) assertExactlyOnce(unique map[string][]byte) {
	e.t.Helper()
	out := e.outputByKey()
	for k, payload := range unique {
		got := out[k]
		if len(got) != 1 {
			e.t.Errorf("key %s: %d output messages, want 1", k, len(got))
			continue
		}
		if string(got[0].Data) != string(payload) {
			e.t.Errorf("key %s: payload %q, want %q", k, got[0].Data, payload)
		}
		if tr := got[0].Header.Get("Trace"); tr != "t-"+k {
			e.t.Errorf("key %s: Trace header %q, want %q", k, tr, "t-"+k)
		}
		if got[0].Subject != "deduped.events.orders" {
			e.t.Errorf("key %s: subject %q", k, got[0].Subject)
		}
	}
	for k := range out {
		if _, ok := unique[k]; !ok {
			e.t.Errorf("output holds key %q that was never published", k)
		}
	}
}

// counter sums the series of metric name in reg whose labels include
// labels (metrictest.Sum).
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	return metrictest.Sum(t, reg, name, labels)
}

func TestForwardsEachKeyOnceAndSurvivesRestart(t *testing.T) {
	e := newEnv(t)
	evs, unique := workload(1, 10_000, 0.3)
	r := e.start()
	e.publish(evs)
	e.drained(60 * time.Second)
	e.assertExactlyOnce(unique)
	newCount := counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "new"})
	repeats := counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "repeat"})
	if int(newCount) != len(unique) || int(newCount+repeats) != len(evs) {
		t.Errorf("metrics: new %v repeat %v, want new %d and new+repeat %d", newCount, repeats, len(unique), len(evs))
	}
	if lookups := counter(t, r.reg, "dedupe_filter_answers_total", map[string]string{"answer": "negative"}); lookups == 0 {
		t.Errorf("the pre-check never answered definitely-new")
	}

	// Stop, start again on the same data dir, republish everything.
	r.stop(t)
	r2 := e.start()
	e.publish(evs)
	e.drained(60 * time.Second)
	e.assertExactlyOnce(unique)
	if got := counter(t, r2.reg, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != 0 {
		t.Errorf("after restart and full replay: %v new, want 0", got)
	}
}

func TestRedeliveryWhileFirstDeliveryInFlight(t *testing.T) {
	e := newEnv(t)
	e.cfg.Input.AckWait = config.Duration(1 * time.Second)
	e.cfg.Output.RestartMargin = config.Duration(10 * time.Second)
	r := e.start()
	var once sync.Once
	r.st.SetBeforePublishHook(func(int, int) {
		// Hold the first batch past AckWait, until the server redelivers it.
		once.Do(e.holdUntilRedelivered)
	})
	e.publish([]event{{key: "slow-1", payload: []byte("p")}})
	e.drained(30 * time.Second)
	out := e.outputByKey()
	if len(out["slow-1"]) != 1 || len(out) != 1 {
		t.Fatalf("output %v, want slow-1 once", out)
	}
	c, err := e.js.Consumer(context.Background(), e.cfg.Input.Stream, e.cfg.Input.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered == 0 && counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "repeat"}) == 0 {
		t.Fatalf("the message was never redelivered: the test did not exercise the race")
	}
	if got := counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "repeat"}); got < 1 {
		t.Errorf("repeat count %v, want the redelivery recognised as a repeat", got)
	}
}

func TestBadInputIsDeadLetteredWithReason(t *testing.T) {
	e := newEnv(t)
	e.cfg.Pipeline.MaxMessageBytes = 1024
	e.cfg.Key.MaxLength = 32
	r := e.start()
	good := []event{{key: "good-1", payload: []byte(`{"a":1}`)}, {key: "good-2", payload: []byte(`{"a":2}`)}}
	bad := map[string]event{
		"no_key":               {key: "", payload: []byte("no key header")},
		"oversized":            {key: "big-1", payload: []byte(strings.Repeat("x", 2048))},
		"key_too_long":         {key: strings.Repeat("k", 40), payload: []byte("long key")},
		"fingerprint_mismatch": {key: "good-1", payload: []byte(`{"a":"different"}`)},
	}
	e.publish(good)
	e.drained(30 * time.Second)
	var evs []event
	for _, ev := range bad {
		evs = append(evs, ev)
	}
	e.publish(evs)
	e.drained(30 * time.Second)

	out := e.outputByKey()
	if len(out) != 2 || len(out["good-1"]) != 1 || len(out["good-2"]) != 1 {
		t.Errorf("output keys %d, want good-1 and good-2 once each", len(out))
	}
	dl := natstest.ReadAll(t, e.js, e.cfg.DeadLetter.Stream)
	got := map[string]natstest.Message{}
	for _, m := range dl {
		got[m.Header.Get(deadletter.HeaderReason)] = m
	}
	for reason, ev := range bad {
		m, ok := got[reason]
		if !ok {
			t.Errorf("no dead letter with reason %s", reason)
			continue
		}
		if m.Subject != e.cfg.DeadLetter.Subject+"."+reason {
			t.Errorf("%s: subject %q", reason, m.Subject)
		}
		if m.Header.Get(deadletter.HeaderDetail) == "" || m.Header.Get(deadletter.HeaderOriginalSequence) == "" {
			t.Errorf("%s: missing detail or original sequence: %v", reason, m.Header)
		}
		if reason != "oversized" && string(m.Data) != string(ev.payload) {
			t.Errorf("%s: dead letter payload %q, want the original %q", reason, m.Data, ev.payload)
		}
	}
	if len(dl) != len(bad) {
		t.Errorf("%d dead letters, want %d", len(dl), len(bad))
	}
	for reason := range bad {
		if v := counter(t, r.reg, "dedupe_dead_letters_total", map[string]string{"reason": reason}); v != 1 {
			t.Errorf("dedupe_dead_letters_total{reason=%s} = %v, want 1", reason, v)
		}
	}
	// The fingerprint mismatch was judged in its key's partition; the
	// other three never reached one.
	if v := counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "dead_letter"}); v != 1 {
		t.Errorf("dedupe_messages_total{outcome=dead_letter} = %v, want 1 (the fingerprint mismatch)", v)
	}
	if v := counter(t, r.reg, "dedupe_unpartitioned_dead_letters_total", nil); v != 3 {
		t.Errorf("dedupe_unpartitioned_dead_letters_total = %v, want 3 (no_key, oversized, key_too_long)", v)
	}
	if _, ok := metrictest.Lookup(t, r.reg, "dedupe_messages_total", map[string]string{"partition": "none"}); ok {
		t.Errorf("dedupe_messages_total has a series with partition=\"none\"; inputs that reach no partition have a metric of their own")
	}
}

func TestJSONKeyWithScope(t *testing.T) {
	e := newEnv(t)
	e.cfg.Key = keys.KeyConfig{
		Field:     keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "event.id"},
		Scope:     keys.FieldSpec{Source: keys.SourceHeader, Header: "Tenant"},
		MaxLength: 128,
	}
	e.start()
	pub := func(tenant, body string) {
		m := &nats.Msg{Subject: "events.webhooks", Header: nats.Header{"Tenant": {tenant}}, Data: []byte(body)}
		if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	pub("acme", `{"event":{"id":"evt_1"}}`)
	pub("acme", `{"event":{"id":"evt_1"}}`) // repeat
	pub("zeta", `{"event":{"id":"evt_1"}}`) // same id, other tenant: new
	pub("acme", `{"event":{"id":`)          // malformed
	e.drained(30 * time.Second)
	out := e.outputByKey()
	if len(out) != 2 || len(out["acme:evt_1"]) != 1 || len(out["zeta:evt_1"]) != 1 {
		t.Errorf("output %v, want acme:evt_1 and zeta:evt_1 once each", out)
	}
	dl := natstest.ReadAll(t, e.js, e.cfg.DeadLetter.Stream)
	if len(dl) != 1 || dl[0].Header.Get(deadletter.HeaderReason) != "bad_payload" {
		t.Errorf("dead letters %v, want one bad_payload", dl)
	}
}

// TestKeysPastTheWindowAreForwardedAgain: a copy the input stored W or
// more after its key's first copy is forwarded again, with an id of its
// own (k1.after.<first copy's time>), though the output's duplicate window
// (2 minutes, on the servers' clock) still holds the first forward, and a
// copy of the second window is a repeat of it.
func TestKeysPastTheWindowAreForwardedAgain(t *testing.T) {
	e := newEnv(t)
	clock := window.NewManualClock(time.Now())
	e.inputClock = clock
	e.cfg.Window.Paths = []config.Path{{Name: "client-retry", Max: config.Duration(time.Minute)}}
	e.cfg.Window.Margin = 0
	r := e.start()
	first := clock.Now()
	step := func(advance time.Duration) {
		t.Helper()
		clock.Advance(advance)
		e.publish([]event{{key: "k1", payload: []byte("a")}})
		e.drained(30 * time.Second)
	}
	step(0)
	step(30 * time.Second) // inside W: a repeat
	if n := len(e.outputByKey()); n != 1 {
		t.Fatalf("inside the window: %d outputs, want 1", n)
	}
	step(31 * time.Second) // 61s after the first copy: past W
	step(time.Second)      // a copy of the second window
	out := e.outputByKey()
	again := fmt.Sprintf("k1.after.%d", first.UnixNano())
	if len(out) != 2 || len(out["k1"]) != 1 || len(out[again]) != 1 {
		t.Fatalf("past the window: outputs %v, want k1 and %s once each", idsOf(out), again)
	}
	if got := counter(t, r.reg, "dedupe_forwards_after_window_total", nil); got != 1 {
		t.Errorf("dedupe_forwards_after_window_total = %v, want 1", got)
	}
}

// idsOf returns the ids of out, sorted.
func idsOf(out map[string][]natstest.Message) []string {
	ids := make([]string, 0, len(out))
	for id := range out {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func TestRefusesShortDuplicateWindow(t *testing.T) {
	e := newEnv(t)
	if _, err := e.js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: e.cfg.Output.Stream, Subjects: []string{"deduped.>", "_dedupe.deduped.>"}, Duplicates: time.Second,
	}); err != nil {
		t.Fatal(err)
	}
	_, err := stage.New(context.Background(), stage.Options{Config: e.cfg, Conn: e.nc})
	if err == nil || !strings.Contains(err.Error(), "duplicate window") {
		t.Fatalf("New with a 1s output duplicate window: %v, want a duplicate window error", err)
	}
}

func TestLastAllowedDeliveryIsDeadLettered(t *testing.T) {
	e := newEnv(t)
	e.cfg.Input.AckWait = config.Duration(time.Second)
	e.cfg.Output.RestartMargin = config.Duration(10 * time.Second)
	// An operator's consumer that gives up after two deliveries.
	st, err := e.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: e.cfg.Input.Stream, Subjects: e.cfg.Input.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateConsumer(context.Background(), jetstream.ConsumerConfig{
		Durable: e.cfg.Input.Consumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxDeliver: 2,
	}); err != nil {
		t.Fatal(err)
	}
	r := e.start()
	var once sync.Once
	r.st.SetBeforePublishHook(func(int, int) {
		// Hold the first delivery past AckWait, until the server makes the
		// second, the last one it will make.
		once.Do(e.holdUntilRedelivered)
	})
	e.publish([]event{{key: "md-1", payload: []byte("p")}})
	e.drained(30 * time.Second)
	dl := natstest.ReadAll(t, e.js, e.cfg.DeadLetter.Stream)
	if len(dl) != 1 || dl[0].Header.Get(deadletter.HeaderReason) != "max_deliver" || string(dl[0].Data) != "p" {
		t.Fatalf("dead letters %+v, want the message once with reason max_deliver", dl)
	}
	if n := len(e.outputByKey()["md-1"]); n > 1 {
		t.Fatalf("output holds md-1 %d times", n)
	}
}

// TestConsumerBacklogMetric: a single instance reports its input
// consumer's backlog in dedupe_consumer_pending_messages, nothing pending
// and nothing unacked once the input is drained.
func TestConsumerBacklogMetric(t *testing.T) {
	e := newEnv(t)
	r := e.start()
	evs, _ := workload(7, 300, 0.2)
	e.publish(evs)
	e.drained(30 * time.Second)
	for _, kind := range []string{"pending", "ack_pending"} {
		natstest.Poll(t, 30*time.Second, 200*time.Millisecond, "dedupe_consumer_pending_messages{kind="+kind+"} at 0", func() (bool, error) {
			v, ok := metrictest.Lookup(t, r.reg, "dedupe_consumer_pending_messages", map[string]string{"kind": kind})
			return ok && v == 0, fmt.Errorf("gauge %v (reported: %v)", v, ok)
		})
	}
}
