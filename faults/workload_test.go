package faults

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/gobuild"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/sink"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Names the stage uses by default, and the headers of the test inputs.
const (
	inputStream  = "EVENTS"
	outputStream = "EVENTS_DEDUPED"
	dlqStream    = "DEDUPE_DLQ"
	consumerName = "dedupe-stage"

	headerKey  = "Event-Id" // the stage's key
	headerPlan = "Plan-Id"  // identifies one published input; kept on dead letters
)

// event is one input message of a workload.
type event struct {
	id   int    // unique per input message: the Plan-Id header
	key  string // the Event-Id header; "" leaves the header out
	data []byte
	bad  string // the dead-letter reason the stage must give it; "" for a good input
}

// workload generates inputs and remembers what the stage must make of them:
// each good key forwarded exactly once with its first payload, each bad
// input dead-lettered exactly once with its reason. It is not safe for
// concurrent use.
type workload struct {
	rng      *rand.Rand
	prefix   string
	next     int
	maxBytes int // the stage's pipeline.max_message_bytes

	forward    map[string][]byte // key -> payload the output must hold once
	keys       []string          // forwarded keys, in order of first publication
	firstID    map[string]int    // forwarded key -> id of its first copy
	preloaded  map[string][]byte // keys already in the store before the stage ran: never forwarded
	npreloaded int               // preloadedKey(prefix, 0..npreloaded-1) are in preloaded
	dead       map[int]string    // input id -> dead-letter reason
	badTurn    int
}

func newWorkload(seed uint64, prefix string, maxBytes int) *workload {
	return &workload{
		rng:       rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		prefix:    prefix,
		maxBytes:  maxBytes,
		forward:   map[string][]byte{},
		firstID:   map[string]int{},
		preloaded: map[string][]byte{},
		dead:      map[int]string{},
	}
}

func (w *workload) id() int { w.next++; return w.next }

func payloadOf(key string) []byte { return []byte(`{"event":"` + key + `","amount":42}`) }

// fresh is the first copy of a new key.
func (w *workload) fresh() event {
	id := w.id()
	k := fmt.Sprintf("%s-%d", w.prefix, id)
	w.forward[k] = payloadOf(k)
	w.keys = append(w.keys, k)
	w.firstID[k] = id
	return event{id: id, key: k, data: payloadOf(k)}
}

// repeat is another copy of one of the last 500 new keys.
func (w *workload) repeat() event {
	if len(w.keys) == 0 {
		return w.fresh()
	}
	k := w.keys[len(w.keys)-1-w.rng.IntN(min(len(w.keys), 500))]
	return event{id: w.id(), key: k, data: w.forward[k]}
}

// copyOf is another copy of key k, which must be known.
func (w *workload) copyOf(k string) event {
	if d, ok := w.preloaded[k]; ok {
		return event{id: w.id(), key: k, data: d}
	}
	return event{id: w.id(), key: k, data: w.forward[k]}
}

// preloadedCopy is a copy of a random preloaded key: a repeat.
func (w *workload) preloadedCopy() event {
	if w.npreloaded == 0 {
		return w.repeat()
	}
	return w.copyOf(preloadedKey(w.prefix, w.rng.IntN(w.npreloaded)))
}

// mismatch is a copy of k with a different payload: dead-lettered as
// fingerprint_mismatch, provided k's first copy was judged before it.
func (w *workload) mismatch(k string) event {
	id := w.id()
	w.dead[id] = "fingerprint_mismatch"
	return event{id: id, key: k, data: []byte(`{"event":"` + k + `","amount":-1}`), bad: "fingerprint_mismatch"}
}

// bad is an input the stage cannot judge, in turn: no key, a key with a
// space, a key longer than 256 bytes, a payload over max_message_bytes.
func (w *workload) bad() event {
	id := w.id()
	var e event
	switch w.badTurn % 4 {
	case 0:
		e = event{id: id, data: []byte(`{"no":"key"}`), bad: "no_key"}
	case 1:
		e = event{id: id, key: fmt.Sprintf("bad key %d", id), data: []byte(`{}`), bad: "bad_key"}
	case 2:
		e = event{id: id, key: strings.Repeat("x", 300) + strconv.Itoa(id), data: []byte(`{}`), bad: "key_too_long"}
	case 3:
		e = event{id: id, key: fmt.Sprintf("%s-oversized-%d", w.prefix, id), data: make([]byte, w.maxBytes+1), bad: "oversized"}
	}
	w.badTurn++
	w.dead[id] = e.bad
	return e
}

// mix returns n inputs: fresh keys, repeats of recent keys with probability
// pRepeat, bad inputs with probability pBad, and copies of preloaded keys
// with probability pPreloaded.
func (w *workload) mix(n int, pRepeat, pBad, pPreloaded float64) []event {
	out := make([]event, 0, n)
	for range n {
		switch r := w.rng.Float64(); {
		case r < pBad:
			out = append(out, w.bad())
		case r < pBad+pPreloaded:
			out = append(out, w.preloadedCopy())
		case r < pBad+pPreloaded+pRepeat:
			out = append(out, w.repeat())
		default:
			out = append(out, w.fresh())
		}
	}
	return out
}

// msg is e as a NATS message. The Nats-Msg-Id makes a retried publish of the
// same input land once in the input stream; round distinguishes deliberate
// re-publications of the same inputs.
func (e event) msg(round string) *nats.Msg {
	h := nats.Header{}
	h.Set(headerPlan, strconv.Itoa(e.id))
	h.Set(jetstream.MsgIDHeader, round+"-"+strconv.Itoa(e.id))
	if e.key != "" {
		h.Set(headerKey, e.key)
		g, at := totalOf(e.key)
		h.Set(headerGroup, g)
		h.Set(headerTime, strconv.FormatInt(at.Unix(), 10))
	}
	return &nats.Msg{Subject: "events.faults", Header: h, Data: e.data}
}

// Headers a test with totals reads (totalsExtra): every input with a key
// carries its key's group and event time.
const (
	headerGroup = "Group"
	headerTime  = "Ts"
)

// totalsBase is the latest event time of the inputs: this process's start,
// to the minute.
var totalsBase = time.Now().Truncate(time.Minute)

// totalOf returns the group and event time every copy of key carries: one
// of 5 groups and one of the 3 minutes up to totalsBase, by the key's
// FNV-1a hash.
func totalOf(key string) (group string, at time.Time) {
	h := fnv.New32a()
	h.Write([]byte(key))
	v := h.Sum32()
	return "g" + strconv.Itoa(int(v%5)), totalsBase.Add(-time.Duration(v/5%3) * time.Minute)
}

// totalsTruth returns what the totals must end as when every key of keys
// counts once: per sink ID (sink.Total.ID), the number of keys of that
// group and minute.
func totalsTruth(keys []string) map[string]int64 {
	out := map[string]int64{}
	for _, k := range keys {
		g, at := totalOf(k)
		out[sink.Total{Group: g, Bucket: at.UTC()}.ID()]++
	}
	return out
}

// publisherJS is a JetStream context whose async publishes time out, so
// that a publish lost in a server restart is retried instead of awaited
// forever.
func publisherJS(tb testing.TB, url string) jetstream.JetStream {
	tb.Helper()
	nc, _ := natstest.Connect(tb, url)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(3*time.Second), jetstream.WithPublishAsyncMaxPending(512))
	if err != nil {
		tb.Fatal(err)
	}
	return js
}

// pubAck is the input stream's acknowledgement of one input.
type pubAck struct {
	seq uint64    // the input's stream sequence
	at  time.Time // when the acknowledgement arrived
}

// publish publishes events to the input stream in windows of 128, at most
// perSecond per second (0: unlimited), retrying failed publishes until the
// stream acknowledges each one or timeout passes. It returns each input's
// acknowledgement by id. It is safe to call from a goroutine other than the
// test's: it reports failure as an error.
func publish(ctx context.Context, js jetstream.JetStream, events []event, round string, perSecond int, timeout time.Duration) (map[int]pubAck, error) {
	seqs := make(map[int]pubAck, len(events))
	deadline := time.Now().Add(timeout)
	start := time.Now()
	const window = 128
	for lo := 0; lo < len(events); lo += window {
		pending := events[lo:min(lo+window, len(events))]
		for len(pending) > 0 {
			if err := ctx.Err(); err != nil {
				return seqs, err
			}
			if time.Now().After(deadline) {
				return seqs, fmt.Errorf("publishing inputs: %d of %d still unacknowledged after %v", len(events)-len(seqs), len(events), timeout)
			}
			futures := make([]jetstream.PubAckFuture, len(pending))
			for i, e := range pending {
				futures[i], _ = js.PublishMsgAsync(e.msg(round))
			}
			var failed []event
			for i, f := range futures {
				if f == nil {
					failed = append(failed, pending[i])
					continue
				}
				select {
				case ack := <-f.Ok():
					seqs[pending[i].id] = pubAck{seq: ack.Sequence, at: time.Now()}
				case <-f.Err():
					failed = append(failed, pending[i])
				}
			}
			pending = failed
			if len(pending) > 0 {
				time.Sleep(100 * time.Millisecond) // a pause before publishing the failed ones again
			}
		}
		if perSecond > 0 {
			due := start.Add(time.Duration(float64(lo+window) / float64(perSecond) * float64(time.Second)))
			time.Sleep(time.Until(due)) // on purpose: the rate asked for
		}
	}
	return seqs, nil
}

// mustPublish is publish from the test goroutine.
func mustPublish(tb testing.TB, js jetstream.JetStream, events []event, round string) map[int]pubAck {
	tb.Helper()
	seqs, err := publish(context.Background(), js, events, round, 0, 60*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	return seqs
}

// settledMsgs returns streamMsgs(js, stream) once two reads half a second
// apart agree (within 10s): a stage killed right after it sent an atomic
// batch's commit leaves the server storing that batch after the kill, and
// a count read before it would credit the batch to the next run.
func settledMsgs(js jetstream.JetStream, stream string) uint64 {
	last := streamMsgs(js, stream)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond) // on purpose: the count must hold still this long
		n := streamMsgs(js, stream)
		if n == last {
			break
		}
		last = n
	}
	return last
}

// streamMsgs returns the number of messages stream holds (0 when it does not
// exist or does not answer).
func streamMsgs(js jetstream.JetStream, stream string) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return 0
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// consumerInfo returns the stage's consumer's info.
func consumerInfo(tb testing.TB, js jetstream.JetStream) *jetstream.ConsumerInfo {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, inputStream, consumerName)
	if err != nil {
		tb.Fatalf("consumer %s: %v", consumerName, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		tb.Fatalf("consumer %s info: %v", consumerName, err)
	}
	return info
}

// waitDrained waits until the stage has acknowledged every input.
func waitDrained(tb testing.TB, js jetstream.JetStream, timeout time.Duration) {
	tb.Helper()
	natstest.WaitDrained(tb, js, inputStream, consumerName, timeout)
}

// checkOutput asserts that the output stream holds each key of want exactly
// once, with its payload, and nothing else but scale-out's partition fences.
func checkOutput(tb testing.TB, js jetstream.JetStream, want map[string][]byte) {
	tb.Helper()
	got := map[string]int{}
	wrong := 0
	for _, m := range natstest.ReadAll(tb, js, outputStream) {
		if strings.HasPrefix(m.Subject, strings.TrimSuffix(changelog.ControlSubjects("deduped"), ">")) {
			continue
		}
		k := m.Header.Get(jetstream.MsgIDHeader)
		got[k]++
		if w, ok := want[k]; ok && string(w) != string(m.Data) && wrong < 5 {
			wrong++
			tb.Errorf("output %s carries payload %.60q, want %.60q", k, m.Data, w)
		}
	}
	missing, doubled, extra := 0, 0, 0
	for k := range want {
		switch n := got[k]; {
		case n == 0:
			if missing++; missing <= 5 {
				tb.Errorf("key %s lost: not in the output", k)
			}
		case n > 1:
			if doubled++; doubled <= 5 {
				tb.Errorf("key %s forwarded %d times", k, n)
			}
		}
	}
	for k, n := range got {
		if _, ok := want[k]; !ok {
			if extra++; extra <= 5 {
				tb.Errorf("key %.80q in the output %d times, want none", k, n)
			}
		}
	}
	if missing+doubled+extra > 0 {
		tb.Errorf("output: %d keys lost, %d doubled, %d unexpected, of %d expected", missing, doubled, extra, len(want))
	}
}

// checkDeadLetters asserts that the dead-letter stream holds exactly one
// dead letter per input of want (by Plan-Id), with its reason, each naming
// a distinct original message (stream and sequence), and nothing else.
func checkDeadLetters(tb testing.TB, js jetstream.JetStream, want map[int]string) {
	tb.Helper()
	got := map[int]int{}
	origSeq := map[string]int{}
	for _, m := range natstest.ReadAll(tb, js, dlqStream) {
		if strings.HasPrefix(m.Subject, "_dedupe.") { // a scale-out group's dead-letter fence
			continue
		}
		id, err := strconv.Atoi(m.Header.Get(headerPlan))
		if err != nil {
			tb.Errorf("dead letter %d without a Plan-Id: %v", m.Seq, m.Header)
			continue
		}
		got[id]++
		reason := m.Header.Get("Dedupe-Reason")
		if want[id] != "" && reason != want[id] {
			tb.Errorf("input %d dead-lettered as %q, want %q (%s)", id, reason, want[id], m.Header.Get("Dedupe-Detail"))
		}
		if want[id] == "" {
			tb.Errorf("input %d, a good one, dead-lettered as %q: %s", id, reason, m.Header.Get("Dedupe-Detail"))
		}
		if s := m.Header.Get("Dedupe-Original-Sequence"); s == "" {
			tb.Errorf("dead letter of input %d has no Dedupe-Original-Sequence", id)
		} else {
			origSeq[m.Header.Get("Dedupe-Original-Stream")+" "+s]++
		}
	}
	for id, reason := range want {
		if got[id] != 1 {
			tb.Errorf("input %d (%s) dead-lettered %d times, want once", id, reason, got[id])
		}
	}
	for id, n := range got {
		if _, ok := want[id]; !ok {
			tb.Errorf("input %d dead-lettered %d times, want never", id, n)
		}
	}
	for s, n := range origSeq {
		if n > 1 {
			tb.Errorf("original message %s dead-lettered %d times", s, n)
		}
	}
}

// preloadedKey is the i-th key preload records.
func preloadedKey(prefix string, i int) string { return fmt.Sprintf("%s-preloaded-%d", prefix, i) }

// preload records n keys in the stage's store, as if the stage had forwarded
// them a moment ago, then removes the filter snapshots, so that the stage's
// next start rebuilds every filter from a full scan. The keys are added to
// w.preloaded with the payload whose fingerprint is stored: inputs with
// those keys are repeats.
//
// The keys are written by this test binary built without the race detector
// and run as a helper process (see TestMain): under the race detector,
// Badger writes ten times slower. It is built with the binaries' flags, so
// that it shares their packages in the build cache.
func preload(tb testing.TB, cfg stageConfig, w *workload, n int) {
	tb.Helper()
	helperOnce.Do(func() {
		helperBin = filepath.Join(binDir, "faults-helper.test")
		if err := gobuild.TestBinary(context.Background(), helperBin, "."); err != nil {
			helperErr = fmt.Errorf("building the preload helper: %w", err)
		}
	})
	if helperErr != nil {
		tb.Fatal(helperErr)
	}
	cfgPath := filepath.Join(tb.TempDir(), "preload.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg.yaml()), 0o644); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(helperBin)
	cmd.Env = append(os.Environ(), helperEnv+"="+cfgPath, helperEnv+"_N="+strconv.Itoa(n), helperEnv+"_PREFIX="+w.prefix)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("preload helper: %v\n%s", err, out)
	}
	for i := range n {
		k := preloadedKey(w.prefix, i)
		w.preloaded[k] = payloadOf(k)
	}
	w.npreloaded = n
	removeSnapshots(tb, cfg)
}

// helperEnv, when set to a stage config file, makes the test binary record
// keys in that stage's store and exit (see preloadMain).
const helperEnv = "DEDUPE_FAULTS_PRELOAD"

var (
	helperOnce sync.Once
	helperBin  string
	helperErr  error
)

// preloadMain is the helper process of preload.
func preloadMain() int {
	n, err := strconv.Atoi(os.Getenv(helperEnv + "_N"))
	if err == nil {
		err = preloadStore(os.Getenv(helperEnv), os.Getenv(helperEnv+"_PREFIX"), n)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "preload:", err)
		return 1
	}
	return 0
}

// preloadStore records keys preloadedKey(prefix, 0..n-1) in the store of the
// stage configured in cfgPath, each with the fingerprint of its payload.
func preloadStore(cfgPath, prefix string, n int) error {
	c, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	win, err := c.Window.Derive()
	if err != nil {
		return err
	}
	opts := c.StateOptions(win) // the store the stage opens
	opts.SyncWrites = false
	opts.GCInterval, opts.SnapshotInterval = 0, 0
	opts.Logger = slog.New(slog.DiscardHandler)
	st, err := state.Open(context.Background(), opts)
	if err != nil {
		return err
	}
	claims := make([][]state.Claim, st.Partitions())
	flush := func(p int) error {
		_, err := st.Partition(p).Claim(claims[p])
		claims[p] = claims[p][:0]
		return err
	}
	for i := range n {
		k := preloadedKey(prefix, i)
		p := state.PartitionOf([]byte(k), st.Partitions())
		claims[p] = append(claims[p], state.Claim{Key: []byte(k), Fingerprint: xxhash.Sum64(payloadOf(k))})
		if len(claims[p]) == 4096 {
			if err := flush(p); err != nil {
				st.Close()
				return err
			}
		}
	}
	for p := range claims {
		if err := flush(p); err != nil {
			st.Close()
			return err
		}
	}
	return st.Close()
}

// snapshotPath is partition p's filter snapshot.
func snapshotPath(cfg stageConfig, p int) string {
	return filepath.Join(state.PartitionDir(filepath.Join(cfg.DataDir, "state"), p), state.SnapshotFile)
}

// removeSnapshots deletes every partition's filter snapshot.
func removeSnapshots(tb testing.TB, cfg stageConfig) {
	tb.Helper()
	for p := range cfg.Partitions {
		if err := os.Remove(snapshotPath(cfg, p)); err != nil && !errors.Is(err, os.ErrNotExist) {
			tb.Fatal(err)
		}
	}
}
