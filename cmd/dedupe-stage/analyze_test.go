package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/history"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// analyzeConfig keys on the JSON id under the Tenant header's scope, with
// windows short enough for a history published in a second or two to
// hold repeats older than some of them: W 160ms (slow 150ms + 10ms).
const analyzeConfig = `input: {stream: EVENTS}
key:
  source: json
  json_path: id
  scope: {source: header, header: Tenant}
window:
  paths:
    - {name: fast, max: 50ms}
    - {name: slow, max: 150ms}
  margin: 10ms
pipeline: {max_message_bytes: 2KiB}
`

// seeded is one message of the seeded history: what it is, as the test
// published it.
type seeded struct {
	msg    *nats.Msg
	key    string // tenant:id, "" for a dead letter
	reason string // the dead-letter reason it must make, "" for none
}

// seedHistory returns a history of new keys, repeats at spread ages,
// and messages of each dead-letter reason analyze judges, from a fixed
// seed.
func seedHistory() []seeded {
	r := rand.New(rand.NewPCG(51, 1))
	var out []seeded
	var keys []string
	payload := func(id string, extra int) []byte { return fmt.Appendf(nil, `{"id":%q,"n":%d}`, id, extra) }
	msg := func(tenant string, data []byte) *nats.Msg {
		m := &nats.Msg{Subject: "events.orders", Header: nats.Header{}, Data: data}
		if tenant != "" {
			m.Header.Set("Tenant", tenant)
		}
		return m
	}
	for i := range 600 {
		switch x := r.IntN(100); {
		case x < 40 || len(keys) == 0:
			tenant, id := fmt.Sprintf("t%d", r.IntN(3)), fmt.Sprintf("order-%d", i)
			out = append(out, seeded{msg: msg(tenant, payload(id, 0)), key: tenant + ":" + id})
			keys = append(keys, tenant+":"+id)
		case x < 88:
			k := keys[r.IntN(len(keys))]
			tenant, id, _ := strings.Cut(k, ":")
			out = append(out, seeded{msg: msg(tenant, payload(id, 0)), key: k})
		case x < 91:
			out = append(out, seeded{msg: msg("t1", []byte(`{"n":1}`)), reason: "no_key"})
		case x < 93:
			out = append(out, seeded{msg: msg("t1", []byte(`not json`)), reason: "bad_payload"})
		case x < 95:
			out = append(out, seeded{msg: msg("", payload(fmt.Sprintf("noscope-%d", i), 0)), reason: "no_scope"})
		case x < 97:
			out = append(out, seeded{msg: msg("t2", append(payload("big", 0), make([]byte, 3000)...)), reason: "oversized"})
		default:
			k := keys[r.IntN(len(keys))]
			tenant, id, _ := strings.Cut(k, ":")
			out = append(out, seeded{msg: msg(tenant, payload(id, 1)), key: k, reason: "fingerprint_mismatch"})
		}
	}
	return out
}

// TestAnalyzeReportsTheHistory publishes a seeded history into a real
// JetStream, runs `dedupe-stage analyze --json` on it and checks every
// number of the report against the truth computed from what was published
// and the times the stream stored: counts, dead letters by reason with
// their first example, the repeat ages' percentiles within the stated
// error and their maximum, the slowest repeats, how many repeats each
// candidate W forwards again, its sizing and the recommendation. It also
// checks that analyze writes nothing: the stream and its consumers are as
// before, and the data dir is not made.
func TestAnalyzeReportsTheHistory(t *testing.T) {
	srv := natstest.RunServer(t, "")
	url := srv.ClientURL()
	_, js := natstest.Connect(t, url)
	ctx := context.Background()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "dedupe-stage", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	hist := seedHistory()
	r := rand.New(rand.NewPCG(7, 7))
	for i, s := range hist {
		if _, err := js.PublishMsg(ctx, s.msg); err != nil {
			t.Fatal(err)
		}
		// Pauses spread the stored times, so that the repeats' ages spread
		// around the windows; their lengths do not matter to the test,
		// which reads the times the stream stored.
		switch {
		case i%150 == 149:
			time.Sleep(120 * time.Millisecond)
		case r.IntN(10) == 0:
			time.Sleep(time.Duration(r.IntN(8)) * time.Millisecond)
		}
	}
	stored := natstest.ReadAll(t, js, "EVENTS")
	if len(stored) != len(hist) {
		t.Fatalf("stream holds %d messages, published %d", len(stored), len(hist))
	}

	// The truth, from what was published and the times the stream stored.
	type first struct {
		at  time.Time
		seq uint64
	}
	firsts := map[string]first{}
	var ages []time.Duration
	type repeat struct {
		age time.Duration
		seq uint64
		key string
	}
	var repeats []repeat
	dead := map[string]uint64{}
	example := map[string]uint64{}
	for i, s := range hist {
		m := stored[i]
		if s.reason != "" {
			dead[s.reason]++
			if example[s.reason] == 0 {
				example[s.reason] = m.Seq
			}
			continue
		}
		f, ok := firsts[s.key]
		if !ok {
			firsts[s.key] = first{m.Time, m.Seq}
			continue
		}
		age := m.Time.Sub(f.at)
		ages = append(ages, age)
		repeats = append(repeats, repeat{age, m.Seq, s.key})
	}
	slices.Sort(ages)

	dataDir := filepath.Join(t.TempDir(), "data")
	cfgPath := filepath.Join(t.TempDir(), "stage.yaml")
	if err := os.WriteFile(cfgPath, []byte(analyzeConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	before := streamState(t, st)
	code, out := output(t, nil, "analyze", "--json", "-s", url, "--config", cfgPath, "--data-dir", dataDir)
	if code != 0 {
		t.Fatalf("analyze exited %d:\n%s", code, out)
	}
	var rep history.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("analyze --json printed no report: %v\n%s", err, out)
	}

	// Nothing written.
	if after := streamState(t, st); after != before {
		t.Errorf("the stream and its consumers changed: before %s, after %s", before, after)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("analyze made the data dir %s (%v)", dataDir, err)
	}

	// Counts.
	if rep.Messages != uint64(len(hist)) || rep.Keys != uint64(len(firsts)) || rep.Repeats != uint64(len(ages)) {
		t.Errorf("messages %d, keys %d, repeats %d; want %d, %d, %d", rep.Messages, rep.Keys, rep.Repeats, len(hist), len(firsts), len(ages))
	}
	if rep.FirstSeq != stored[0].Seq || rep.LastSeq != stored[len(stored)-1].Seq {
		t.Errorf("sequences %d to %d, want %d to %d", rep.FirstSeq, rep.LastSeq, stored[0].Seq, stored[len(stored)-1].Seq)
	}
	gotDead := map[string]uint64{}
	for _, d := range rep.DeadLetters {
		gotDead[d.Reason] = d.Count
		if d.Example.Seq != example[d.Reason] || d.Example.Detail == "" {
			t.Errorf("dead letters %s: example seq %d (%q), want seq %d with a detail", d.Reason, d.Example.Seq, d.Example.Detail, example[d.Reason])
		}
	}
	if fmt.Sprint(gotDead) != fmt.Sprint(dead) {
		t.Errorf("dead letters %v, want %v", gotDead, dead)
	}
	for _, reason := range []string{"no_key", "bad_payload", "no_scope", "oversized", "fingerprint_mismatch"} {
		if dead[reason] == 0 {
			t.Errorf("the seeded history has no %s: the seed no longer covers every reason", reason)
		}
	}

	// Ages: percentiles within the stated error (0 below 1 ms), the max exact.
	quantile := func(q float64) time.Duration { return ages[max(int(math.Ceil(q*float64(len(ages))))-1, 0)] }
	a := rep.Ages
	for _, c := range []struct {
		name string
		q    float64
		got  time.Duration
	}{{"p50", 0.5, a.P50}, {"p90", 0.9, a.P90}, {"p99", 0.99, a.P99}, {"p99.9", 0.999, a.P999}} {
		want := quantile(c.q)
		tolerance := time.Duration(float64(want) * a.RelativeError)
		if want < time.Millisecond {
			tolerance = time.Millisecond
		}
		if d := c.got - want; d > tolerance || -d > tolerance {
			t.Errorf("%s %v, want %v within %v", c.name, c.got, want, tolerance)
		}
	}
	if a.RelativeError <= 0 || a.RelativeError > 0.01 {
		t.Errorf("relative error %v, want in (0, 1 %%]", a.RelativeError)
	}
	if a.Max != ages[len(ages)-1] {
		t.Errorf("max age %v, want %v", a.Max, ages[len(ages)-1])
	}
	var inBars uint64
	for _, b := range a.Histogram {
		var want uint64
		for _, age := range ages {
			if age >= b.From && age < b.To {
				want++
			}
		}
		if b.Count != want {
			t.Errorf("histogram %v-%v: %d, want %d", b.From, b.To, b.Count, want)
		}
		inBars += b.Count
	}
	if inBars != uint64(len(ages)) {
		t.Errorf("the histogram holds %d repeats, want %d", inBars, len(ages))
	}
	slices.SortStableFunc(repeats, func(x, y repeat) int {
		if x.age != y.age {
			return int(y.age - x.age)
		}
		return int(x.seq) - int(y.seq)
	})
	if len(rep.Slowest) != 10 {
		t.Fatalf("%d slowest repeats, want 10", len(rep.Slowest))
	}
	for i, s := range rep.Slowest {
		if w := repeats[i]; s.Age != w.age || s.Key != w.key || s.Seq != w.seq || s.FirstSeq != firsts[w.key].seq {
			t.Errorf("slowest %d: %v key %s seq %d first %d, want %v key %s seq %d first %d", i, s.Age, s.Key, s.Seq, s.FirstSeq,
				w.age, w.key, w.seq, firsts[w.key].seq)
		}
	}

	// Windows: the repeats each forwards again, and its sizing.
	older := func(w time.Duration) uint64 {
		var n uint64
		for _, age := range ages {
			if age >= w {
				n++
			}
		}
		return n
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	span := stored[len(stored)-1].Time.Sub(stored[0].Time)
	rate := float64(len(firsts)) / span.Seconds()
	wantW := map[string]time.Duration{"configured": 160 * time.Millisecond, "path fast": 60 * time.Millisecond,
		"path slow": 160 * time.Millisecond, "half W": 80 * time.Millisecond, "twice W": 320 * time.Millisecond}
	var all, most history.Window
	for i, w := range rep.Windows {
		if want, ok := wantW[w.Name]; ok && w.W != want {
			t.Errorf("window %s: W %v, want %v", w.Name, w.W, want)
		}
		switch w.Name {
		case "catches 100 %":
			all = w
		case "catches 99.9 %":
			most = w
		}
		if w.ForwardedAgain != older(w.W) || w.Share != float64(older(w.W))/float64(len(ages)) {
			t.Errorf("window %s %v: forwards %d again (%v), want %d", w.Name, w.W, w.ForwardedAgain, w.Share, older(w.W))
		}
		want, _ := cfg.SizeWindow(w.W, rate, rep.KeyBytes)
		if w.Sizing.ExpectedKeys != want.ExpectedKeys || w.Sizing.FilterBytes != want.FilterBytes ||
			w.Sizing.MemoryBytes != want.MemoryBytes || w.Sizing.DiskBytes != want.DiskBytes {
			t.Errorf("window %s: sizing %+v, want %+v", w.Name, w.Sizing, want)
		}
		if i == 0 && w.Name != "configured" {
			t.Errorf("first window %s, want the configured one", w.Name)
		}
	}
	if all.W <= ages[len(ages)-1] || all.ForwardedAgain != 0 {
		t.Errorf("the W catching every repeat is %v (forwards %d again); the slowest came after %v", all.W, all.ForwardedAgain, ages[len(ages)-1])
	}
	if most.W == 0 || float64(most.ForwardedAgain) > 0.001*float64(len(ages)) {
		t.Errorf("the W catching 99.9 %% is %v and forwards %d of %d again", most.W, most.ForwardedAgain, len(ages))
	}
	if n := older(160 * time.Millisecond); n == 0 {
		t.Errorf("no repeat is older than the configured W: the seeded history no longer tests it")
	} else if want := fmt.Sprintf("W %s catches every repeat seen; your W 160ms forwards %s again (%s)",
		history.FormatDuration(all.W), history.Count(n), history.Percent(float64(n)/float64(len(ages)))); rep.Recommendation != want {
		t.Errorf("recommendation %q, want %q", rep.Recommendation, want)
	}

	// The text report says the same.
	code, text := output(t, nil, "analyze", "-s", url, "--config", cfgPath)
	if code != 0 || !strings.Contains(text, rep.Recommendation) || !strings.Contains(text, "fingerprint_mismatch") {
		t.Errorf("analyze exited %d; its text lacks the recommendation or a dead-letter reason:\n%s", code, text)
	}
	t.Logf("analyze:\n%s", text)
	// --from-seq reads from there on only.
	code, out = output(t, nil, "analyze", "--json", "-s", url, "--config", cfgPath, "--from-seq", fmt.Sprint(stored[100].Seq))
	var part history.Report
	if err := json.Unmarshal([]byte(out), &part); code != 0 || err != nil || part.Messages != uint64(len(hist)-100) || part.FirstSeq != stored[100].Seq {
		t.Errorf("--from-seq %d: exit %d, %d messages from seq %d, want %d from %d (%v)", stored[100].Seq, code, part.Messages, part.FirstSeq,
			len(hist)-100, stored[100].Seq, err)
	}
	if after := streamState(t, st); after != before {
		t.Errorf("the stream and its consumers changed: before %s, after %s", before, after)
	}
}

// streamState describes the stream's messages and consumers, to tell
// whether anything changed them.
func streamState(t *testing.T, st jetstream.Stream) string {
	t.Helper()
	ctx := context.Background()
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range st.ConsumerNames(ctx).Name() {
		names = append(names, n)
	}
	slices.Sort(names)
	s := info.State
	return fmt.Sprintf("msgs %d bytes %d seqs %d-%d consumers %v", s.Msgs, s.Bytes, s.FirstSeq, s.LastSeq, names)
}
