package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/gobuild"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// binary is the dedupe-stage binary built once for the black-box tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dedupe-stage-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "dedupe-stage")
	if err := gobuild.Binary(context.Background(), binary, "."); err != nil {
		fmt.Fprintln(os.Stderr, "building dedupe-stage:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is the stage running as a subprocess.
type proc struct{ *proctest.Process }

// startStage runs the binary with a config that keys on the Event-Id header.
// Each of httpFields is one more line of its http section ("inspect: false").
func startStage(t *testing.T, natsURL, dataDir, httpAddr string, httpFields ...string) *proc {
	t.Helper()
	return startStageWith(t, stageConfig(natsURL, dataDir, httpAddr, httpFields...), httpAddr)
}

// stageConfig is startStage's config: keys from the Event-Id header, four
// partitions, a JSON log. More sections can be appended to it.
func stageConfig(natsURL, dataDir, httpAddr string, httpFields ...string) string {
	return fmt.Sprintf(`nats:
  url: %s
  create_streams: true
key:
  source: header
  header: Event-Id
input:
  ack_wait: 2s
state:
  data_dir: %s
  partitions: 4
  memory_budget: 64MiB
filter:
  expected_keys: 100000
http:
  addr: %s
%slog:
  format: json
`, natsURL, dataDir, httpAddr, indent(httpFields))
}

// startStageWith runs the binary with the config cfg, whose http.addr is
// httpAddr, and waits until it is ready.
func startStageWith(t *testing.T, cfg, httpAddr string) *proc {
	t.Helper()
	cfgPath := filepath.Join(t.TempDir(), "stage.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return startBinary(t, httpAddr, nil, "--config", cfgPath)
}

// indent returns each line indented by two spaces, ending in a newline.
func indent(lines []string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func outputCount(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	st, err := js.Stream(context.Background(), "EVENTS_DEDUPED")
	if err != nil {
		return 0
	}
	// The forwards, on deduped.>: not the changelog's control records.
	info, err := st.Info(context.Background(), jetstream.WithSubjectFilter("deduped.>"))
	if err != nil {
		return 0
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

func drained(t *testing.T, js jetstream.JetStream, timeout time.Duration) {
	t.Helper()
	natstest.WaitDrained(t, js, "EVENTS", "dedupe-stage", timeout)
}

// publishWithRepeats publishes n events over n*(1-r) keys; every fifth
// event repeats a recent or an old key.
func publishWithRepeats(t *testing.T, js jetstream.JetStream, prefix string, n int) map[string]bool {
	t.Helper()
	unique := map[string]bool{}
	var keys []string
	msgs := make([]*nats.Msg, 0, n)
	for i := 0; i < n; i++ {
		var k string
		if i%5 == 4 && len(keys) > 0 {
			k = keys[(i*7919)%len(keys)]
		} else {
			k = fmt.Sprintf("%s-%d", prefix, i)
			keys = append(keys, k)
			unique[k] = true
		}
		msgs = append(msgs, &nats.Msg{Subject: "events.kill", Header: nats.Header{"Event-Id": {k}}, Data: []byte("payload-" + k)})
	}
	natstest.PublishAll(t, js, msgs)
	return unique
}

func assertOutputOnce(t *testing.T, js jetstream.JetStream, unique map[string]bool) {
	t.Helper()
	seen := map[string]int{}
	for _, m := range natstest.ReadAll(t, js, "EVENTS_DEDUPED") {
		seen[m.Header.Get(jetstream.MsgIDHeader)]++
	}
	for k := range unique {
		if seen[k] != 1 {
			t.Errorf("key %s forwarded %d times, want 1", k, seen[k])
		}
	}
	if len(seen) != len(unique) {
		t.Errorf("output holds %d keys, want %d", len(seen), len(unique))
	}
}

// TestSIGKILLMidRunLosesNothingDoublesNothing kills the binary mid-run and
// restarts it. The output must hold every key once; and because the output's
// duplicate window would hide a key published twice, the stage's own
// decisions are checked too, from /metrics: the restarted run judges every
// delivery it gets exactly once, decides "new" exactly for the keys the
// output lacked plus the re-publishes the output reported as duplicates
// (which only the batches in flight at the kill can cause), and a full
// replay afterwards is judged all repeats.
func TestSIGKILLMidRunLosesNothingDoublesNothing(t *testing.T) {
	const (
		events     = 10_000 // the kill comes at 2000 forwarded, with most still to judge
		partitions = 4      // startStage's state.partitions
		batchSize  = 256    // the default pipeline.batch_size
	)
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	dataDir := t.TempDir()
	addr := proctest.Addr(t)

	p := startStage(t, srv.ClientURL(), dataDir, addr)
	done := make(chan map[string]bool, 1)
	go func() {
		var unique map[string]bool
		defer func() { done <- unique }() // also when a failed publish ends this goroutine
		unique = publishWithRepeats(t, js, "k", events)
	}()
	natstest.WaitFor(t, 60*time.Second, "some events forwarded", func() bool { return outputCount(t, js) > 2000 })
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Exited()
	unique := <-done
	if unique == nil {
		t.FailNow() // publishing failed and said why
	}
	// What the killed process had sent before it died may still be on its
	// way into the stream (its connection's buffers): the count at the
	// kill is the one that holds still for a second.
	atKill, still := outputCount(t, js), time.Now()
	for end := time.Now().Add(10 * time.Second); time.Since(still) < time.Second && time.Now().Before(end); {
		time.Sleep(100 * time.Millisecond)
		if n := outputCount(t, js); n != atKill {
			atKill, still = n, time.Now()
		}
	}
	if atKill >= uint64(len(unique)) {
		t.Logf("the stage had forwarded everything (%d) before the kill; the restart still has to recognise every repeat", atKill)
	}
	ci := consumerInfo(t, js)
	unjudged := ci.NumAckPending + int(ci.NumPending)

	p2 := startStage(t, srv.ClientURL(), dataDir, addr)
	drained(t, js, 90*time.Second)
	assertOutputOnce(t, js, unique)

	// The restarted run's own decisions.
	deliveries := consumerInfo(t, js).Delivered.Consumer - ci.Delivered.Consumer
	newCount := scrape(t, addr, "dedupe_messages_total", `outcome="new"`)
	repeats := scrape(t, addr, "dedupe_messages_total", `outcome="repeat"`)
	judged := newCount + repeats + scrape(t, addr, "dedupe_messages_total", `outcome="dead_letter"`) +
		scrape(t, addr, "dedupe_unpartitioned_dead_letters_total")
	republished := scrape(t, addr, "dedupe_republish_duplicates_total")
	if judged != float64(deliveries) || deliveries < uint64(unjudged) {
		t.Errorf("the restart judged %v messages (new %v, repeat %v) of %d deliveries; %d were unacknowledged at the kill", judged, newCount, repeats, deliveries, unjudged)
	}
	if want := float64(uint64(len(unique))-atKill) + republished; newCount != want {
		t.Errorf("the restart decided %v keys new; want the %d the output lacked plus %v re-publishes it reported", newCount, uint64(len(unique))-atKill, republished)
	}
	if republished > partitions*batchSize {
		t.Errorf("the output reported %v re-published keys; at most %d (a batch per partition) can have been between publish and commit at the kill", republished, partitions*batchSize)
	}
	t.Logf("at the kill: %d keys forwarded, %d messages unjudged; the restart judged %v deliveries, %v new, %v repeats, %v re-publishes dropped by the output",
		atKill, unjudged, judged, newCount, repeats, republished)

	// Everything again: nothing new, every copy judged a repeat.
	before := outputCount(t, js)
	publishWithRepeats(t, js, "k", events)
	drained(t, js, 90*time.Second)
	if after := outputCount(t, js); after != before {
		t.Errorf("republishing after the crash forwarded %d more", after-before)
	}
	if got := scrape(t, addr, "dedupe_messages_total", `outcome="new"`); got != newCount {
		t.Errorf("the replay was judged new %v times", got-newCount)
	}
	if got := scrape(t, addr, "dedupe_messages_total", `outcome="repeat"`) - repeats; got != events {
		t.Errorf("the replay was judged a repeat %v times, want %d", got, events)
	}
	if log := p2.Log(); strings.Contains(log, "claim found a key the lookup did not") {
		t.Errorf("the restart claimed a key its lookup missed:\n%s", grepLines(log, "claim found"))
	}
}

// consumerInfo returns the stage's consumer's info.
func consumerInfo(t *testing.T, js jetstream.JetStream) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := js.Consumer(context.Background(), "EVENTS", "dedupe-stage")
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// scrape returns the sum of the series of metric name on the stage's
// /metrics at addr whose labels contain every one of labels.
func scrape(t *testing.T, addr, name string, labels ...string) float64 {
	t.Helper()
	body, err := httpGet("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line[:sp], l)
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

func TestSIGTERMExitsCleanly(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	addr := proctest.Addr(t)
	p := startStage(t, srv.ClientURL(), t.TempDir(), addr)
	publishWithRepeats(t, js, "term", 2000)
	metrics, err := httpGet("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(metrics, "dedupe_build_info{revision=") || !strings.Contains(metrics, ",version=") {
		t.Errorf("/metrics has no dedupe_build_info{revision,version}:\n%s", grepLines(metrics, "build_info"))
	}
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
		if p.Err() != nil {
			t.Fatalf("exit after SIGTERM: %v", p.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still running 10s after SIGTERM")
	}
	b := p.Log()
	if !strings.Contains(b, "stopped cleanly") {
		t.Errorf("log does not say it stopped cleanly:\n%s", proctest.Tail(b, 2000))
	}
	if strings.Contains(b, "nats disconnected") {
		t.Errorf("a clean stop logs a disconnect warning:\n%s", grepLines(b, "disconnected"))
	}
}

func TestCheckConfigAndBadConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("window:\n  paths:\n    - {name: webhook-retry, max: 72h}\n"), 0o644)
	os.WriteFile(bad, []byte("state:\n  partitions: 0\n"), 0o644)
	var out, errb strings.Builder
	if code := realMain([]string{"check-config", good}, &out, &errb); code != 0 {
		t.Fatalf("check-config good: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "webhook-retry") {
		t.Errorf("check-config does not say how the window was derived:\n%s", out.String())
	}
	out.Reset()
	errb.Reset()
	if code := realMain([]string{"check-config", bad}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "state.partitions") {
		t.Errorf("check-config bad: exit %d, stderr %q; want non-zero naming state.partitions", code, errb.String())
	}
}

func TestUnreachableServerIsAClearError(t *testing.T) {
	var out, errb strings.Builder
	code := realMain([]string{"run", "--nats-url", "nats://127.0.0.1:1", "--data-dir", t.TempDir(), "--http-addr", ""}, &out, &errb)
	if code == 0 || !strings.Contains(errb.String(), "nats://127.0.0.1:1") {
		t.Errorf("exit %d, stderr %q; want a non-zero exit naming the server", code, errb.String())
	}
}
