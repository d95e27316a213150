package stage_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/sink"
	"github.com/dedupe-stage/dedupe-stage/stage"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

const (
	totalsKV     = "TOTALS_KV"
	totalsStream = "TOTALS"
)

// withTotals turns totals on in e's config: group from the JSON field
// "campaign", 1m buckets, a 100ms flush and the KV and stream sinks.
func (e *env) withTotals() {
	e.cfg.Totals.Enabled = true
	e.cfg.Totals.Group = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "campaign"}
	e.cfg.Totals.Bucket = config.Duration(time.Minute)
	e.cfg.Totals.FlushInterval = config.Duration(100 * time.Millisecond)
	e.cfg.Totals.Sinks.KV.Bucket = totalsKV
	e.cfg.Totals.Sinks.Stream.Stream = totalsStream
}

// click is one input event of the totals tests.
type click struct {
	key      string
	campaign string
	ts       int64 // Unix seconds
	amount   int64
}

func (c click) event() event {
	return event{key: c.key, payload: fmt.Appendf(nil, `{"id":%q,"campaign":%q,"ts":%d,"amount":%d}`, c.key, c.campaign, c.ts, c.amount)}
}

// clickWorkload makes n events over unique keys with repeatRatio copies
// (adjacent or anywhere earlier), spread over 10 campaigns and the 5
// minutes before now. It returns the events in publish order and the
// ground truth per sink ID: the count and the sum of amounts of each
// (campaign, minute), counting each key once.
func clickWorkload(seed uint64, n int, repeatRatio float64, now time.Time) (evs []click, count, sum map[string]int64) {
	rng := rand.New(rand.NewPCG(seed, seed^0xdeadbeef))
	count, sum = map[string]int64{}, map[string]int64{}
	var uniq []click
	for len(evs) < n {
		if len(uniq) > 0 && rng.Float64() < repeatRatio {
			if rng.IntN(2) == 0 {
				evs = append(evs, uniq[len(uniq)-1])
			} else {
				evs = append(evs, uniq[rng.IntN(len(uniq))])
			}
			continue
		}
		c := click{
			key:      fmt.Sprintf("click-%d-%d", seed, len(uniq)),
			campaign: fmt.Sprintf("camp-%d", rng.IntN(10)),
			ts:       now.Add(-time.Duration(rng.IntN(300)) * time.Second).Unix(),
			amount:   int64(rng.IntN(1000)),
		}
		uniq = append(uniq, c)
		evs = append(evs, c)
		id := sink.Total{Group: c.campaign, Bucket: state.BucketOf(time.Unix(c.ts, 0), time.Minute)}.ID()
		count[id]++
		sum[id] += c.amount
	}
	return evs, count, sum
}

func (e *env) publishClicks(cs []click) {
	e.t.Helper()
	evs := make([]event, len(cs))
	for i, c := range cs {
		evs[i] = c.event()
	}
	e.publish(evs)
}

// kvTotals reads every total in the KV bucket, by sink ID.
func (e *env) kvTotals() map[string]int64 {
	e.t.Helper()
	ctx := context.Background()
	kv, err := e.js.KeyValue(ctx, totalsKV)
	if err != nil {
		e.t.Fatalf("KV %s: %v", totalsKV, err)
	}
	out := map[string]int64{}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		e.t.Fatalf("list keys: %v", err)
	}
	for k := range lister.Keys() {
		entry, err := kv.Get(ctx, k)
		if err != nil {
			e.t.Fatalf("get %s: %v", k, err)
		}
		v, err := strconv.ParseInt(string(entry.Value()), 10, 64)
		if err != nil {
			e.t.Fatalf("KV %s = %q: %v", k, entry.Value(), err)
		}
		out[k] = v
	}
	return out
}

// streamTotals reads the totals stream and keeps the largest value per
// (group, bucket), as a reader of the stream sink does.
func (e *env) streamTotals() map[string]int64 {
	e.t.Helper()
	var all []sink.Total
	for _, m := range natstest.ReadAll(e.t, e.js, totalsStream) {
		var tot sink.Total
		if err := json.Unmarshal(m.Data, &tot); err != nil {
			e.t.Fatalf("totals message %d %q: %v", m.Seq, m.Data, err)
		}
		all = append(all, tot)
	}
	out := map[string]int64{}
	for id, tot := range sink.Latest(all) {
		out[id] = tot.Value
	}
	return out
}

// assertTotals fails unless got equals want exactly.
func assertTotals(t *testing.T, what string, got, want map[string]int64) {
	t.Helper()
	bad := 0
	for id, w := range want {
		if g, ok := got[id]; !ok || g != w {
			if bad < 5 {
				t.Errorf("%s: %s = %d (present %v), want %d", what, id, g, ok, w)
			}
			bad++
		}
	}
	for id, g := range got {
		if _, ok := want[id]; !ok {
			if bad < 5 {
				t.Errorf("%s: %s = %d, not in the ground truth", what, id, g)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d totals differ from the ground truth", what, bad, len(want))
	}
}

// postgresSink adds the PostgreSQL sink on a fresh table when
// DEDUPE_TEST_POSTGRES_DSN is set, and returns a reader of its totals; it
// returns nil (and logs why) otherwise.
func (e *env) postgresSink() func() map[string]int64 {
	e.t.Helper()
	dsn := os.Getenv("DEDUPE_TEST_POSTGRES_DSN")
	if dsn == "" {
		e.t.Log("DEDUPE_TEST_POSTGRES_DSN is not set: the PostgreSQL sink is not tested here")
		return nil
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		e.t.Fatalf("postgres: %v", err)
	}
	e.t.Cleanup(pool.Close)
	table := fmt.Sprintf("stage_totals_%d", time.Now().UnixNano())
	e.t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	e.cfg.Totals.Sinks.Postgres = config.PostgresSink{DSN: dsn, Table: table, CreateSchema: true}
	return func() map[string]int64 {
		rows, err := pool.Query(ctx, "SELECT group_key, bucket, total FROM "+table)
		if err != nil {
			e.t.Fatalf("read %s: %v", table, err)
		}
		defer rows.Close()
		out := map[string]int64{}
		for rows.Next() {
			var tot sink.Total
			if err := rows.Scan(&tot.Group, &tot.Bucket, &tot.Value); err != nil {
				e.t.Fatal(err)
			}
			out[tot.ID()] = tot.Value
		}
		if err := rows.Err(); err != nil {
			e.t.Fatal(err)
		}
		return out
	}
}

// TestTotalsGroundTruth runs clicks with repeats (adjacent and late
// copies) through a stage that is restarted in the middle, and checks that
// every sink ends with exactly the ground truth: each key counted once.
func TestTotalsGroundTruth(t *testing.T) {
	// With output.publish atomic the totals stream sink publishes atomic
	// batches too, and the re-flush at the restart, whose totals the stream
	// already holds, takes the one-by-one fallback.
	for _, publish := range []string{config.PublishAuto, config.PublishAtomic} {
		t.Run(publish, func(t *testing.T) { totalsGroundTruth(t, publish) })
	}
}

func totalsGroundTruth(t *testing.T, publish string) {
	e := newEnv(t)
	e.withTotals()
	e.cfg.Output.Publish = publish
	e.cfg.Totals.Time = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "ts"}
	e.cfg.Totals.Value = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "amount"}
	pg := e.postgresSink()
	evs, _, truth := clickWorkload(7, 6000, 0.3, time.Now())

	r := e.start()
	e.publishClicks(evs[:len(evs)/2])
	e.drained(60 * time.Second)
	r.stop(t)

	r2 := e.start()
	// The second half holds late copies of first-half keys: recognised
	// after the restart from the store, never counted again.
	e.publishClicks(evs[len(evs)/2:])
	e.drained(60 * time.Second)
	r2.stop(t) // flushes once more after the last batch

	assertTotals(t, "KV sink", e.kvTotals(), truth)
	assertTotals(t, "stream sink", e.streamTotals(), truth)
	batched := 0
	for _, m := range natstest.ReadAll(t, e.js, totalsStream) {
		if m.Header.Get("Nats-Batch-Id") != "" {
			batched++
		}
	}
	if wantBatched := publish == config.PublishAtomic; (batched > 0) != wantBatched {
		t.Errorf("output.publish %s: %d totals stream messages came in atomic batches; want atomic batches: %v", publish, batched, wantBatched)
	}
	if pg != nil {
		assertTotals(t, "PostgreSQL sink", pg(), truth)
	}
	// At start the stage re-flushes every total it keeps; the sinks already
	// hold them, so each counts as stale and nothing moves.
	r3 := e.start()
	for _, s := range []string{"kv", "stream"} {
		natstest.WaitFor(t, 10*time.Second, "the re-flush to "+s, func() bool {
			return counter(t, r3.reg, "dedupe_sink_writes_total", map[string]string{"sink": s, "result": "stale"}) >= float64(len(truth))
		})
	}
	r3.stop(t)
	for _, s := range []string{"kv", "stream"} {
		stale := counter(t, r3.reg, "dedupe_sink_writes_total", map[string]string{"sink": s, "result": "stale"})
		applied := counter(t, r3.reg, "dedupe_sink_writes_total", map[string]string{"sink": s, "result": "applied"})
		if stale != float64(len(truth)) || applied != 0 {
			t.Errorf("sink %s, restart without input: %v stale and %v applied writes, want %d and 0", s, stale, applied, len(truth))
		}
	}
	assertTotals(t, "KV sink after the re-flush", e.kvTotals(), truth)
	if n := counter(t, r2.reg, "dedupe_totals_late_events_total", nil); n != 0 {
		t.Errorf("%v late events, want 0", n)
	}
	if got := gauge(t, r2.reg, "dedupe_totals_pending_pairs"); got != 0 {
		t.Errorf("dedupe_totals_pending_pairs = %v after the final flush, want 0", got)
	}
}

// TestTotalsWipeAndReplay loses the stage's state after a full run and
// replays the whole input from the start: while the totals are rebuilt
// from zero, no value in the KV bucket ever goes down, and every total ends
// equal to the ground truth.
func TestTotalsWipeAndReplay(t *testing.T) {
	e := newEnv(t)
	e.withTotals() // time: the stream timestamp; value: a count
	e.cfg.Totals.Sinks.Stream.Stream = ""
	now := time.Now()
	evs, _, _ := clickWorkload(11, 4000, 0.3, now)

	r := e.start()
	hist := e.watchKV()
	// In two halves, the first flushed before the second arrives, so that
	// the watcher sees totals grow however fast the machine is.
	e.publishClicks(evs[:len(evs)/2])
	e.drained(60 * time.Second)
	natstest.WaitFor(t, 10*time.Second, "the first half's totals flushed", func() bool {
		return gauge(t, r.reg, "dedupe_totals_pending_pairs") == 0 &&
			counter(t, r.reg, "dedupe_sink_writes_total", map[string]string{"sink": "kv", "result": "applied"}) > 0
	})
	e.publishClicks(evs[len(evs)/2:])
	// Ground truth by stream time: read the stored timestamps back.
	truth := map[string]int64{}
	seen := map[string]bool{}
	for _, m := range readWithTimes(t, e.js, e.cfg.Input.Stream, len(evs)) {
		var c struct {
			ID       string `json:"id"`
			Campaign string `json:"campaign"`
		}
		if err := json.Unmarshal(m.data, &c); err != nil {
			t.Fatal(err)
		}
		if seen[c.ID] {
			continue
		}
		seen[c.ID] = true
		truth[sink.Total{Group: c.Campaign, Bucket: state.BucketOf(m.at, time.Minute)}.ID()]++
	}

	e.drained(60 * time.Second)
	r.stop(t)
	assertTotals(t, "KV after the first run", e.kvTotals(), truth)

	// Wipe the state and rewind the consumer.
	if err := os.RemoveAll(filepath.Join(e.dataDir, "state")); err != nil {
		t.Fatal(err)
	}
	if err := e.js.DeleteConsumer(context.Background(), e.cfg.Input.Stream, e.cfg.Input.Consumer); err != nil {
		t.Fatal(err)
	}
	r2 := e.start()
	e.drained(60 * time.Second)
	r2.stop(t)

	assertTotals(t, "KV after the replay", e.kvTotals(), truth)
	if applied := counter(t, r2.reg, "dedupe_sink_writes_total", map[string]string{"sink": "kv", "result": "applied"}); applied != 0 {
		t.Errorf("the replay applied %v KV writes, want 0 (it only caught up)", applied)
	}
	if stale := counter(t, r2.reg, "dedupe_sink_writes_total", map[string]string{"sink": "kv", "result": "stale"}); stale < float64(len(truth)) {
		t.Errorf("the replay wrote %v stale totals, want >= %d", stale, len(truth))
	}
	hist.assertNeverDown(t, truth)
}

// stored is a stream message's payload and the time the stream stored it.
type stored struct {
	data []byte
	at   time.Time
}

// readWithTimes reads the first n messages of stream with their stored
// times.
func readWithTimes(t *testing.T, js jetstream.JetStream, stream string, n int) []stored {
	t.Helper()
	ctx := context.Background()
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []stored
	for len(out) < n {
		batch, err := c.Fetch(n-len(out), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, stored{data: m.Data(), at: md.Timestamp})
			got++
		}
		if got == 0 {
			t.Fatalf("read %d of %d messages of %s, then nothing", len(out), n, stream)
		}
	}
	return out
}

// kvHistory records every value the KV bucket held, per key.
type kvHistory struct {
	mu     sync.Mutex
	values map[string][]int64
	stop   func()
	done   chan struct{}
}

// watchKV starts recording every update of the totals KV bucket until the
// test ends.
func (e *env) watchKV() *kvHistory {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	kv, err := e.js.KeyValue(ctx, totalsKV)
	if err != nil {
		e.t.Fatal(err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	h := &kvHistory{values: map[string][]int64{}, done: make(chan struct{})}
	h.stop = func() { cancel(); _ = w.Stop(); <-h.done }
	e.t.Cleanup(func() { h.stop() })
	go func() {
		defer close(h.done)
		for entry := range w.Updates() {
			if entry == nil {
				continue // initial values delivered
			}
			v, err := strconv.ParseInt(string(entry.Value()), 10, 64)
			if err != nil {
				v = -1
			}
			h.mu.Lock()
			h.values[entry.Key()] = append(h.values[entry.Key()], v)
			h.mu.Unlock()
		}
	}()
	return h
}

// assertNeverDown fails if a key's value ever decreased, or its last value
// is not the ground truth.
func (h *kvHistory) assertNeverDown(t *testing.T, truth map[string]int64) {
	t.Helper()
	natstest.WaitFor(t, 10*time.Second, "the KV watcher to see every final value", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for id, want := range truth {
			vs := h.values[id]
			if len(vs) == 0 || vs[len(vs)-1] != want {
				return false
			}
		}
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	updates := 0
	for id, vs := range h.values {
		updates += len(vs)
		for i := 1; i < len(vs); i++ {
			if vs[i] < vs[i-1] {
				t.Errorf("KV %s went down: %v", id, vs)
				break
			}
		}
	}
	if updates <= len(truth) {
		t.Errorf("the watcher saw %d updates of %d keys: the run was too short to show totals growing", updates, len(truth))
	}
}

// gauge sums the series of metric name in reg, and fails the test when it
// has none (metrictest.Value).
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return metrictest.Value(t, reg, name, nil)
}

// TestTotalsLateEvents checks that a new event for a closed bucket never
// changes a total: it is dead-lettered (or dropped) and counted, while a
// repeat of a key counted earlier stays an ordinary repeat.
func TestTotalsLateEvents(t *testing.T) {
	for _, mode := range []string{config.LateDeadLetter, config.LateDrop} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			e.withTotals()
			e.cfg.Totals.LateEvents = mode
			e.cfg.Totals.Time = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "ts"}
			e.cfg.Window.Paths = []config.Path{{Name: "client-retry", Max: config.Duration(5 * time.Minute)}}
			e.cfg.Window.Margin = 0
			t0 := time.Now()
			clock := window.NewManualClock(t0)
			e.inputClock = clock
			r := e.start()

			open := click{key: "a", campaign: "c1", ts: t0.Add(-3 * time.Minute).Unix(), amount: 1}    // closes about t0+3m
			closed := click{key: "b", campaign: "c1", ts: t0.Add(-10 * time.Minute).Unix(), amount: 1} // closed since t0-4m
			e.publishClicks([]click{open, closed})
			e.drained(30 * time.Second)

			clock.Advance(4 * time.Minute) // the input's clock: a's bucket is closed now, a's key is still in the window
			lateNew := click{key: "c", campaign: "c1", ts: open.ts, amount: 1}
			e.publishClicks([]click{open, lateNew})
			e.drained(30 * time.Second)
			r.stop(t)

			if out := e.outputByKey(); len(out) != 1 || len(out["a"]) != 1 {
				t.Errorf("output %v, want only a, once", out)
			}
			want := map[string]int64{sink.Total{Group: "c1", Bucket: state.BucketOf(time.Unix(open.ts, 0), time.Minute)}.ID(): 1}
			assertTotals(t, "KV", e.kvTotals(), want)
			if rep := counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "repeat"}); rep != 1 {
				t.Errorf("%v repeats, want 1 (the copy of a, though its bucket closed)", rep)
			}
			dl := natstest.ReadAll(t, e.js, e.cfg.DeadLetter.Stream)
			if mode == config.LateDrop {
				if len(dl) != 0 {
					t.Errorf("%d dead letters with late_events drop, want 0", len(dl))
				}
				if n := counter(t, r.reg, "dedupe_totals_late_events_total", map[string]string{"action": "dropped"}); n != 2 {
					t.Errorf("late events dropped: %v, want 2", n)
				}
				if n := counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "dropped"}); n != 2 {
					t.Errorf("messages dropped: %v, want 2", n)
				}
				return
			}
			if len(dl) != 2 {
				t.Fatalf("%d dead letters, want b and c", len(dl))
			}
			for _, m := range dl {
				if m.Header.Get(deadletter.HeaderReason) != string(deadletter.ReasonClosedBucket) || !strings.Contains(m.Header.Get(deadletter.HeaderDetail), "closed at") {
					t.Errorf("dead letter %q: reason %q detail %q, want closed_bucket", m.Data, m.Header.Get(deadletter.HeaderReason), m.Header.Get(deadletter.HeaderDetail))
				}
			}
			if n := counter(t, r.reg, "dedupe_totals_late_events_total", map[string]string{"action": "dead_lettered"}); n != 2 {
				t.Errorf("late events dead-lettered: %v, want 2", n)
			}
		})
	}
}

// TestTotalsBadFields checks that events whose group, time or value cannot
// be used are dead-lettered with their reason and counted nowhere.
func TestTotalsBadFields(t *testing.T) {
	e := newEnv(t)
	e.withTotals()
	e.cfg.Totals.Time = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "ts"}
	e.cfg.Totals.Value = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "amount"}
	r := e.start()
	now := time.Now()
	sec, ms, rfc := now.Unix(), now.UnixMilli(), now.UTC().Format(time.RFC3339Nano)
	good := []event{
		{key: "g1", payload: fmt.Appendf(nil, `{"campaign":"c","ts":%d,"amount":5}`, sec)},
		{key: "g2", payload: fmt.Appendf(nil, `{"campaign":"c","ts":%d,"amount":"7"}`, ms)},
		{key: "g3", payload: fmt.Appendf(nil, `{"campaign":"c","ts":%q,"amount":0}`, rfc)},
	}
	bad := []struct {
		reason  string
		payload string
	}{
		{"no_group", fmt.Sprintf(`{"ts":%d,"amount":1}`, sec)},
		{"bad_group", fmt.Sprintf(`{"campaign":"a\u0001b","ts":%d,"amount":1}`, sec)},
		{"bad_group", fmt.Sprintf(`{"campaign":{"id":1},"ts":%d,"amount":1}`, sec)},
		{"bad_time", `{"campaign":"c","ts":"yesterday","amount":1}`},
		{"bad_time", `{"campaign":"c","amount":1}`},
		{"bad_time", `{"campaign":"c","ts":-5,"amount":1}`},
		{"bad_time", `{"campaign":"c","ts":9999999999999999,"amount":1}`}, // milliseconds: year 318857
		{"bad_value", fmt.Sprintf(`{"campaign":"c","ts":%d,"amount":1.5}`, sec)},
		{"bad_value", fmt.Sprintf(`{"campaign":"c","ts":%d,"amount":-3}`, sec)},
		{"bad_value", fmt.Sprintf(`{"campaign":"c","ts":%d,"amount":"many"}`, sec)},
		{"bad_value", fmt.Sprintf(`{"campaign":"c","ts":%d,"amount":1e3}`, sec)},
		{"bad_value", fmt.Sprintf(`{"campaign":"c","ts":%d}`, sec)},
	}
	evs := append([]event(nil), good...)
	for i, b := range bad {
		evs = append(evs, event{key: fmt.Sprintf("bad-%d", i), payload: []byte(b.payload)})
	}
	e.publish(evs)
	e.drained(30 * time.Second)
	r.stop(t)

	dl := natstest.ReadAll(t, e.js, e.cfg.DeadLetter.Stream)
	if len(dl) != len(bad) {
		t.Fatalf("%d dead letters, want %d", len(dl), len(bad))
	}
	for _, m := range dl {
		i, err := strconv.Atoi(strings.TrimPrefix(m.Header.Get("Trace"), "t-bad-"))
		if err != nil {
			t.Fatalf("dead letter without its Trace header: %v", m.Header)
		}
		if got := m.Header.Get(deadletter.HeaderReason); got != bad[i].reason || m.Subject != e.cfg.DeadLetter.Subject+"."+bad[i].reason {
			t.Errorf("payload %s: reason %q on %s (detail %q), want %s", bad[i].payload, got, m.Subject, m.Header.Get(deadletter.HeaderDetail), bad[i].reason)
		}
	}
	want := map[string]int64{sink.Total{Group: "c", Bucket: state.BucketOf(now, time.Minute)}.ID(): 12}
	assertTotals(t, "KV", e.kvTotals(), want)
	if out := e.outputByKey(); len(out) != len(good) {
		t.Errorf("%d keys forwarded, want %d", len(out), len(good))
	}
}

// TestTotalsRefuseRoutingChange checks that switching totals on over state
// partitioned by the key is refused: the keys recorded there would be
// looked up in other partitions.
func TestTotalsRefuseRoutingChange(t *testing.T) {
	e := newEnv(t)
	r := e.start()
	e.publish([]event{{key: "k1", payload: []byte(`{"campaign":"c"}`)}})
	e.drained(30 * time.Second)
	r.stop(t)

	e.withTotals()
	_, err := stage.New(context.Background(), stage.Options{Config: e.cfg, Conn: e.nc})
	if err == nil || !strings.Contains(err.Error(), "partitioned by key") || !strings.Contains(err.Error(), `totals.group json "campaign"`) {
		t.Fatalf("New with totals on over state partitioned by key: %v, want a refusal naming both", err)
	}
	b, err := os.ReadFile(filepath.Join(e.dataDir, "state", state.RoutingFile))
	if err != nil || strings.TrimSpace(string(b)) != "key" {
		t.Errorf("%s = %q, %v; want it to still say key", state.RoutingFile, b, err)
	}
}

// TestTotalsMissingSink checks that a sink that must exist and does not
// stops the start with an error naming it.
func TestTotalsMissingSink(t *testing.T) {
	e := newEnv(t)
	e.withTotals()
	no := false
	e.cfg.NATS.CreateStreams = &no
	for _, sc := range []jetstream.StreamConfig{
		{Name: e.cfg.Input.Stream, Subjects: e.cfg.Input.Subjects},
		{Name: e.cfg.Output.Stream, Subjects: []string{"deduped.>", "_dedupe.deduped.>"}, Duplicates: 5 * time.Minute},
		{Name: e.cfg.DeadLetter.Stream, Subjects: []string{e.cfg.DeadLetter.Subject + ".>"}},
	} {
		if _, err := e.js.CreateStream(context.Background(), sc); err != nil {
			t.Fatal(err)
		}
	}
	_, err := stage.New(context.Background(), stage.Options{Config: e.cfg, Conn: e.nc})
	if err == nil || !strings.Contains(err.Error(), "totals.sinks.kv.bucket "+totalsKV) || !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("New without the KV bucket: %v, want an error naming totals.sinks.kv.bucket", err)
	}
	e.cfg.Totals.Sinks.KV.Create = true
	e.cfg.Totals.Sinks.Stream.Create = true
	r := e.start()
	r.stop(t)
	for _, name := range []string{"KV_" + totalsKV, totalsStream} {
		if _, err := e.js.Stream(context.Background(), name); err != nil {
			t.Errorf("stream %s after a start with create: %v", name, err)
		}
	}
}

// TestTotalsFlushRetriedAfterSinkFailure deletes the KV bucket while the
// stage runs: flushes fail, the changed pairs stay pending, the stage
// reports itself unhealthy; once the bucket is back the same pairs are
// flushed with their absolute values and the stage is healthy again.
func TestTotalsFlushRetriedAfterSinkFailure(t *testing.T) {
	e := newEnv(t)
	e.withTotals()
	e.cfg.Totals.Sinks.Stream.Stream = ""
	now := time.Now()
	mk := func(from, to int) []click {
		var cs []click
		for i := from; i < to; i++ {
			cs = append(cs, click{key: fmt.Sprintf("k%d", i), campaign: fmt.Sprintf("c%d", i%3), ts: now.Unix(), amount: 1})
		}
		return cs
	}
	truth := func(n int) map[string]int64 {
		out := map[string]int64{}
		for _, c := range mk(0, n) {
			// The stream timestamp is the time source: all in the minute of
			// the publish, checked below.
			out[sink.Total{Group: c.campaign, Bucket: state.BucketOf(time.Now(), time.Minute)}.ID()]++
		}
		return out
	}
	if time.Now().Add(5*time.Second).Truncate(time.Minute) != time.Now().Truncate(time.Minute) {
		time.Sleep(6 * time.Second) // on purpose: stay inside one minute bucket
	}
	r := e.start()
	e.publishClicks(mk(0, 30))
	natstest.WaitFor(t, 10*time.Second, "the first totals in the KV bucket", func() bool {
		return fmt.Sprint(e.kvTotals()) == fmt.Sprint(truth(30))
	})

	ctx := context.Background()
	if err := e.js.DeleteKeyValue(ctx, totalsKV); err != nil {
		t.Fatal(err)
	}
	e.publishClicks(mk(30, 60))
	e.drained(30 * time.Second)
	natstest.WaitFor(t, 10*time.Second, "the stage to report failing flushes", func() bool {
		return gauge(t, r.reg, "dedupe_healthy") == 0
	})
	if p := gauge(t, r.reg, "dedupe_totals_pending_pairs"); p != 3 {
		t.Errorf("pending pairs while the sink fails = %v, want 3", p)
	}
	if n := counter(t, r.reg, "dedupe_sink_write_errors_total", map[string]string{"sink": "kv"}); n < 3 {
		t.Errorf("%v KV write errors, want >= 3", n)
	}

	if _, err := e.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: totalsKV}); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 10*time.Second, "the stage to recover", func() bool {
		return gauge(t, r.reg, "dedupe_healthy") == 1 && gauge(t, r.reg, "dedupe_totals_pending_pairs") == 0
	})
	r.stop(t)
	assertTotals(t, "KV after the sink came back", e.kvTotals(), truth(60))
}

// TestTotalsTwoInstancesOverlap runs two stages with their own state and
// consumers over the same input and the same KV bucket, as during a
// failover where the old owner has not stopped yet: both write the same
// totals, racing on the same keys, and the bucket ends at the ground truth.
func TestTotalsTwoInstancesOverlap(t *testing.T) {
	e := newEnv(t)
	e.withTotals()
	e.cfg.Totals.Sinks.Stream.Stream = ""
	e.cfg.Totals.Time = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "ts"}
	e.cfg.Totals.Value = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "amount"}
	e.cfg.Totals.FlushInterval = config.Duration(20 * time.Millisecond)
	evs, _, truth := clickWorkload(13, 3000, 0.2, time.Now())

	r1 := e.start()
	other := *e
	other.cfg.Input.Consumer = "dedupe-stage-b"
	other.cfg.State.DataDir = t.TempDir()
	r2 := other.start()
	e.publishClicks(evs)
	e.drained(60 * time.Second)
	other.drained(60 * time.Second)
	r1.stop(t)
	r2.stop(t)

	assertTotals(t, "KV written by two instances", e.kvTotals(), truth)
	stale := counter(t, r1.reg, "dedupe_sink_writes_total", map[string]string{"result": "stale"}) +
		counter(t, r2.reg, "dedupe_sink_writes_total", map[string]string{"result": "stale"})
	if stale == 0 {
		t.Errorf("no stale writes: the two instances never overlapped on a key")
	}
	t.Logf("stale writes %v, retried %v", stale,
		counter(t, r1.reg, "dedupe_sink_write_retries_total", nil)+
			counter(t, r2.reg, "dedupe_sink_write_retries_total", nil))
}
