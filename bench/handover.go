package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// The handover mode measures how long a partition, or a whole group,
// takes to move to a new owner with an empty data dir after the old owner
// is killed or stopped, on a 3-node cluster with the real binary as
// processes. See the "handover" section of bench/README.md.

// Key prefixes of the hand-over mode: the loaded keys and the probes
// published after the kill, hoProbeRate a second for at most hoProbeFor.
const (
	hoLoadPrefix  = "hol"
	hoProbePrefix = "hop"
	hoProbeRate   = 200
	hoProbeFor    = 2 * time.Minute
)

// HandOverRun is what the handover mode measured; bench/README.md says how
// each figure is taken. Each of Rounds is one stop of the partitions'
// owner and their hand-over to the other instance.
type HandOverRun struct {
	Keys, Partitions                     int
	PinTTLSeconds                        float64
	SnapshotInterval, Stop               string
	LoadSeconds, LoadPerSec              float64
	SnapshotWaitSeconds                  float64
	SnapshotBytes, SnapshotRecords       int64
	SnapshotBytesPerKey                  float64
	BStartedAtKill                       bool
	Rounds                               []HandOverRound
	Probes, ProbesLost, ProbesDuplicated int
	Copies, LoadedLost, LoadedDuplicated int
	Foreign                              int
	OK                                   bool
	Notes                                []string `json:",omitempty"`
}

// HandOverRound is one hand-over: a, the owner, is stopped ("the kill":
// Stop's signal) and b takes its partitions. Before each later round a
// is started again on its data dir and takes them back, and b stands by.
type HandOverRound struct {
	AExitSeconds                     float64 `json:"from_exit_seconds"`
	FirstForwardSeconds              float64 `json:"kill_to_first_forward_seconds"`
	BeyondTTLSeconds                 float64 `json:"beyond_ttl_seconds"`
	LastTakenSeconds                 float64 `json:"kill_to_last_partition_taken_seconds"`
	Takeovers                        []HandOverTake
	RestoreRecordsPerSec             float64
	BAnonRSSFirstMiB, BAnonRSSMaxMiB float64
	BHeapInuseMaxMiB, BPeakRSSMiB    float64
	// BReadySeconds is how long after the kill b was ready, when it
	// was started at the kill (BStartedAtKill).
	BReadySeconds float64
	// StandbyCatchUpSeconds is how long b, a warm standby
	// (scale_out.standbys), took after its start to hold the changelog up
	// to the output's last sequence; 0 when it stands by for nothing.
	StandbyCatchUpSeconds float64 `json:"standby_catch_up_seconds,omitempty"`
	Probes                int
}

// HandOverTake is one "scale-out: partition taken" line of the new owner.
type HandOverTake struct {
	Partition              int
	Path                   string
	FromSnapshot, Restored int64
	TookSeconds, AtSeconds float64
	// FencedSeconds is how much of TookSeconds came before the restore:
	// the stream's state, the checks and the fences.
	FencedSeconds float64
}

// defineHandOver defines the handover mode's flags: no fsync per message
// by default.
func defineHandOver(fs *flag.FlagSet, f *flags) {
	defineStage(fs, f, false)
	f.partitions, fs.Lookup("partitions").DefValue = 1, "1"
	defineProcs(fs, f)
	fs.IntVar(&f.hoKeys, "keys", 1_000_000, "distinct keys loaded through instance a before the kill")
	fs.IntVar(&f.payloadSize, "payload-size", 256, "payload bytes per event")
	fs.Uint64Var(&f.seed, "seed", 1, "key seed")
	fs.IntVar(&f.hoCopies, "copies", 10_000, "copies of loaded keys published through b after the hand-over (none may be forwarded)")
	fs.DurationVar(&f.hoSnapshotInterval, "snapshot-interval", 30*time.Second, "scale_out.snapshot_interval of the instances")
	fs.DurationVar(&f.hoLoadTimeout, "load-timeout", 20*time.Minute, "bound on loading the keys (publish and drain)")
	fs.StringVar(&f.hoStop, "stop", "kill", "how instance a stops: kill (SIGKILL, a crash: its partitions move after the pin's TTL) or term (SIGTERM, a planned stop: it gives back and unpins them)")
	fs.IntVar(&f.rounds, "rounds", 1, "hand-overs on one load (at most 20; more than one with one partition only): before each later one, a starts again on its data dir and takes the partitions back")
}

// checkHandOver checks the handover flags.
func checkHandOver(f *flags) error {
	switch {
	case f.hoKeys < 1 || f.hoCopies < 0:
		return fmt.Errorf("--keys %d, --copies %d: want >= 1 and >= 0", f.hoKeys, f.hoCopies)
	case f.hoSnapshotInterval < config.MinSnapshotInterval.D():
		return fmt.Errorf("--snapshot-interval %v: want >= %v", f.hoSnapshotInterval, config.MinSnapshotInterval.D())
	case f.hoStop != "kill" && f.hoStop != "term":
		return fmt.Errorf("--stop %q: want kill or term", f.hoStop)
	case f.rounds < 1 || f.rounds > 20 || f.rounds > 1 && f.partitions > 1:
		return fmt.Errorf("--rounds %d with --partitions %d: want 1 to 20 rounds, more than one only with one partition", f.rounds, f.partitions)
	}
	return nil
}

// runHandOverMode runs the hand-over into res. Every process it starts is
// stopped before it returns.
func runHandOverMode(ctx context.Context, f *flags, res *Results) error {
	run := &HandOverRun{Keys: f.hoKeys, Partitions: f.partitions, PinTTLSeconds: f.ackWait.Seconds(), SnapshotInterval: f.hoSnapshotInterval.String()}
	res.HandOver = run
	pe, err := startProcEnv(ctx, f, f.workDir, false)
	if err != nil {
		return err
	}
	defer pe.close()
	res.Settings = pe.describe() + fmt.Sprintf(", %d partitions, key as subject token", f.partitions)
	e := &soEnv{procEnv: pe, thr: &Workload{Spec: Spec{Prefix: hoLoadPrefix, Keys: f.hoKeys}}}
	err = e.handOver(ctx, run)
	run.OK = err == nil && run.ProbesLost == 0 && run.ProbesDuplicated == 0 && run.LoadedLost == 0 &&
		run.LoadedDuplicated == 0 && run.Foreign == 0 && len(run.Rounds) == f.rounds
	for _, r := range run.Rounds {
		run.OK = run.OK && r.Probes > 0
	}
	return err
}

// hoRun is a hand-over run on a cluster: what its phases share.
type hoRun struct {
	*soEnv
	run      *HandOverRun
	n        streamNames
	hoDir    string
	cfg      config.Config
	a, b     *instance // a owns the partitions until each round stops it; b takes them
	loaded   time.Time // when the load was drained
	last     uint64    // the output stream's last sequence before the kill
	caughtUp float64   // seconds b took to catch up as a warm standby
}

// back starts a, stopped in the last round, again on its data dir and
// waits until it owns the partitions again (it sorts first: the group's
// balance gives them back to it in a planned hand-over) and b, their
// owner in between, has caught up as a warm standby; it then notes the
// output's last sequence. The next round stops a again.
func (h *hoRun) back(ctx context.Context) error {
	f := h.f
	fmt.Fprintf(logOut, "starting instance a again on its data dir; the group's balance gives it the partitions back\n")
	if _, err := h.startAll(ctx, []*instance{h.a}, "", 0, h.catchUpWait()); err != nil {
		return err
	}
	if err := waitUntil(ctx, h.catchUpWait(), 200*time.Millisecond, fmt.Sprintf("a owning %d partitions again", f.partitions), []*instance{h.a, h.b}, func() (bool, string) {
		o := owned(ctx, []*instance{h.a, h.b})
		return o[0] == f.partitions && o[1] == 0, fmt.Sprintf("a owns %d, b %d", o[0], o[1])
	}); err != nil {
		return err
	}
	var err error
	if h.caughtUp, err = h.standbyCaughtUp(ctx, h.b); err != nil {
		return err
	}
	h.last, err = h.lastSeq(ctx, h.n.output)
	return err
}

// handOver runs the phases of the mode on e's cluster.
func (e *soEnv) handOver(ctx context.Context, run *HandOverRun) error {
	h := &hoRun{soEnv: e, run: run, n: namesForRow(0), hoDir: filepath.Join(e.dir, "handover")}
	err := h.configure(ctx)
	defer func() { e.release(h.n, h.cfg, []*instance{h.a, h.b}) }()
	if err != nil {
		return err
	}
	for _, phase := range []func(context.Context) error{h.load, h.snapshotted, h.standBy} {
		if err := phase(ctx); err != nil {
			return err
		}
	}
	for i := range h.f.rounds {
		if i > 0 {
			if err := h.back(ctx); err != nil {
				return err
			}
		}
		if err := h.kill(ctx); err != nil {
			return err
		}
	}
	if err := h.copies(ctx); err != nil {
		return err
	}
	return e.verifyHandOver(ctx, h.n, run)
}

// configure writes the configurations of instances a and b and creates
// the streams. "a" sorts first: with one partition its quota is 1 and b's
// 0, so b stands by.
func (h *hoRun) configure(ctx context.Context) error {
	insts, cfg, err := h.configureGroup(ctx, h.hoDir, h.n, []string{"a", "b"}, soSubject, false, h.f.hoKeys+100_000,
		func(c *config.Config) { c.ScaleOut.SnapshotInterval = config.Duration(h.f.hoSnapshotInterval) })
	if err != nil {
		return err
	}
	h.a, h.b, h.cfg = insts[0], insts[1], cfg
	if routed, why := h.cfg.ScaleOutPartitioning().Routed(); routed {
		return fmt.Errorf("the route step would run (%s)", why)
	}
	return nil
}

// load starts A alone, owning every partition, and loads the keys through
// it.
func (h *hoRun) load(ctx context.Context) error {
	f, a, run := h.f, h.a, h.run
	if _, err := h.startAll(ctx, []*instance{a}, "", 0, time.Minute); err != nil {
		return err
	}
	fmt.Fprintf(logOut, "loading %d keys through instance a\n", f.hoKeys)
	lctx, cancel := context.WithTimeout(ctx, f.hoLoadTimeout)
	defer cancel()
	start := time.Now()
	prog := startProgress("load", uint64(f.hoKeys), f.progressDur, nil)
	_, err := publishAll(lctx, h.js, f.hoKeys, func(i int) *nats.Msg {
		return h.n.msg(soSubject, KeyString(hoLoadPrefix, f.seed, i), i, f.payloadSize)
	}, prog)
	prog.end()
	if err == nil {
		var cons []consumerRef
		if cons, err = h.consumersOf(ctx, h.n.input); err == nil {
			err = h.waitDrained(ctx, cons, []*instance{a}, max(time.Until(start.Add(f.hoLoadTimeout)), time.Second), nil)
		}
	}
	if err != nil {
		return fmt.Errorf("load of %d keys (bound --load-timeout %v): %w", f.hoKeys, f.hoLoadTimeout, err)
	}
	h.loaded = time.Now()
	// Pins are taken by the first message of a partition: a alone owns
	// them all once the load is in.
	if err := waitUntil(ctx, 10*time.Second, 200*time.Millisecond, fmt.Sprintf("a owning %d partitions", f.partitions), nil, func() (bool, string) {
		got := owned(ctx, []*instance{a})[0]
		return got == f.partitions, fmt.Sprintf("it owns %d", got)
	}); err != nil {
		return err
	}
	run.LoadSeconds = h.loaded.Sub(start).Seconds()
	run.LoadPerSec = float64(f.hoKeys) / run.LoadSeconds
	fmt.Fprintf(logOut, "loaded in %.1fs (%.0f keys/s); waiting for a snapshot of every partition\n", run.LoadSeconds, run.LoadPerSec)
	return nil
}

// snapshotted waits until A's snapshots hold every loaded key, bounded
// by twice the snapshot interval plus five minutes (writing the snapshots
// of a large group takes a while); snapshotsDone records their size.
func (h *hoRun) snapshotted(ctx context.Context) error {
	if err := waitUntil(ctx, 2*h.f.hoSnapshotInterval+5*time.Minute, 500*time.Millisecond, "a snapshot of every partition after the load", []*instance{h.a}, func() (bool, string) {
		return h.snapshotsDone(ctx, h.cfg, h.a, h.run)
	}); err != nil {
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
	run.BStartedAtKill = f.partitions > 1
	if !run.BStartedAtKill {
		if _, err := h.startAll(ctx, []*instance{h.b}, "", 0, time.Minute); err != nil {
			return err
		}
		time.Sleep(time.Second) // B's presence is seen by A; nothing moves
		var err error
		if h.caughtUp, err = h.standbyCaughtUp(ctx, h.b); err != nil {
			return err
		}
		if o := owned(ctx, []*instance{h.a, h.b}); o[0] != f.partitions || o[1] != 0 {
			run.Notes = append(run.Notes, fmt.Sprintf("before stop 1 a owned %d partitions and b %d", o[0], o[1]))
		}
	}
	var err error
	h.last, err = h.lastSeq(ctx, h.n.output)
	return err
}

// standbyCatchUpWait bounds how long standBy waits for b, a warm
// standby, to tail the changelog up to the output's end: at least this,
// and a second per 10,000 keys loaded (a standby tailed 30-45k records/s
// at 10M keys; a 5-minute bound stopped it at 9.55M of 10M).
const standbyCatchUpWait = 5 * time.Minute

// catchUpWait is standbyCatchUpWait for the keys loaded.
func (h *hoRun) catchUpWait() time.Duration {
	return max(standbyCatchUpWait, time.Duration(h.f.hoKeys/10_000)*time.Second)
}

// standbyCaughtUp waits, when b is a warm standby of a's partitions
// (dedupe_standby_partitions), until its cursors reach the output's last
// sequence on the partitions' subjects, bounded by catchUpWait, and
// returns how long that took: 0 for an instance without warm standbys
// (or a version before them), which is not waited for.
func (h *hoRun) standbyCaughtUp(ctx context.Context, b *instance) (float64, error) {
	start := time.Now()
	last, err := h.lastSeq(ctx, h.n.output)
	if err != nil {
		return 0, err
	}
	var fs metrictest.Families
	if err := waitUntil(ctx, h.catchUpWait(), 200*time.Millisecond, fmt.Sprintf("%s, a warm standby, catching up with the output's sequence %d", b.name, last), nil, func() (bool, string) {
		if fs, err = metrictest.Scrape(ctx, b.addr); err != nil {
			return false, err.Error()
		}
		if fs.Sum("dedupe_standby_partitions", nil) == 0 {
			// None once the group has settled (standbySettle, 5 s), a
			// balance pass has set the standbys (every input.ack_wait)
			// and a tail interval (2 s) passed.
			return time.Since(start) > h.f.ackWait+10*time.Second, "no standby partition yet"
		}
		low := -1.0
		for p := range h.f.partitions {
			c := fs.Sum("dedupe_standby_cursor", map[string]string{"partition": strconv.Itoa(p)})
			if low < 0 || c < low {
				low = c
			}
		}
		// The fence and control records past the last forward are not
		// the partitions': a cursor within a few sequences is there.
		return low > 0 && uint64(low)+16 >= last, fmt.Sprintf("lowest cursor %.0f", low)
	}); err != nil {
		return 0, err
	}
	if fs == nil || fs.Sum("dedupe_standby_partitions", nil) == 0 {
		return 0, nil
	}
	took := time.Since(start).Seconds()
	fmt.Fprintf(logOut, "%s, a warm standby, caught up with the changelog in %.1fs\n", b.name, took)
	return took, nil
}

// kill stops a, publishes probes, finds the first forward and waits
// until b has taken every partition: one round.
func (h *hoRun) kill(ctx context.Context) error {
	f, b, run := h.f, h.b, h.run
	sig, how := os.Signal(syscall.SIGKILL), "killed instance %s (SIGKILL)"
	if f.hoStop == "term" {
		sig, how = syscall.SIGTERM, "stopping instance %s (SIGTERM: it finishes, gives back and unpins its partitions)"
	}
	run.Stop = f.hoStop
	r := &HandOverRound{StandbyCatchUpSeconds: h.caughtUp}
	_ = h.a.proc.Cmd.Process.Signal(sig)
	t0 := time.Now()
	aExit := make(chan time.Duration, 1)
	go func() {
		<-h.a.proc.Exited()
		aExit <- time.Since(t0)
	}()
	fmt.Fprintf(logOut, "round %d: "+how+"; publishing probes at %d/s\n", len(run.Rounds)+1, "a", hoProbeRate)
	if run.BStartedAtKill {
		// b's start refuses to run while messages arrive during its check
		// of the input stream (see the README), so the probes start once b
		// is ready: well inside the pin's TTL, before which nothing moves.
		if _, err := h.startAll(ctx, []*instance{b}, "", 0, time.Minute); err != nil {
			return err
		}
		r.BReadySeconds = time.Since(t0).Seconds()
	}
	endWatch := watchMem(ctx, b.proc.Pid(), b.addr, 100*time.Millisecond)
	pctx, stopProbes := context.WithTimeout(ctx, hoProbeFor)
	defer stopProbes()
	probes := make(chan int, 1)
	go func() { probes <- h.publishProbes(pctx, h.n, run.Probes) }()
	t1, err := h.firstForward(pctx, h.n, h.last, b)
	if err == nil {
		r.FirstForwardSeconds = t1.Sub(t0).Seconds()
		if f.hoStop == "kill" {
			r.BeyondTTLSeconds = r.FirstForwardSeconds - f.ackWait.Seconds()
		}
		err = waitUntil(pctx, hoProbeFor, 100*time.Millisecond, fmt.Sprintf("b taking %d partitions after the kill", f.partitions), []*instance{b}, func() (bool, string) {
			got := len(takeovers(b.proc.LogPath, t0))
			return got >= f.partitions, fmt.Sprintf("%d taken", got)
		})
	}
	m := endWatch()
	r.BAnonRSSFirstMiB, r.BAnonRSSMaxMiB = float64(m.AnonFirst)/(1<<20), float64(m.AnonMax)/(1<<20)
	r.BHeapInuseMaxMiB, r.BPeakRSSMiB = float64(m.HeapMax)/(1<<20), float64(m.PeakRSS)/(1<<20)
	select {
	case d := <-aExit:
		r.AExitSeconds = d.Seconds()
	case <-time.After(time.Minute):
		run.Notes = append(run.Notes, fmt.Sprintf("round %d: instance a had not exited a minute after its signal", len(run.Rounds)+1))
	}
	time.Sleep(time.Second) // a few more probes after the last takeover
	stopProbes()
	r.Probes = <-probes
	run.Probes += r.Probes
	if err != nil {
		return fmt.Errorf("hand-over %d: %w", len(run.Rounds)+1, err)
	}
	r.Takeovers = takeovers(b.proc.LogPath, t0)
	var recs, took float64
	for _, t := range r.Takeovers {
		r.LastTakenSeconds = max(r.LastTakenSeconds, t.AtSeconds)
		recs += float64(t.FromSnapshot + t.Restored)
		took = max(took, t.TookSeconds)
	}
	if took > 0 {
		r.RestoreRecordsPerSec = recs / took
	}
	run.Rounds = append(run.Rounds, *r)
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
	}, &progress{}); err != nil {
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

// snapshotsDone reports whether the partitions' snapshots hold every
// loaded key, or why not.
func (e *soEnv) snapshotsDone(ctx context.Context, cfg config.Config, a *instance, run *HandOverRun) (bool, string) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	obs, err := e.js.ObjectStore(rctx, layout.SnapshotBucket(cfg.ScaleOut.Group))
	if err != nil {
		return false, err.Error()
	}
	var size int64
	for p := range e.f.partitions {
		info, err := obs.GetInfo(rctx, layout.SnapshotObject(p))
		if err != nil {
			return false, fmt.Sprintf("p%d: %v", p, err)
		}
		// A snapshot written after the last commit but before the
		// harness saw the drain is the last one (an unchanged partition
		// is not written again): the records below prove it whole.
		size += int64(info.Size)
	}
	fs, err := metrictest.Scrape(ctx, a.addr)
	if err != nil {
		return false, err.Error()
	}
	recs := int64(fs.Sum("dedupe_snapshot_records", nil))
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
	return st.CachedInfo().State.LastSeq, nil
}

// publishProbes publishes new probe keys, numbered from from on, at
// hoProbeRate until ctx is done and returns how many it published: one
// the stream did not store is lost in the ground truth.
func (e *soEnv) publishProbes(ctx context.Context, n streamNames, from int) int {
	start, sent := time.Now(), 0
	_ = natstest.Publish(ctx, e.js, int(hoProbeRate*hoProbeFor/time.Second), func(i int) *nats.Msg {
		pace(start, i, hoProbeRate)
		return n.msg(soSubject, KeyString(hoProbePrefix, e.f.seed, from+i), from+i, e.f.payloadSize)
	}, func(n int) { sent = n })
	return sent
}

// firstForward polls the output stream after sequence last until it holds
// a forwarded probe (fence messages aside) and returns its stored time.
func (e *soEnv) firstForward(ctx context.Context, n streamNames, last uint64, b *instance) (time.Time, error) {
	st, err := e.js.Stream(ctx, n.output)
	if err != nil {
		return time.Time{}, err
	}
	fence := strings.TrimSuffix(changelog.ControlSubjects(n.outPrefix), ">")
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

// logField matches key=value or key="value" in a text log line.
var logField = regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S+)`)

// takeovers parses the "scale-out: partition taken" lines of a log, with
// their time after t0: those before t0 are skipped unless t0 is zero.
func takeovers(path string, t0 time.Time) []HandOverTake {
	b, _ := os.ReadFile(path)
	var out []HandOverTake
lines:
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
				if t.AtSeconds < 0 {
					continue lines // an earlier round's
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
			case "fenced_after":
				d, _ := time.ParseDuration(v)
				t.FencedSeconds = d.Seconds()
			}
		}
		out = append(out, t)
	}
	return out
}

// verifyHandOver reads the output stream: every loaded key and every probe
// exactly once, fence messages apart.
func (e *soEnv) verifyHandOver(ctx context.Context, n streamNames, run *HandOverRun) error {
	t, err := e.tallyOutput(ctx, n, map[string]int{hoLoadPrefix: e.f.hoKeys, hoProbePrefix: run.Probes})
	if err != nil {
		return err
	}
	run.LoadedLost, run.LoadedDuplicated = t.exact(map[string]func(int) int{hoLoadPrefix: once})
	run.ProbesLost, run.ProbesDuplicated = t.exact(map[string]func(int) int{hoProbePrefix: once})
	run.Foreign = t.foreign
	return nil
}

// printHandOver prints the hand-over tables: one row per round, the
// median and maximum of the rounds, and the ground truth.
func printHandOver(w io.Writer, r *HandOverRun) {
	fmt.Fprintf(w, "\nhand-over: keys %d, partitions %d, pin TTL (input.ack_wait) %gs, snapshot_interval %s; load %.1fs (%.0f keys/s), snapshot after %.1fs\n",
		r.Keys, r.Partitions, r.PinTTLSeconds, r.SnapshotInterval, r.LoadSeconds, r.LoadPerSec, r.SnapshotWaitSeconds)
	what := map[string]string{"kill": "kill", "term": "stop"}[r.Stop]
	when := "standing by before the " + what
	if r.BStartedAtKill && len(r.Rounds) > 0 {
		when = fmt.Sprintf("started at the %s, ready %.2fs after it (the probes start then)", what, r.Rounds[0].BReadySeconds)
	}
	fmt.Fprintf(w, "new owner b (empty data dir in round 1) %s; before each later round a starts again on its data dir and takes the partitions back\n\n", when)
	fmt.Fprintf(w, "| round | %8s | %13s | %10s | %10s | %9s | %10s | %13s |\n", what+" ->", "first forward", "beyond TTL", "last taken", "restore/s", "b caught up", "b peak RSS")
	fmt.Fprintf(w, "|-------|----------|---------------|------------|------------|-----------|-------------|---------------|\n")
	var firsts []float64
	for i, o := range r.Rounds {
		beyond := "-"
		if r.Stop == "kill" {
			beyond = fmt.Sprintf("%.2f s", o.BeyondTTLSeconds)
		}
		fmt.Fprintf(w, "| %5d | %6.2f s | %11.2f s | %10s | %8.2f s | %9.0f | %9.1f s | %9.1f MiB |\n", i+1,
			o.AExitSeconds, o.FirstForwardSeconds, beyond, o.LastTakenSeconds, o.RestoreRecordsPerSec, o.StandbyCatchUpSeconds, o.BPeakRSSMiB)
		firsts = append(firsts, o.FirstForwardSeconds)
	}
	if len(firsts) > 0 {
		fmt.Fprintf(w, "\n%s -> first forward over %d rounds: median %.2f s, max %.2f s\n", what, len(firsts), median(firsts), slices.Max(firsts))
	}
	fmt.Fprintf(w, "\n| %-28s | %12s |\n|%s|%s|\n", "measure", "value", strings.Repeat("-", 30), strings.Repeat("-", 14))
	row := func(k, v string) { fmt.Fprintf(w, "| %-28s | %12s |\n", k, v) }
	row("snapshot bytes/key", fmt.Sprintf("%.1f", r.SnapshotBytesPerKey))
	row("probes (lost/dup)", fmt.Sprintf("%d (%d/%d)", r.Probes, r.ProbesLost, r.ProbesDuplicated))
	row("copies of loaded keys", strconv.Itoa(r.Copies))
	row("loaded keys (lost/dup)", fmt.Sprintf("%d/%d", r.LoadedLost, r.LoadedDuplicated))
	row("foreign output", strconv.Itoa(r.Foreign))
	row("ground truth", map[bool]string{true: "ok", false: "VIOLATED"}[r.OK])
	for i, o := range r.Rounds {
		fmt.Fprintf(w, "  round %d: b anon RSS %.1f -> %.1f MiB, max Go heap in use %.1f MiB\n", i+1, o.BAnonRSSFirstMiB, o.BAnonRSSMaxMiB, o.BHeapInuseMaxMiB)
		for _, t := range o.Takeovers {
			fmt.Fprintf(w, "    p%d taken at +%.2fs: path %s, %d from snapshot + %d restored in %.3fs (fenced after %.3fs)\n",
				t.Partition, t.AtSeconds, t.Path, t.FromSnapshot, t.Restored, t.TookSeconds, t.FencedSeconds)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
}
