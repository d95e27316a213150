package faults

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
)

// wipeKeys is how many keys the wiped-data-dir tests forward before the
// wipe and copy after it.
const wipeKeys = 10_000

// wipeCase is what TestWipedDataDir* vary: one instance or a member of a
// group, and how each waits, forgets and wipes.
type wipeCase struct {
	w       time.Duration // W, with window.refresh_on_repeat
	stages  []*stage      // every instance (one, or the group's three)
	js      jetstream.JetStream
	wl      *workload
	part    int                                // the partition of the policy keys
	drained func()                             // waits until every input published was judged
	forget  func(key string) admin.ForgetReply // `dedupe-stage forget` of key
	wipe    func()                             // stops an instance, removes its data dir and starts it again
}

// wipedEdit is the configuration of the wiped-data-dir tests: version-wins
// on the Ts header (every workload input carries one), W = w with
// window.refresh_on_repeat, and an output duplicate window shorter than
// the time between the keys' forwards and their copies, so that the
// output stream drops none of the copies.
func wipedEdit(w time.Duration) func(*stageConfig) {
	return func(c *stageConfig) {
		c.KeyVersion = headerTime
		c.Extra += windowYAML(w, true)
	}
}

// run forwards wipeKeys keys and the policy keys of c.part (A at versions
// 1 and 3, B and a repeat of it W/2 later that moves its window's end, C
// and a forget of C), wipes an instance's data dir, then publishes a copy
// (and a tenth of them a changed payload) of every key, A at version 2, C
// again, and B again after its first copy + W, before its moved end: the
// output holds each key's first forward once, C's forward after the
// forget, and nothing else; the changed payloads are dead-lettered.
func (c *wipeCase) run(t *testing.T) {
	t.Helper()
	parts := c.stages[0].cfg.Partitions
	a, b, cc := keyIn("wipe-A", c.part, parts), keyIn("wipe-B", c.part, parts), keyIn("wipe-C", c.part, parts)
	r := &policyRun{t: t, js: c.js, stages: c.stages}

	first := r.send(b, 1)
	keys := c.wl.mix(wipeKeys, 0, 0, 0)
	mustPublish(t, c.js, keys, "keys")
	c.drained()
	r.send(a, 1)
	r.send(a, 3)
	r.send(cc, 1)
	forgot := c.forget(cc)
	if !forgot.Held {
		t.Fatalf("forget %s = %+v; want it held", cc, forgot)
	}
	forwarded := time.Now()                    // C's, the last forward before the wipe
	time.Sleep(time.Until(first.Add(c.w / 2))) // on purpose: B's repeat half W after its first copy
	refreshed := r.send(b, 1)

	c.wipe()
	// A sleep on purpose: the output's duplicate window passes, so that
	// only the stage can recognise the copies.
	time.Sleep(time.Until(forwarded.Add(c.stages[0].cfg.DuplicateWindow + time.Second)))
	var copies []event
	for i, e := range keys {
		copies = append(copies, c.wl.copyOf(e.key))
		if i%10 == 0 {
			copies = append(copies, c.wl.mismatch(e.key))
		}
	}
	mustPublish(t, c.js, copies, "copies")
	copied := time.Now() // stored: judged by then, whenever the stage gets to them
	r.post(a, 2)
	r.post(cc, 1)
	time.Sleep(time.Until(first.Add(c.w + time.Second))) // on purpose: B's copy after its first + W
	last := r.post(b, 1)
	c.drained()
	t.Logf("since B's first copy: its repeat at %v, the copies after the wipe stored by %v, B's last copy at %v (W %v)",
		refreshed.Sub(first).Round(time.Millisecond), copied.Sub(first).Round(time.Millisecond), last.Sub(first).Round(time.Millisecond), c.w)
	if !copied.Before(first.Add(c.w)) || !last.Before(refreshed.Add(c.w)) {
		t.Fatal("the copies after the wipe came too late to tell (past their first copies' W, or B past its moved end)")
	}

	want := map[string][]byte{}
	for _, k := range c.wl.keys {
		_, ts := totalOf(k)
		want[k+":v"+strconv.FormatInt(ts.Unix(), 10)] = c.wl.forward[k]
	}
	for _, f := range []struct {
		id      string
		key     string
		version int
	}{{a + ":v1", a, 1}, {a + ":v3", a, 3}, {b + ":v1", b, 1}, {cc + ":v1", cc, 1},
		{fmt.Sprintf("%s:v1.forgotten.%d", cc, forgot.Applied.UnixNano()), cc, 1}} {
		want[f.id] = policyPayload(f.key, f.version)
	}
	checkOutput(t, c.js, want)
	checkDeadLetters(t, c.js, c.wl.dead)
}

// forgetConfig runs `dedupe-stage forget --config cfgPath key` and returns
// its answer.
func forgetConfig(tb testing.TB, cfgPath, key string) admin.ForgetReply {
	tb.Helper()
	out, err := exec.Command(stageBin, "forget", "--config", cfgPath, key).CombinedOutput()
	var f admin.ForgetReply
	if err != nil || json.Unmarshal(out, &f) != nil {
		tb.Fatalf("dedupe-stage forget %s: %v\n%s", key, err, out)
	}
	return f
}

// TestWipedDataDirOneInstance wipes the data dir of a single instance
// (a pod without a volume, a replaced disk) after it forwarded 10,000
// keys and the policy keys of wipeCase.run: it restores from the output
// stream before it judges a message, so none of the keys is forwarded
// again, A's version, B's moved window end and C's forget included.
func TestWipedDataDirOneInstance(t *testing.T) {
	t.Parallel()
	const w = 20 * time.Second
	srv := startNATSUnsynced(t)
	cfg := defaultStageConfig(t, srv.URL())
	cfg.RestartMargin = time.Second
	cfg.DuplicateWindow = 3 * time.Second
	wipedEdit(w)(&cfg)
	s := newStage(t, cfg)
	s.startReady()
	js := publisherJS(t, srv.URL())
	c := &wipeCase{
		w: w, stages: []*stage{s}, js: js, wl: newWorkload(4903, "wipe1", cfg.MaxMessageBytes),
		drained: func() { waitDrained(t, js, 60*time.Second) },
		forget:  func(key string) admin.ForgetReply { return forgetConfig(t, s.cfgPath, key) },
		wipe: func() {
			s.last().signal(t, syscall.SIGTERM, 30*time.Second)
			if err := os.RemoveAll(cfg.DataDir); err != nil {
				t.Fatal(err)
			}
			s.startReady()
		},
	}
	c.run(t)
	if n := s.metric("dedupe_start_restored_records_total"); n < wipeKeys {
		t.Errorf("dedupe_start_restored_records_total = %v after the wipe, want at least the %d keys", n, wipeKeys)
	}
}

// TestWipedDataDirGroupMember is TestWipedDataDirOneInstance for a member
// of a group of three on a 3-node cluster: the owner of the policy keys'
// partition is stopped, its data dir removed, and it is started again and
// takes its share of the partitions back (restoring them from the output)
// before the copies come. It bounds times (the copies after the wipe must
// come within W of their first copies), so it runs alone, not in parallel
// (doc.go).
func TestWipedDataDirGroupMember(t *testing.T) {
	const w = 48 * time.Second
	wl := newWorkload(4904, "wipe3", 4096)
	cl := startNATSClusterWith(t, 3, false) // processes: the cluster in this test process is slowed by the race detector
	stages, js := scaleOutGroupAt(t, cl.URLs(), 3, wl, wipedEdit(w))
	parts := stages[0].cfg.Partitions
	r := &policyRun{t: t, js: js, stages: stages}
	const p = 1
	name, owner := r.owner(p)
	c := &wipeCase{
		w: w, stages: stages, js: js, wl: wl, part: p,
		drained: func() { scaleOutDrained(t, js, parts, takeoverWait) },
		forget:  func(key string) admin.ForgetReply { return forgetCLI(t, stages[0].cfg.NATSURL, key) },
		wipe: func() {
			t.Logf("stopping %s, the owner of partition %d, and removing its data dir", name, p)
			owner.last().signal(t, syscall.SIGTERM, 30*time.Second)
			if err := os.RemoveAll(owner.cfg.DataDir); err != nil {
				t.Fatal(err)
			}
			owner.startReady()
			waitSpread(t, js, wl, stages, takeoverWait)
		},
	}
	c.run(t)
}
