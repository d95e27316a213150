package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/handover"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// The hand-over mode (--handover) measures what issue 22 §3 names: how
// long a partition, or a whole group, takes to move to a new owner with an
// empty data dir after the old owner is killed, on a 3-node cluster with
// the real binary as processes. See the "Hand-over mode" section of
// bench/README.md.

// Key prefixes of the hand-over mode: the loaded keys and the probes
// published after the kill.
const (
	hoLoadPrefix  = "hol"
	hoProbePrefix = "hop"
)

// hoProbeRate is the probes published per second after the kill, for at
// most hoProbeFor.
const (
	hoProbeRate = 200
	hoProbeFor  = 2 * time.Minute
)

// HandOverRun is the JSON of a hand-over run.
type HandOverRun struct {
	Cluster          string  `json:"cluster"`
	Keys             int     `json:"keys"`
	Partitions       int     `json:"partitions"`
	PinTTLSeconds    float64 `json:"pin_ttl_seconds"`
	SnapshotInterval string  `json:"snapshot_interval"`
	// LoadSeconds is the load's publish until drained; LoadPerSec its rate.
	LoadSeconds float64 `json:"load_seconds"`
	LoadPerSec  float64 `json:"load_per_sec"`
	// SnapshotWaitSeconds is from the drain until every partition had a
	// snapshot of all its keys.
	SnapshotWaitSeconds float64 `json:"snapshot_wait_seconds"`
	SnapshotBytes       int64   `json:"snapshot_bytes"`
	SnapshotRecords     int64   `json:"snapshot_records"`
	SnapshotBytesPerKey float64 `json:"snapshot_bytes_per_key"`
	// BStartedAtKill is true when B was started right after the kill (more
	// than one partition: started earlier, B would take its share while A
	// lives); false when B stood by, ready, before it.
	BStartedAtKill bool `json:"b_started_at_kill"`
	// BReadySeconds is the kill until b answered /readyz, when started at
	// the kill; the probes start then.
	BReadySeconds float64 `json:"b_ready_seconds,omitempty"`
	// Stop is how A was stopped (--handover-stop): kill (SIGKILL) or term
	// (SIGTERM, a clean stop); "the kill" below is that signal.
	Stop string `json:"stop"`
	// AExitSeconds is the signal until A's process exited.
	AExitSeconds float64 `json:"a_exit_seconds"`
	// FirstForwardSeconds is the kill until the output stream stored the
	// first probe forwarded by B; BeyondTTLSeconds that minus the pin's
	// TTL (the figure issue 22's targets name; 0 after a clean stop, which
	// does not wait for the pin's TTL).
	FirstForwardSeconds float64 `json:"kill_to_first_forward_seconds"`
	BeyondTTLSeconds    float64 `json:"beyond_ttl_seconds"`
	// LastTakenSeconds is the kill until B logged its last partition taken
	// (the whole group moved).
	LastTakenSeconds float64 `json:"kill_to_last_partition_taken_seconds"`
	// Takeovers are B's "scale-out: partition taken" log lines.
	Takeovers            []HandOverTake `json:"takeovers"`
	RestoreRecordsPerSec float64        `json:"restore_records_per_sec"`
	// BAnonRSSMaxMiB and BHeapInuseMaxMiB are the largest anonymous RSS
	// and Go heap in use (garbage not yet collected included) of B's
	// process, sampled every 100 ms from the kill (or from B's start,
	// when started at it) until B had taken every partition;
	// BAnonRSSFirstMiB is the first sample; BPeakRSSMiB is its peak RSS
	// (VmHWM) then, file-backed pages included.
	BAnonRSSFirstMiB float64  `json:"b_anon_rss_first_mib"`
	BAnonRSSMaxMiB   float64  `json:"b_anon_rss_max_mib"`
	BHeapInuseMaxMiB float64  `json:"b_heap_inuse_max_mib"`
	BPeakRSSMiB      float64  `json:"b_peak_rss_mib"`
	Probes           int      `json:"probes"`
	ProbesLost       int      `json:"probes_lost"`
	ProbesDuplicated int      `json:"probes_duplicated"`
	Copies           int      `json:"copies_of_loaded_keys"`
	LoadedLost       int      `json:"loaded_lost"`
	LoadedDuplicated int      `json:"loaded_duplicated"`
	Foreign          int      `json:"foreign_output"`
	OK               bool     `json:"ok"`
	Notes            []string `json:"notes,omitempty"`
}

// HandOverTake is one takeover as the new owner logged it.
type HandOverTake struct {
	Partition    int     `json:"partition"`
	Path         string  `json:"path"`
	FromSnapshot int64   `json:"from_snapshot"`
	Restored     int64   `json:"restored"`
	TookSeconds  float64 `json:"took_seconds"`
	AtSeconds    float64 `json:"at_seconds_after_kill"`
}

// runHandOver runs the hand-over mode. Every process it starts is stopped
// before it returns.
func runHandOver(ctx context.Context, f *flags, dir string) (*HandOverRun, error) {
	run := &HandOverRun{Keys: f.hoKeys, Partitions: f.hoPartitions, PinTTLSeconds: f.hoAckWait.Seconds(),
		SnapshotInterval: f.hoSnapshotInterval.String()}
	cs := &children{}
	defer cs.closeAll()

	fc := *f
	fc.partitions, fc.soAckWait = f.hoPartitions, f.hoAckWait
	binDir := filepath.Join(dir, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return nil, err
	}
	e := &soEnv{f: &fc, cs: cs, dir: dir, stageBin: filepath.Join(binDir, "dedupe-stage"),
		thr: &Workload{Spec: Spec{Prefix: hoLoadPrefix, Keys: f.hoKeys}}}
	natsBin := filepath.Join(binDir, "nats-server")
	fmt.Fprintf(logOut, "building dedupe-stage and nats-server into %s\n", binDir)
	if err := buildBinary(ctx, e.stageBin, "github.com/dedupe-stage/dedupe-stage/cmd/dedupe-stage"); err != nil {
		return nil, err
	}
	if err := buildBinary(ctx, natsBin, "github.com/nats-io/nats-server/v2"); err != nil {
		return nil, err
	}
	clDir := filepath.Join(dir, "cluster")
	if err := os.MkdirAll(clDir, 0o755); err != nil {
		return nil, err
	}
	fmt.Fprintf(logOut, "starting 3 nats-server processes (sync_always=%v) in %s\n", f.syncAlways, clDir)
	var err error
	if e.cl, err = startCluster(ctx, cs, natsBin, clDir, 3, f.syncAlways); err != nil {
		return nil, err
	}
	nc, err := nats.Connect(e.cl.urls(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	if e.js, err = jetstream.New(nc); err != nil {
		return nil, err
	}
	run.Cluster = fmt.Sprintf("3 nats-server processes (%s) on loopback, sync_always=%v; R%d file streams; stage: %d partitions, key as subject token, state.sync_writes=%v",
		nc.ConnectedServerVersion(), f.syncAlways, f.replicas, f.hoPartitions, f.syncWrites)
	err = e.handOver(ctx, run)
	run.OK = err == nil && run.ProbesLost == 0 && run.ProbesDuplicated == 0 && run.LoadedLost == 0 &&
		run.LoadedDuplicated == 0 && run.Foreign == 0 && run.Probes > 0
	return run, err
}

// hoRun is a hand-over run on a cluster: what its phases share.
type hoRun struct {
	*soEnv
	run    *HandOverRun
	row    soRow
	n      soNames
	hoDir  string
	cfg    config.Config
	a, b   *instance
	loaded time.Time // when the load was drained
	last   uint64    // the output stream's last sequence before the kill
}

// handOver runs the phases of the mode on e's cluster.
func (e *soEnv) handOver(ctx context.Context, run *HandOverRun) error {
	h := &hoRun{soEnv: e, run: run, row: soRow{mode: soSubject, instances: 2}, n: namesForRow(0),
		hoDir: filepath.Join(e.dir, "handover")}
	if err := h.configure(); err != nil {
		return err
	}
	if !e.f.keep {
		defer e.deleteRow(h.n, h.cfg)
	}
	defer func() {
		for _, in := range []*instance{h.a, h.b} {
			if in.proc != nil {
				e.cs.release(in.proc, 30*time.Second)
			}
		}
	}()
	if err := e.createStreams(ctx, h.cfg); err != nil {
		return err
	}
	for _, phase := range []func(context.Context) error{h.load, h.snapshotted, h.standBy, h.kill, h.copies} {
		if err := phase(ctx); err != nil {
			return err
		}
	}
	return e.verifyHandOver(ctx, h.n, run)
}

// configure writes the configurations of instances a and b.
func (h *hoRun) configure() error {
	ports, err := proctest.Ports(2)
	if err != nil {
		return err
	}
	insts := make([]*instance, 2)
	for k, name := range []string{"a", "b"} {
		// "a" sorts first: with one partition its quota is 1 and B's 0,
		// so B stands by.
		in := &instance{name: name, cfgPath: filepath.Join(h.hoDir, name+".yaml"), addr: fmt.Sprintf("127.0.0.1:%d", ports[k])}
		y := h.yaml(h.row, h.n, name, filepath.Join(h.hoDir, name+"-data"), in.addr) +
			fmt.Sprintf("  snapshot_interval: %s\n", h.f.hoSnapshotInterval)
		if err := os.MkdirAll(h.hoDir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(in.cfgPath, []byte(y), 0o644); err != nil {
			return err
		}
		if h.cfg, err = config.Parse([]byte(y)); err == nil {
			err = h.cfg.Validate()
		}
		if err != nil {
			return fmt.Errorf("%s: %w", in.cfgPath, err)
		}
		insts[k] = in
	}
	h.a, h.b = insts[0], insts[1]
	if routed, why := h.cfg.ScaleOutPartitioning().Routed(); routed {
		return fmt.Errorf("the route step would run (%s)", why)
	}
	return nil
}

// load starts A alone, owning every partition, and loads the keys through
// it.
func (h *hoRun) load(ctx context.Context) error {
	f, a, run := h.f, h.a, h.run
	if err := h.startInstance(ctx, h.row, 0, a, h.hoDir); err != nil {
		return err
	}
	if err := waitReady(ctx, a, 60*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(logOut, "loading %d keys through instance a\n", f.hoKeys)
	lctx, cancel := context.WithTimeout(ctx, f.hoLoadTimeout)
	defer cancel()
	start := time.Now()
	prog := startProgress("load", uint64(f.hoKeys), f.progressEvery, nil)
	_, err := publishAll(lctx, h.js, f.hoKeys, func(i int) *nats.Msg {
		return h.n.msg(soSubject, KeyString(hoLoadPrefix, f.seed, i), i, f.payloadSize)
	}, prog)
	prog.end()
	if err == nil {
		var cons []soConsumer
		if cons, err = h.consumersOf(ctx, h.n.input); err == nil {
			err = h.waitDrained(ctx, cons, []*instance{a}, max(time.Until(start.Add(f.hoLoadTimeout)), time.Second), nil)
		}
	}
	if err != nil {
		return fmt.Errorf("load of %d keys (bound --handover-load-timeout %v): %w", f.hoKeys, f.hoLoadTimeout, err)
	}
	h.loaded = time.Now()
	// Pins are taken by the first message of a partition: a alone owns
	// them all once the load is in.
	if err := h.waitOwned(ctx, a, f.hoPartitions, 10*time.Second); err != nil {
		return err
	}
	run.LoadSeconds = h.loaded.Sub(start).Seconds()
	run.LoadPerSec = float64(f.hoKeys) / run.LoadSeconds
	fmt.Fprintf(logOut, "loaded in %.1fs (%.0f keys/s); waiting for a snapshot of every partition\n", run.LoadSeconds, run.LoadPerSec)
	return nil
}

// snapshotted waits for a snapshot of every partition written after the
// load.
func (h *hoRun) snapshotted(ctx context.Context) error {
	if err := h.waitSnapshots(ctx, h.cfg, h.a, h.loaded, h.run); err != nil {
		return err
	}
	h.run.SnapshotWaitSeconds = time.Since(h.loaded).Seconds()
	return nil
}

// standBy starts B with an empty data dir when it stands by (one
// partition; with more it is started at the kill), and notes the output's
// last sequence.
func (h *hoRun) standBy(ctx context.Context) error {
	f, run := h.f, h.run
	run.BStartedAtKill = f.hoPartitions > 1
	if !run.BStartedAtKill {
		if err := h.startInstance(ctx, h.row, 0, h.b, h.hoDir); err != nil {
			return err
		}
		if err := waitReady(ctx, h.b, 60*time.Second); err != nil {
			return err
		}
		time.Sleep(time.Second) // B's presence is seen by A; nothing moves
		if o := h.owned(ctx, []*instance{h.a, h.b}); o[0] != f.hoPartitions || o[1] != 0 {
			run.Notes = append(run.Notes, fmt.Sprintf("before the kill a owned %d partitions and b %d", o[0], o[1]))
		}
	}
	var err error
	h.last, err = h.lastSeq(ctx, h.n.output)
	return err
}

// kill kills A, publishes probes, finds the first forward and waits until
// B has taken every partition.
func (h *hoRun) kill(ctx context.Context) error {
	f, b, run := h.f, h.b, h.run
	sig, how := os.Signal(syscall.SIGKILL), "killed instance a (SIGKILL)"
	if f.hoStop == "term" {
		sig, how = syscall.SIGTERM, "stopping instance a (SIGTERM: it finishes, gives back and unpins its partitions)"
	}
	run.Stop = f.hoStop
	_ = h.a.proc.Cmd.Process.Signal(sig)
	t0 := time.Now()
	aExit := make(chan time.Duration, 1)
	go func() {
		<-h.a.proc.Exited()
		aExit <- time.Since(t0)
	}()
	fmt.Fprintf(logOut, "%s; publishing probes at %d/s\n", how, hoProbeRate)
	if run.BStartedAtKill {
		// b's start refuses to run while messages arrive during its check
		// of the input stream (see the README), so the probes start once b
		// is ready: well inside the pin's TTL, before which nothing moves.
		if err := h.startInstance(ctx, h.row, 0, b, h.hoDir); err != nil {
			return err
		}
		if err := waitReady(ctx, b, 60*time.Second); err != nil {
			return err
		}
		run.BReadySeconds = time.Since(t0).Seconds()
	}
	mw := watchMem(ctx, b.proc.Pid(), b.addr, 100*time.Millisecond)
	pctx, stopProbes := context.WithTimeout(ctx, hoProbeFor)
	defer stopProbes()
	probes := make(chan int, 1)
	go func() { probes <- h.publishProbes(pctx, h.n) }()
	t1, err := h.firstForward(pctx, h.n, h.last, b)
	if err == nil {
		run.FirstForwardSeconds = t1.Sub(t0).Seconds()
		if f.hoStop == "kill" {
			run.BeyondTTLSeconds = run.FirstForwardSeconds - f.hoAckWait.Seconds()
		}
		err = h.waitTaken(pctx, b, f.hoPartitions)
	}
	m := mw.end()
	run.BAnonRSSFirstMiB, run.BAnonRSSMaxMiB = float64(m.AnonFirst)/(1<<20), float64(m.AnonMax)/(1<<20)
	run.BHeapInuseMaxMiB, run.BPeakRSSMiB = float64(m.HeapMax)/(1<<20), float64(m.PeakRSS)/(1<<20)
	select {
	case d := <-aExit:
		run.AExitSeconds = d.Seconds()
	case <-time.After(time.Minute):
		run.Notes = append(run.Notes, "instance a had not exited a minute after its signal")
	}
	time.Sleep(time.Second) // a few more probes after the last takeover
	stopProbes()
	run.Probes = <-probes
	if err != nil {
		return fmt.Errorf("hand-over: %w", err)
	}
	run.Takeovers = takeovers(b.proc.LogPath, t0)
	var recs, took float64
	for _, t := range run.Takeovers {
		run.LastTakenSeconds = max(run.LastTakenSeconds, t.AtSeconds)
		recs += float64(t.FromSnapshot + t.Restored)
		took = max(took, t.TookSeconds)
	}
	if took > 0 {
		run.RestoreRecordsPerSec = recs / took
	}
	return nil
}

// copies publishes copies of loaded keys through B and drains them: none
// may be forwarded again.
func (h *hoRun) copies(ctx context.Context) error {
	f, run := h.f, h.run
	run.Copies = min(f.hoCopies, f.hoKeys)
	if _, err := publishAll(ctx, h.js, run.Copies, func(j int) *nats.Msg {
		i := j * (f.hoKeys / run.Copies)
		return h.n.msg(soSubject, KeyString(hoLoadPrefix, f.seed, i), i, f.payloadSize)
	}, startProgress("", 0, 0, nil)); err != nil {
		return fmt.Errorf("copies: %w", err)
	}
	cons, err := h.consumersOf(ctx, h.n.input)
	if err == nil {
		err = h.waitDrained(ctx, cons, []*instance{h.b}, f.timeout, nil)
	}
	if err != nil {
		return fmt.Errorf("drain after the hand-over: %w", err)
	}
	return nil
}

// waitOwned waits until in owns want partitions.
func (e *soEnv) waitOwned(ctx context.Context, in *instance, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if got := e.owned(ctx, []*instance{in})[0]; got == want {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("%s owns %d partitions after %v, want %d", in.name, got, timeout, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// consumersOf lists the consumers of stream.
func (e *soEnv) consumersOf(ctx context.Context, stream string) ([]soConsumer, error) {
	st, err := e.js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	var cons []soConsumer
	names := st.ConsumerNames(ctx)
	for name := range names.Name() {
		cons = append(cons, soConsumer{stream: stream, name: name})
	}
	return cons, names.Err()
}

// waitSnapshots waits until every partition's snapshot object was modified
// after loaded and A's snapshots hold every loaded key, bounded by twice
// the snapshot interval plus five minutes (writing the snapshots of a
// large group takes a while); it records their size.
func (e *soEnv) waitSnapshots(ctx context.Context, cfg config.Config, a *instance, loaded time.Time, run *HandOverRun) error {
	timeout := 2*e.f.hoSnapshotInterval + 5*time.Minute
	deadline := time.Now().Add(timeout)
	last := "no snapshot bucket"
	for {
		if !a.proc.Running() {
			return fmt.Errorf("a exited: %v\n%s", a.proc.Err(), a.proc.LogTail(3000))
		}
		if ok, why := e.snapshotsDone(ctx, cfg, a, loaded, run); ok {
			return nil
		} else {
			last = why
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no snapshot of every partition after the load within %v (%s)", timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// snapshotsDone reports whether every partition has a snapshot newer than
// loaded holding every loaded key, or why not.
func (e *soEnv) snapshotsDone(ctx context.Context, cfg config.Config, a *instance, loaded time.Time, run *HandOverRun) (bool, string) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	obs, err := e.js.ObjectStore(rctx, layout.SnapshotBucket(cfg.ScaleOut.Group))
	if err != nil {
		return false, err.Error()
	}
	var size int64
	for p := range e.f.hoPartitions {
		info, err := obs.GetInfo(rctx, layout.SnapshotObject(p))
		if err != nil {
			return false, fmt.Sprintf("p%d: %v", p, err)
		}
		if !info.ModTime.After(loaded) {
			return false, fmt.Sprintf("p%d written %v before the load ended", p, loaded.Sub(info.ModTime).Round(time.Millisecond))
		}
		size += int64(info.Size)
	}
	s, err := scrape(ctx, a.addr)
	if err != nil {
		return false, err.Error()
	}
	recs := int64(s.sum("dedupe_snapshot_records"))
	if recs < int64(e.f.hoKeys) {
		return false, fmt.Sprintf("snapshots hold %d records of %d keys", recs, e.f.hoKeys)
	}
	run.SnapshotBytes, run.SnapshotRecords = size, recs
	run.SnapshotBytesPerKey = float64(size) / float64(recs)
	return true, ""
}

// lastSeq returns the last sequence of stream.
func (e *soEnv) lastSeq(ctx context.Context, stream string) (uint64, error) {
	st, err := e.js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	return info.State.LastSeq, nil
}

// publishProbes publishes new probe keys at hoProbeRate until ctx is done
// and returns how many were stored.
func (e *soEnv) publishProbes(ctx context.Context, n soNames) int {
	tick := time.NewTicker(time.Second / hoProbeRate)
	defer tick.Stop()
	var futures []jetstream.PubAckFuture
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
		case <-tick.C:
			f, err := e.js.PublishMsgAsync(n.msg(soSubject, KeyString(hoProbePrefix, e.f.seed, i), i, e.f.payloadSize))
			if err == nil {
				futures = append(futures, f)
			}
			continue
		}
		break
	}
	stored := 0
	for _, f := range futures {
		select {
		case <-f.Ok():
			stored++
		case <-f.Err():
		case <-time.After(30 * time.Second):
		}
	}
	return stored
}

// firstForward polls the output stream after sequence last until it holds
// a forwarded probe (fence messages aside) and returns its stored time.
func (e *soEnv) firstForward(ctx context.Context, n soNames, last uint64, b *instance) (time.Time, error) {
	st, err := e.js.Stream(ctx, n.output)
	if err != nil {
		return time.Time{}, err
	}
	fence := strings.TrimSuffix(handover.ControlSubjects(n.outPrefix), ">")
	for next := last + 1; ; {
		if b.proc != nil && !b.proc.Running() {
			return time.Time{}, fmt.Errorf("b exited: %v\n%s", b.proc.Err(), b.proc.LogTail(3000))
		}
		m, err := st.GetMsg(ctx, next)
		switch {
		case err == nil:
			next++
			if !strings.HasPrefix(m.Subject, fence) {
				return m.Time, nil
			}
			continue
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case ctx.Err() != nil:
			return time.Time{}, fmt.Errorf("no probe forwarded within %v of the kill", hoProbeFor)
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitTaken waits until b has logged want partitions taken.
func (e *soEnv) waitTaken(ctx context.Context, b *instance, want int) error {
	for {
		got := len(takeovers(b.proc.LogPath, time.Time{}))
		if got >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("b took %d of %d partitions within %v of the kill", got, want, hoProbeFor)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logField matches key=value or key="value" in a text log line.
var logField = regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S+)`)

// takeovers parses the "scale-out: partition taken" lines of a log, with
// their time after t0.
func takeovers(path string, t0 time.Time) []HandOverTake {
	b, _ := os.ReadFile(path)
	var out []HandOverTake
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.Contains(line, `msg="scale-out: partition taken"`) {
			continue
		}
		var t HandOverTake
		for _, m := range logField.FindAllStringSubmatch(line, -1) {
			v := strings.Trim(m[2], `"`)
			switch m[1] {
			case "time":
				if at, err := time.Parse(time.RFC3339Nano, v); err == nil && !t0.IsZero() {
					t.AtSeconds = at.Sub(t0).Seconds()
				}
			case "partition":
				t.Partition, _ = strconv.Atoi(v)
			case "path":
				t.Path = v
			case "from_snapshot":
				t.FromSnapshot, _ = strconv.ParseInt(v, 10, 64)
			case "restored":
				t.Restored, _ = strconv.ParseInt(v, 10, 64)
			case "took":
				d, _ := time.ParseDuration(v)
				t.TookSeconds = d.Seconds()
			}
		}
		out = append(out, t)
	}
	return out
}

// verifyHandOver reads the output stream: every loaded key and every probe
// exactly once, fence messages apart.
func (e *soEnv) verifyHandOver(ctx context.Context, n soNames, run *HandOverRun) error {
	kf, err := keys.NewKeyFunc(keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "id"}})
	if err != nil {
		return err
	}
	var loaded, probes []uint16
	fence := strings.TrimSuffix(handover.ControlSubjects(n.outPrefix), ">")
	if _, err := readStreamAgain(ctx, e.js, n.output, func() {
		loaded, probes, run.Foreign = make([]uint16, e.f.hoKeys), make([]uint16, run.Probes), 0
	}, func(m jetstream.Msg) {
		if strings.HasPrefix(m.Subject(), fence) {
			return
		}
		k, err := kf.Key(m.Subject(), m.Headers(), m.Data())
		if err != nil {
			run.Foreign++
			return
		}
		switch prefix, i, ok := ParseKey(string(k)); {
		case ok && prefix == hoLoadPrefix && i < len(loaded):
			loaded[i]++
		case ok && prefix == hoProbePrefix && i < len(probes):
			probes[i]++
		default:
			run.Foreign++
		}
	}); err != nil {
		return err
	}
	once := func(int) int { return 1 }
	run.LoadedLost, run.LoadedDuplicated = exact(loaded, once)
	run.ProbesLost, run.ProbesDuplicated = exact(probes, once)
	return nil
}

// printHandOver prints the hand-over table.
func printHandOver(w io.Writer, r *HandOverRun) {
	fmt.Fprintf(w, "\nHand-over (%s)\n", r.Cluster)
	fmt.Fprintf(w, "keys %d, partitions %d, pin TTL (input.ack_wait) %gs, snapshot_interval %s; load %.1fs (%.0f keys/s), snapshot after %.1fs\n",
		r.Keys, r.Partitions, r.PinTTLSeconds, r.SnapshotInterval, r.LoadSeconds, r.LoadPerSec, r.SnapshotWaitSeconds)
	what := map[string]string{"kill": "kill", "term": "stop"}[r.Stop]
	when := "standing by before the " + what
	if r.BStartedAtKill {
		when = fmt.Sprintf("started at the %s, ready %.2fs after it (the probes start then)", what, r.BReadySeconds)
	}
	fmt.Fprintf(w, "new owner b (empty data dir) %s\n\n", when)
	fmt.Fprintf(w, "| %-28s | %12s |\n|%s|%s|\n", "measure", "value", strings.Repeat("-", 30), strings.Repeat("-", 14))
	row := func(k, v string) { fmt.Fprintf(w, "| %-28s | %12s |\n", k, v) }
	row(what+" -> a exited", fmt.Sprintf("%.2f s", r.AExitSeconds))
	row(what+" -> first forward", fmt.Sprintf("%.2f s", r.FirstForwardSeconds))
	if r.Stop == "kill" {
		row("  beyond the pin's TTL", fmt.Sprintf("%.2f s", r.BeyondTTLSeconds))
	}
	row(what+" -> last partition taken", fmt.Sprintf("%.2f s", r.LastTakenSeconds))
	row("restore records/s", fmt.Sprintf("%.0f", r.RestoreRecordsPerSec))
	row("b anon RSS first -> max", fmt.Sprintf("%.1f -> %.1f MiB", r.BAnonRSSFirstMiB, r.BAnonRSSMaxMiB))
	row("b max Go heap in use", fmt.Sprintf("%.1f MiB", r.BHeapInuseMaxMiB))
	row("b peak RSS", fmt.Sprintf("%.1f MiB", r.BPeakRSSMiB))
	row("snapshot bytes/key", fmt.Sprintf("%.1f", r.SnapshotBytesPerKey))
	row("probes (lost/dup)", fmt.Sprintf("%d (%d/%d)", r.Probes, r.ProbesLost, r.ProbesDuplicated))
	row("copies of loaded keys", strconv.Itoa(r.Copies))
	row("loaded keys (lost/dup)", fmt.Sprintf("%d/%d", r.LoadedLost, r.LoadedDuplicated))
	row("foreign output", strconv.Itoa(r.Foreign))
	row("ground truth", map[bool]string{true: "ok", false: "VIOLATED"}[r.OK])
	for _, t := range r.Takeovers {
		fmt.Fprintf(w, "  p%d taken at +%.2fs: path %s, %d from snapshot + %d restored in %.3fs\n",
			t.Partition, t.AtSeconds, t.Path, t.FromSnapshot, t.Restored, t.TookSeconds)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
}

// handOverFlags checks the flags of the hand-over mode and sets its
// defaults: no fsync per message unless --sync-always is given.
func handOverFlags(f *flags, set map[string]bool) error {
	switch {
	case f.scaleOut:
		return errors.New("--handover and --scaleout: run them separately")
	case set["configs"] || f.scale != "":
		return errors.New("--handover runs its own instances: leave --configs and --scale out")
	case f.natsURL != "":
		return errors.New("--handover starts its own cluster: leave --nats-url out")
	case set["rounds"] || set["key"]:
		return errors.New("--handover runs once, with the key as a subject token: leave --rounds and --key out")
	case f.hoKeys < 1:
		return fmt.Errorf("--handover-keys %d: want >= 1", f.hoKeys)
	case f.hoPartitions < 1:
		return fmt.Errorf("--handover-partitions %d: want >= 1", f.hoPartitions)
	case f.hoCopies < 0:
		return fmt.Errorf("--handover-copies %d: want >= 0", f.hoCopies)
	case f.hoSnapshotInterval < config.MinSnapshotInterval.D():
		return fmt.Errorf("--handover-snapshot-interval %v: want >= %v", f.hoSnapshotInterval, config.MinSnapshotInterval.D())
	case f.hoStop != "kill" && f.hoStop != "term":
		return fmt.Errorf("--handover-stop %q: want kill or term", f.hoStop)
	}
	if !set["sync-always"] {
		f.syncAlways = false
	}
	return nil
}
