package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/bench/loop"
	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/stage"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// Kind is one of the configurations compared.
type Kind string

// The configurations, in the order they run by default (stage-refresh only
// when --configs names it).
const (
	// KindRaw is the pass-through loop without dedupe: the ceiling.
	KindRaw Kind = "raw"
	// KindRawAtomic is the raw loop forwarding each batch as atomic
	// batches, one sync per batch when the server fsyncs: the ceiling of
	// group commit.
	KindRawAtomic Kind = "raw-atomic"
	// KindJetStream is the same loop publishing with Nats-Msg-Id = key
	// into an output stream whose duplicate window is W.
	KindJetStream Kind = "jetstream"
	// KindStageBloom is dedupe-stage with the Bloom pre-check.
	KindStageBloom Kind = "stage-bloom"
	// KindStageNoFilter is dedupe-stage with the pre-check off.
	KindStageNoFilter Kind = "stage-nofilter"
	// KindStageRefresh is stage-bloom with window.refresh_on_repeat: each
	// repeat moves its key's window, a write in the batch's commit.
	KindStageRefresh Kind = "stage-refresh"
)

var allKinds = []Kind{KindRaw, KindRawAtomic, KindJetStream, KindStageBloom, KindStageNoFilter, KindStageRefresh}

func (k Kind) token() string {
	switch k {
	case KindRaw:
		return "raw"
	case KindRawAtomic:
		return "rawatomic"
	case KindJetStream:
		return "js"
	case KindStageBloom:
		return "bloom"
	case KindStageRefresh:
		return "refresh"
	default:
		return "nofilter"
	}
}

func (k Kind) isStage() bool {
	return k == KindStageBloom || k == KindStageNoFilter || k == KindStageRefresh
}

// filtered reports whether k is a stage configuration with the Bloom
// pre-check on.
func (k Kind) filtered() bool { return k == KindStageBloom || k == KindStageRefresh }

// isRaw reports whether k is a loop without dedupe (it forwards every copy).
func (k Kind) isRaw() bool { return k == KindRaw || k == KindRawAtomic }

func (k Kind) describe() string {
	switch k {
	case KindRaw:
		return "consume -> publish -> ack, routed by key, no dedupe (the ceiling)"
	case KindRawAtomic:
		return "the raw loop, each batch forwarded as atomic batches (the ceiling of group commit)"
	case KindJetStream:
		return "the same loop, Nats-Msg-Id = key, output duplicate window = W"
	case KindStageBloom:
		return "dedupe-stage, Bloom pre-check on"
	case KindStageRefresh:
		return "dedupe-stage, Bloom pre-check on, window.refresh_on_repeat (each repeat moves its key's window)"
	default:
		return "dedupe-stage, pre-check off (every lookup reads Badger)"
	}
}

// Result is what one configuration measured.
type Result struct {
	Config      string `json:"config"`
	Description string `json:"description"`
	// Events is the number of main-phase events: the backlog whose drain
	// is timed.
	Events int `json:"events"`
	// LateEvents is the number of near and past copies judged after the
	// drain, in groups at known clock readings (untimed).
	LateEvents int `json:"late_events"`
	// LateGroups is how many groups they were published in.
	LateGroups int `json:"late_groups"`
	// PublishSeconds is how long pre-publishing the backlog took (not part
	// of events/s).
	PublishSeconds float64 `json:"publish_seconds"`
	// DrainSeconds is from starting the pipeline on the backlog to the
	// consumer having acknowledged all of it.
	DrainSeconds float64 `json:"drain_seconds"`
	// EventsPerSec is Events / DrainSeconds.
	EventsPerSec float64 `json:"events_per_sec"`
	// DrainCPU is the CPU used during the drain; CPUMicrosPerEvent is this
	// process's CPU time per drained event, a figure other load on the
	// machine disturbs less than events/s.
	DrainCPU          CPUUse  `json:"drain_cpu"`
	CPUMicrosPerEvent float64 `json:"cpu_us_per_event"`
	// Stage is the stage's own view of its batches over the whole run
	// (from its Prometheus histograms).
	Stage   *StageInternals `json:"stage_internals,omitempty"`
	Latency Latency         `json:"latency"`
	// Round is the round (from 1) this result comes from; AllRounds
	// holds the events/s of every round of this configuration.
	Round     int       `json:"round"`
	AllRounds []float64 `json:"events_per_sec_all_rounds,omitempty"`
	// MemBefore is taken before the pipeline starts, MemAfter after all
	// phases with the pipeline still open (idle). PeakRSS in MemAfter is
	// the peak since the drain started.
	MemBefore MemSnap `json:"mem_before"`
	MemAfter  MemSnap `json:"mem_after"`
	// TrackedKeys is the number of distinct keys the configuration
	// remembers at the end (0 for raw).
	TrackedKeys int `json:"tracked_keys"`
	// DedupeHeapBytes is the Go heap that holds the dedupe memory: for the
	// stage, the heap freed by closing the store (Badger memtables and
	// caches, Bloom filters); for jetstream, the nats-server heap freed by
	// deleting the purged output stream (its dedupe map); for raw the same
	// measurement as jetstream, as a control.
	DedupeHeapBytes int64 `json:"dedupe_heap_bytes"`
	// RAMPerKey is DedupeHeapBytes / TrackedKeys.
	RAMPerKey float64 `json:"ram_bytes_per_key"`
	// FilterBytes is the Bloom filters' memory (part of DedupeHeapBytes).
	FilterBytes uint64 `json:"filter_bytes"`
	// DiskBytes is the state directory's allocated size (stage only).
	DiskBytes    int64   `json:"disk_bytes"`
	DiskApparent int64   `json:"disk_apparent_bytes"`
	DiskPerKey   float64 `json:"disk_bytes_per_key"`
	// Store figures (stage only), over all phases.
	StoreReadsPerEvent float64 `json:"store_reads_per_event"`
	SkipRatio          float64 `json:"filter_skip_ratio"`
	FalsePositiveRate  float64 `json:"filter_false_positive_rate"`
	EstimatedFPRate    float64 `json:"filter_estimated_fp_rate"`
	Lookups            uint64  `json:"lookups"`
	StoreReads         uint64  `json:"store_reads"`
	FalsePositives     uint64  `json:"false_positives"`
	// NearWindowEnd is the stage's count of repeats caught near the end of
	// the window; NearExpected is the ground truth's.
	NearWindowEnd float64 `json:"repeats_near_window_end"`
	NearExpected  int     `json:"repeats_near_window_end_expected"`
	// ForwardedAgain is the ground truth's count of copies past W that
	// must be forwarded again.
	ForwardedAgain int     `json:"forwarded_again_expected"`
	Startup        Startup `json:"startup"`
	Correctness    Correct `json:"correctness"`
	// ClockLagMaxW is how far the stage's clock lagged the intended times
	// during the drain, from the first-seen times stored for a sample of
	// keys, as a fraction of W (informational: main-phase judgements do
	// not depend on it).
	ClockLagMaxW   float64  `json:"clock_lag_max_w,omitempty"`
	ClockLagSample int      `json:"clock_lag_sample,omitempty"`
	Notes          []string `json:"notes,omitempty"`
}

// Latency is end to end: the producer's publish (wall clock in the
// Bench-Sent header) to the server storing the forwarded copy (the output
// message's stream timestamp), over the forwarded events of the paced
// latency phase.
type Latency struct {
	Events     int     `json:"events"`
	Forwarded  int     `json:"forwarded"`
	RatePerSec float64 `json:"rate_per_sec"`
	P50ms      float64 `json:"p50_ms"`
	P99ms      float64 `json:"p99_ms"`
	P999ms     float64 `json:"p999_ms"`
	MaxMs      float64 `json:"max_ms"`
}

// Startup is how long stage.New took (until every filter answers "maybe"
// for every key in the window).
type Startup struct {
	EmptyMs    float64 `json:"empty_ms"`
	SnapshotMs float64 `json:"snapshot_ms,omitempty"`
	RebuildMs  float64 `json:"rebuild_ms,omitempty"`
	// KeysInState is the number of records in the store at the restarts.
	KeysInState int    `json:"keys_in_state,omitempty"`
	Scanned     uint64 `json:"rebuild_scanned,omitempty"`
	Added       uint64 `json:"rebuild_added,omitempty"`
}

// Correct compares what reached the output with the ground truth.
type Correct struct {
	// Expected is the number of forwards the ground truth calls for.
	Expected int `json:"expected_forwards"`
	// Output is the number of messages in the output stream.
	Output int `json:"output_messages"`
	// DroppedByOutput is forwards the output stream acknowledged as
	// duplicates (its own window dropped them); for the stage these are
	// the copies past W forwarded again within the output stream's
	// duplicate window, for jetstream every repeat.
	DroppedByOutput int `json:"dropped_by_output"`
	// Lost is forwards the ground truth calls for that did not happen.
	Lost int `json:"lost"`
	// Duplicated is forwards beyond the ground truth.
	Duplicated int `json:"duplicated"`
	// Redelivered is, for raw only, events forwarded more than once
	// because JetStream redelivered them: raw has no dedupe.
	Redelivered int `json:"redelivered_forwarded_again,omitempty"`
	// DeadLettered is messages in the dead-letter stream.
	DeadLettered int  `json:"dead_lettered"`
	OK           bool `json:"ok"`
}

// runner runs the configurations against one server and workload.
type runner struct {
	f        *flags
	nats     *natsEnv
	thr, lat *Workload // the backlog (main and late phases) and the latency phase
	dir      string
	t0       time.Time // the stage clock's start
	latRate  float64
	round    int // the round running, from 1
	log      *slog.Logger
}

// stageConfig returns the stage configuration of kind: the defaults, with
// the bench's streams, the key source, the window and the filter sized for
// the workload's keys per window (never below the default).
func (r *runner) stageConfig(kind Kind, n streamNames) config.Config {
	cfg := config.Default()
	yes := true
	cfg.NATS = r.nats.cfg
	if r.nats.embedded() {
		cfg.NATS.URL = r.nats.srv.ClientURL()
	}
	cfg.NATS.CreateStreams = &yes
	cfg.Input.Stream = n.input
	cfg.Input.Subjects = []string{"in." + n.token + ".>"}
	cfg.Input.Consumer = "bench-" + n.token
	cfg.Output.Stream = n.output
	cfg.Output.SubjectPrefix = n.outPrefix
	cfg.DeadLetter.Stream = n.dlq
	cfg.DeadLetter.Subject = n.dlqSubj
	cfg.Key = r.keyConfig()
	if r.f.window > 0 {
		cfg.Window.Paths = []config.Path{{Name: "bench", Max: config.Duration(r.f.window)}}
		cfg.Window.Margin = 0
	}
	cfg.State.DataDir = filepath.Join(r.dir, string(kind))
	cfg.State.Partitions = r.f.partitions
	cfg.State.SyncWrites = &r.f.syncWrites
	cfg.Filter.Enabled = kind.filtered()
	cfg.Window.RefreshOnRepeat = kind == KindStageRefresh
	cfg.Filter.ExpectedKeys = max(cfg.Filter.ExpectedKeys, uint64(r.thr.Keys+r.lat.Keys))
	cfg.HTTP.Addr = ""
	cfg.Output.Publish = r.publishMode(cfg)
	return cfg
}

func (r *runner) keyConfig() keys.KeyConfig {
	kc := keys.DefaultKeyConfig()
	if r.f.keyMode == "json" {
		kc.Field = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "id"}
	} else {
		kc.Field = keys.FieldSpec{Source: keys.SourceHeader, Header: headerKey}
	}
	return kc
}

// sut is the system under test of one run.
type sut struct {
	run       func(ctx context.Context) error
	cons      jetstream.Consumer // the harness's handle on its consumer
	st        *stage.Stage
	reg       *prometheus.Registry
	clock     *window.ManualClock
	loopStats *loop.Stats
	// Ground truth of the stage's late phase: forwards per backlog key,
	// and each late key's window start (its last forward, or with
	// window.refresh_on_repeat its last repeat if later).
	forwards    []uint8
	windowStart map[int32]time.Time
}

// runConfig runs one configuration: pre-publish the backlog, time its
// drain, judge the late copies, run the paced latency phase, measure,
// verify.
func (r *runner) runConfig(ctx context.Context, kind Kind) (*Result, error) {
	n := namesFor(kind)
	res := &Result{Config: string(kind), Description: kind.describe(), Events: len(r.thr.Main), LateEvents: len(r.thr.Late)}
	fmt.Fprintf(logOut, "== %s: %s\n", kind, kind.describe())

	hnc, err := r.nats.connect()
	if err != nil {
		return nil, err
	}
	defer hnc.Close()
	hjs, err := jetstream.New(hnc)
	if err != nil {
		return nil, err
	}
	deleteStreams(ctx, hjs, n)
	if !r.f.keep {
		defer deleteStreams(context.Background(), hjs, n)
	}
	// 1. The backlog.
	pub, last, firstSeq, err := r.publishBacklog(ctx, kind, hnc, hjs, n, res)
	if err != nil {
		return nil, err
	}

	// 2. The system under test.
	cfg := r.stageConfig(kind, n)
	snc, err := r.nats.connect()
	if err != nil {
		return nil, err
	}
	defer snc.Close()
	res.MemBefore = readMem()
	s, err := r.build(ctx, kind, cfg, n, hjs, snc, res)
	if err != nil {
		return nil, err
	}
	if s.st != nil {
		defer s.st.Close() // safe after measureStage closed it
	}
	// 3. Timed drain of the backlog; the pipeline runs on until step 6.
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	done := make(chan error, 1)
	if err := r.timeDrain(ctx, kind, s, hjs, n, last, firstSeq, res, func() { done <- s.run(runCtx) }); err != nil {
		return nil, err
	}

	// 4. The late copies (near and past the window's end).
	if last, err = r.runLate(ctx, kind, s, pub, last, res); err != nil {
		return nil, fmt.Errorf("late phase: %w", err)
	}

	// 5. Paced latency phase, published while the pipeline runs.
	if err := r.latencyPhase(ctx, kind, s, pub, last, res); err != nil {
		return nil, err
	}
	res.MemAfter = readMem()

	// 6. Stop, finishing what is in flight.
	stopRun()
	if err := r.stopped(ctx, done, s, cfg, res); err != nil {
		return nil, err
	}

	// 7. Verify, and measure the output stream's dedupe map.
	if err := r.check(ctx, kind, hjs, n, res, s); err != nil {
		return nil, err
	}
	if !r.f.keep {
		_ = os.RemoveAll(cfg.State.DataDir)
	}
	return res, nil
}

// stopped waits until the system under test, told to stop, has finished
// what was in flight (done gives its run's error), then measures the
// stage.
func (r *runner) stopped(ctx context.Context, done <-chan error, s *sut, cfg config.Config, res *Result) error {
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("run: %w", err)
		}
	case <-time.After(time.Minute):
		return errors.New("pipeline did not stop within 1m")
	}
	if s.st == nil {
		return nil
	}
	return r.measureStage(ctx, res, s, cfg)
}

// check verifies the output against the ground truth, and the latency,
// then measures the heap held by the output stream's dedupe map (not for
// the stage's configurations).
func (r *runner) check(ctx context.Context, kind Kind, hjs jetstream.JetStream, n streamNames, res *Result, s *sut) error {
	if err := r.verify(ctx, kind, hjs, n, res, s); err != nil {
		return err
	}
	if s.loopStats != nil {
		if n := s.loopStats.PublishErrors.Load(); n > 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("%d forwards failed (PubAck timeout or error) and were retried", n))
		}
	}
	if kind.isStage() {
		return nil
	}
	return r.dedupeHeap(ctx, kind, hjs, n, res)
}

// publishBacklog creates the input stream and publishes the backlog into
// it: it returns the publisher and the stream's last and first sequence.
func (r *runner) publishBacklog(ctx context.Context, kind Kind, hnc *nats.Conn, hjs jetstream.JetStream, n streamNames, res *Result) (*publisher, uint64, uint64, error) {
	in, err := hjs.CreateStream(ctx, jetstream.StreamConfig{Name: n.input, Subjects: []string{"in." + n.token + ".>"}, Storage: jetstream.FileStorage})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("create input stream: %w", err)
	}
	pub, err := newPublisher(hnc, n.inSubject, r.f.keyMode)
	if err != nil {
		return nil, 0, 0, err
	}
	prog := startProgress(string(kind)+" publish backlog", uint64(len(r.thr.Main)), r.f.progressEvery, nil)
	pubTook, err := pub.publish(ctx, r.thr, r.thr.Main, 0, prog)
	prog.end()
	if err != nil {
		return nil, 0, 0, err
	}
	res.PublishSeconds = pubTook.Seconds()
	info, err := in.Info(ctx)
	if err != nil {
		return nil, 0, 0, err
	}
	if info.State.Msgs != uint64(len(r.thr.Main)) {
		return nil, 0, 0, fmt.Errorf("input stream holds %d messages, published %d", info.State.Msgs, len(r.thr.Main))
	}
	return pub, info.State.LastSeq, info.State.FirstSeq, nil
}

// timeDrain starts the system under test (start runs it in a goroutine)
// and times its drain of the backlog, up to sequence last. The stage's
// clock follows the ack floor through the intended times of the main
// phase.
func (r *runner) timeDrain(ctx context.Context, kind Kind, s *sut, hjs jetstream.JetStream, n streamNames, last, firstSeq uint64, res *Result, start func()) error {
	forwarded := func() uint64 {
		if si, err := hjs.Stream(ctx, n.output); err == nil {
			return si.CachedInfo().State.Msgs
		}
		return 0
	}
	resetPeak()
	stopProfile := r.startProfile(kind)
	cpu0 := readCPU()
	t0 := time.Now()
	go start()
	prog := startProgress(string(kind)+" drain", uint64(len(r.thr.Main)), r.f.progressEvery, forwarded)
	err := waitDrained(ctx, s.cons, last, r.f.pollEvery, r.f.timeout, func(ci *jetstream.ConsumerInfo) {
		if s.clock != nil {
			r.driveClock(s.clock, ci, firstSeq)
		}
		prog.done.Store(ci.AckFloor.Stream - (firstSeq - 1))
	})
	drain := time.Since(t0)
	res.DrainCPU = cpuSince(cpu0)
	prog.end()
	stopProfile()
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	res.DrainSeconds = drain.Seconds()
	res.EventsPerSec = float64(len(r.thr.Main)) / drain.Seconds()
	res.CPUMicrosPerEvent = res.DrainCPU.Seconds * 1e6 / float64(len(r.thr.Main))
	fmt.Fprintf(logOut, "  %s: drained %d events in %v: %.0f events/s, %.1f CPU µs/event (this process %.2f cores, other processes %.2f cores, iowait %.2f)\n",
		kind, len(r.thr.Main), drain.Round(time.Millisecond), res.EventsPerSec, res.CPUMicrosPerEvent, res.DrainCPU.Cores, res.DrainCPU.OtherCores, res.DrainCPU.IOWaitCores)
	return nil
}

// latencyPhase publishes the paced latency phase while the pipeline runs
// (the input's last sequence was last) and waits until it is drained.
func (r *runner) latencyPhase(ctx context.Context, kind Kind, s *sut, pub *publisher, last uint64, res *Result) error {
	if r.latRate == 0 {
		r.latRate = r.f.latencyLoad * res.EventsPerSec
	}
	res.Latency.RatePerSec = r.latRate
	res.Latency.Events = len(r.lat.Main)
	if len(r.lat.Main) == 0 {
		return nil
	}
	prog := startProgress(string(kind)+" latency phase", uint64(len(r.lat.Main)), r.f.progressEvery, nil)
	_, err := pub.publish(ctx, r.lat, r.lat.Main, r.latRate, prog)
	prog.end()
	if err != nil {
		return fmt.Errorf("latency phase: %w", err)
	}
	last += uint64(len(r.lat.Main))
	if err := waitDrained(ctx, s.cons, last, r.f.pollEvery, r.f.timeout, nil); err != nil {
		return fmt.Errorf("latency phase drain: %w", err)
	}
	return nil
}

// dedupeHeap measures the heap held by the output stream's dedupe map,
// when the server runs in this process.
func (r *runner) dedupeHeap(ctx context.Context, kind Kind, hjs jetstream.JetStream, n streamNames, res *Result) error {
	if !r.nats.embedded() {
		res.Notes = append(res.Notes, "nats-server heap not measured: the server is not in this process (--nats-url)")
		return nil
	}
	h, err := serverDedupeHeap(ctx, hjs, n.output)
	if err != nil {
		return err
	}
	res.DedupeHeapBytes = h
	if kind == KindJetStream {
		res.TrackedKeys = r.thr.Keys + r.lat.Keys
		res.RAMPerKey = float64(h) / float64(res.TrackedKeys)
	}
	return nil
}

// lateWidth is the widest spread of target times in one late group, as a
// fraction of W: a copy is judged at most this much younger than intended.
const lateWidth = 0.01

// runLate publishes the late copies and waits until they are judged. For
// the stage it reads the first-seen time the store recorded for each key
// concerned, groups the copies by target time (first seen + intended
// age), and for each group stops the clock at the group's time, publishes
// the group and waits for it to be acknowledged: every copy is judged at a
// known age, so the ground truth is exact. The loops get the copies in one
// go. It returns the input stream's last sequence.
func (r *runner) runLate(ctx context.Context, kind Kind, s *sut, pub *publisher, last uint64, res *Result) (uint64, error) {
	if len(r.thr.Late) == 0 {
		if s.st != nil {
			s.forwards = slicesRepeat(1, r.thr.Keys)
		}
		return last, nil
	}
	if s.st == nil {
		if _, err := pub.publish(ctx, r.thr, r.thr.Late, 0, startProgress("", 0, 0, nil)); err != nil {
			return last, err
		}
		last += uint64(len(r.thr.Late))
		return last, waitDrained(ctx, s.cons, last, r.f.pollEvery, r.f.timeout, nil)
	}
	end := r.t0.Add(r.thr.Span)
	if end.After(s.clock.Now()) {
		s.clock.Set(end)
	}
	s.windowStart = make(map[int32]time.Time)
	firstSeen := make(map[int32]time.Time)
	for _, e := range r.thr.Late {
		if _, ok := s.windowStart[e.Key]; ok {
			continue
		}
		rec, _, found, err := s.st.Store().Find([]byte(r.thr.Key(int(e.Key))))
		if err != nil {
			return last, err
		}
		if !found {
			return last, fmt.Errorf("key %s was not recorded in the main phase", r.thr.Key(int(e.Key)))
		}
		// With refresh, the main phase's repeats moved the window at the
		// lagging clock: the store has where they moved it to.
		firstSeen[e.Key], s.windowStart[e.Key] = rec.FirstSeen, rec.WindowStart()
	}
	groups := GroupLate(r.thr, func(k int32) time.Time { return firstSeen[k] }, time.Duration(lateWidth*float64(r.thr.W)), s.clock.Now())
	res.LateGroups = len(groups)
	prog := startProgress(string(kind)+" late copies", uint64(len(r.thr.Late)), r.f.progressEvery, nil)
	defer prog.end()
	sent := 0
	for _, g := range groups {
		s.clock.Set(g.At)
		if _, err := pub.publish(ctx, r.thr, g.Events, 0, startProgress("", 0, 0, nil)); err != nil {
			return last, err
		}
		last += uint64(len(g.Events))
		if err := waitDrained(ctx, s.cons, last, time.Millisecond, r.f.timeout, nil); err != nil {
			return last, err
		}
		sent += len(g.Events)
		prog.done.Store(uint64(sent))
	}
	s.forwards = slicesRepeat(1, r.thr.Keys)
	res.ForwardedAgain, res.NearExpected = JudgeLate(groups, r.thr.W, r.nearFraction(), kind == KindStageRefresh, s.windowStart, s.forwards)
	return last, nil
}

func (r *runner) nearFraction() float64 { return config.Default().Window.NearFraction }

func slicesRepeat(v uint8, n int) []uint8 {
	s := make([]uint8, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// build creates the system under test for kind, not yet running.
func (r *runner) build(ctx context.Context, kind Kind, cfg config.Config, n streamNames, hjs jetstream.JetStream, snc *nats.Conn, res *Result) (*sut, error) {
	if kind.isStage() {
		s := &sut{reg: prometheus.NewRegistry(), clock: window.NewManualClock(r.t0.Add(r.thr.Main[0].At))}
		start := time.Now()
		st, err := stage.New(ctx, stage.Options{Config: cfg, Conn: snc, Registry: s.reg, Logger: r.log, Clock: s.clock})
		if err != nil {
			return nil, fmt.Errorf("stage.New: %w", err)
		}
		res.Startup.EmptyMs = ms(time.Since(start))
		res.Notes = append(res.Notes, "output.publish: "+cfg.Output.Publish)
		s.st = st
		s.run = st.Run
		if s.cons, err = hjs.Consumer(ctx, n.input, cfg.Input.Consumer); err != nil {
			st.Close()
			return nil, err
		}
		return s, nil
	}
	dup := time.Duration(0) // JetStream's default (2m); raw forwards carry no id
	if kind == KindJetStream {
		dup = r.thr.W
	}
	if _, err := hjs.CreateStream(ctx, jetstream.StreamConfig{Name: n.output, Subjects: []string{n.outPrefix + ".>"}, Storage: jetstream.FileStorage, Duplicates: dup,
		AllowAtomicPublish: kind == KindRawAtomic}); err != nil {
		return nil, fmt.Errorf("create output stream: %w", err)
	}
	if _, err := hjs.CreateOrUpdateConsumer(ctx, n.input, consumerConfig(cfg.Input)); err != nil {
		return nil, fmt.Errorf("create consumer: %w", err)
	}
	sjs, err := jetstream.New(snc,
		jetstream.WithPublishAsyncMaxPending(cfg.Pipeline.MaxPublishInFlight),
		jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		return nil, err
	}
	cons, err := sjs.Consumer(ctx, n.input, cfg.Input.Consumer)
	if err != nil {
		return nil, err
	}
	s := &sut{loopStats: &loop.Stats{}}
	if s.cons, err = hjs.Consumer(ctx, n.input, cfg.Input.Consumer); err != nil {
		return nil, err
	}
	prefix := n.outPrefix + "."
	lo := loop.DefaultOptions(cons, sjs, func(in string) string { return prefix + in })
	lo.Workers = cfg.State.Partitions
	lo.BatchSize = cfg.Pipeline.BatchSize
	lo.Linger = cfg.Pipeline.BatchLinger.D()
	lo.PullMax = min(cfg.Input.MaxAckPending, max(cfg.Pipeline.BatchSize*cfg.State.Partitions, 256))
	// Both loops route by key, as the stage routes keys to partitions;
	// jetstream carries it as Nats-Msg-Id.
	kf, err := keys.NewKeyFunc(cfg.Key)
	if err != nil {
		return nil, err
	}
	lo.Key = func(m jetstream.Msg) (string, error) {
		k, err := kf.Key(m.Subject(), m.Headers(), m.Data())
		return string(k), err
	}
	lo.KeyAsMsgID = kind == KindJetStream
	lo.Atomic = kind == KindRawAtomic
	lo.BatchMax, lo.MaxBatchesInFlight = cfg.Output.BatchMax, cfg.Output.MaxBatchesInFlight
	s.run = func(ctx context.Context) error { return loop.Run(ctx, lo, s.loopStats) }
	return s, nil
}

// driveClock sets the stage's clock to the intended time of the oldest
// main-phase event not yet acknowledged (the event after the ack floor).
// Every event the stage is judging is at or after it, so the clock never
// runs ahead of an event; it lags by the events in flight.
func (r *runner) driveClock(c *window.ManualClock, ci *jetstream.ConsumerInfo, firstSeq uint64) {
	idx := int(ci.AckFloor.Stream - (firstSeq - 1)) // index of the oldest unacked event
	t := r.t0.Add(r.thr.Span)
	if idx < len(r.thr.Main) {
		t = r.t0.Add(r.thr.Main[idx].At)
	}
	if t.After(c.Now()) {
		c.Set(t)
	}
}

func (r *runner) startProfile(kind Kind) func() {
	if r.f.cpuprofile == "" {
		return func() {}
	}
	path := r.f.cpuprofile + "-" + string(kind) + ".pprof"
	if r.f.rounds > 1 {
		path = fmt.Sprintf("%s-%s-round%d.pprof", r.f.cpuprofile, kind, r.round)
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(logOut, "warning: cpuprofile: %v\n", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(logOut, "warning: cpuprofile: %v\n", err)
		f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		fmt.Fprintf(logOut, "  cpu profile of the drain: %s\n", path)
	}
}

// measureStage reads the store's counters, the clock lag, the heap the
// store holds, its disk use, and the start-up time with the keys in state
// (from the snapshot, then rebuilt from a full scan). It closes s.st.
func (r *runner) measureStage(ctx context.Context, res *Result, s *sut, cfg config.Config) error {
	st := s.st
	stats := st.Store().Stats()
	total := float64(r.thr.Events() + len(r.lat.Main))
	res.Lookups, res.StoreReads, res.FalsePositives = stats.Lookups, stats.StoreReads+stats.ClaimStoreReads, stats.FalsePositives
	res.StoreReadsPerEvent = float64(stats.StoreReads+stats.ClaimStoreReads) / total
	if stats.Lookups > 0 && cfg.Filter.Enabled {
		res.SkipRatio = float64(stats.FilterNegatives) / float64(stats.Lookups)
	}
	if absent := stats.FilterNegatives + stats.FalsePositives; absent > 0 && cfg.Filter.Enabled {
		res.FalsePositiveRate = float64(stats.FalsePositives) / float64(absent)
	}
	res.EstimatedFPRate = stats.FilterEstimatedFP
	res.FilterBytes = stats.FilterBytes
	res.NearWindowEnd = counterSum(s.reg, "dedupe_repeats_near_window_end_total", nil)
	res.Stage = stageInternals(s.reg)
	res.TrackedKeys = r.thr.Keys + r.lat.Keys

	// The late copies forwarded again (or, with refresh, repeated) must
	// have moved their key's window start to the group's clock; the
	// others keep theirs.
	mismatch := 0
	for k, want := range s.windowStart {
		rec, _, found, err := st.Store().Find([]byte(r.thr.Key(int(k))))
		if err != nil || !found || !rec.WindowStart().Equal(want) {
			mismatch++
		}
	}
	if mismatch > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d of %d late keys have another window start than the ground truth", mismatch, len(s.windowStart)))
	}
	// Clock lag of the drain, on keys the late phase did not touch.
	step := max(1, r.thr.Keys/max(1, r.f.lagSample))
	var maxLag time.Duration
	for i := 0; i < r.thr.Keys; i += step {
		if _, late := s.windowStart[int32(i)]; late {
			continue
		}
		rec, _, found, err := st.Store().Find([]byte(r.thr.Key(i)))
		if err != nil || !found {
			continue // verify reports it as lost
		}
		lag := r.t0.Add(r.thr.First[i]).Sub(rec.FirstSeen)
		maxLag = max(maxLag, lag, -lag)
		res.ClockLagSample++
	}
	res.ClockLagMaxW = float64(maxLag) / float64(r.thr.W)

	open := readMem()
	if err := st.Close(); err != nil {
		return fmt.Errorf("close stage: %w", err)
	}
	closed := readMem()
	res.DedupeHeapBytes = open.Heap - closed.Heap
	res.RAMPerKey = float64(res.DedupeHeapBytes) / float64(res.TrackedKeys)
	res.DiskBytes, res.DiskApparent = diskUsage(cfg.State.Dir())
	res.DiskPerKey = float64(res.DiskBytes) / float64(res.TrackedKeys)
	res.Startup.KeysInState = res.TrackedKeys
	return r.restarts(ctx, res, s, cfg)
}

// restarts times stage.New on the filled state: from the snapshots, then
// with the snapshots removed (full rebuild). Without a filter there is one
// start-up (Badger open).
func (r *runner) restarts(ctx context.Context, res *Result, s *sut, cfg config.Config) error {
	nc, err := r.nats.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	open := func() (time.Duration, uint64, uint64, error) {
		start := time.Now()
		// The rebuild is deliberate: its warnings about missing snapshots
		// are not shown.
		st, err := stage.New(ctx, stage.Options{Config: cfg, Conn: nc, Registry: prometheus.NewRegistry(),
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Clock: s.clock})
		if err != nil {
			return 0, 0, 0, fmt.Errorf("restart: %w", err)
		}
		took := time.Since(start)
		var scanned, added uint64
		for i := range st.Store().Partitions() {
			b := st.Store().Partition(i).FilterBuild()
			scanned += b.Scanned
			added += b.Added
		}
		return took, scanned, added, st.Close()
	}
	took, _, _, err := open()
	if err != nil {
		return err
	}
	res.Startup.SnapshotMs = ms(took)
	if !cfg.Filter.Enabled {
		return nil
	}
	for i := range cfg.State.Partitions {
		p := filepath.Join(state.PartitionDir(cfg.State.Dir(), i), state.SnapshotFile)
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("remove snapshot: %w", err)
		}
	}
	took, scanned, added, err := open()
	if err != nil {
		return err
	}
	res.Startup.RebuildMs = ms(took)
	res.Startup.Scanned, res.Startup.Added = scanned, added
	return nil
}

// serverDedupeHeap measures the nats-server heap held by stream's dedupe
// map: purge the stream (its messages and their caches go, the map of
// recent ids stays: JetStream keeps ids for the whole duplicate window),
// measure the heap, delete the stream, measure again.
func serverDedupeHeap(ctx context.Context, js jetstream.JetStream, stream string) (int64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	if err := s.Purge(ctx); err != nil {
		return 0, fmt.Errorf("purge %s: %w", stream, err)
	}
	time.Sleep(200 * time.Millisecond)
	before := readMem()
	if err := js.DeleteStream(ctx, stream); err != nil {
		return 0, fmt.Errorf("delete %s: %w", stream, err)
	}
	time.Sleep(200 * time.Millisecond)
	after := readMem()
	return before.Heap - after.Heap, nil
}

// StageInternals summarise the stage's batch histograms.
type StageInternals struct {
	Batches       uint64  `json:"batches"`
	MeanBatchSize float64 `json:"mean_batch_size"`
	// Publish is a batch's publish of its new messages until every PubAck;
	// Commit is its state commit (one Badger transaction, fsynced with
	// state.sync_writes).
	PublishMeanMs float64 `json:"publish_mean_ms"`
	PublishP99Ms  float64 `json:"publish_p99_ms"`
	CommitMeanMs  float64 `json:"commit_mean_ms"`
	CommitP99Ms   float64 `json:"commit_p99_ms"`
	Commits       uint64  `json:"commits"`
}

func stageInternals(g prometheus.Gatherer) *StageInternals {
	si := &StageInternals{}
	if c, sum, _ := histogram(g, "dedupe_batch_messages", 0); c > 0 {
		si.Batches, si.MeanBatchSize = c, sum/float64(c)
	}
	if c, sum, p99 := histogram(g, "dedupe_publish_seconds", 0.99); c > 0 {
		si.PublishMeanMs, si.PublishP99Ms = 1000*sum/float64(c), 1000*p99
	}
	if c, sum, p99 := histogram(g, "dedupe_commit_seconds", 0.99); c > 0 {
		si.Commits, si.CommitMeanMs, si.CommitP99Ms = c, 1000*sum/float64(c), 1000*p99
	}
	return si
}

// histogram returns the count and sum of histogram name and the upper
// bound of the bucket holding quantile q (0: not computed).
func histogram(g prometheus.Gatherer, name string, q float64) (count uint64, sum, quantile float64) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, 0, 0
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			count, sum = h.GetSampleCount(), h.GetSampleSum()
			if q > 0 && count > 0 {
				want := q * float64(count)
				for _, b := range h.GetBucket() {
					if float64(b.GetCumulativeCount()) >= want {
						quantile = b.GetUpperBound()
						break
					}
				}
			}
			return count, sum, quantile
		}
	}
	return 0, 0, 0
}

// counterSum sums the values of the counter name whose labels include
// want.
func counterSum(g prometheus.Gatherer, name string, want map[string]string) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || (lp.GetName() == k && lp.GetValue() == v)
				}
				if !found {
					continue metrics
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// warnLogger logs warnings and errors to w.
func warnLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// publishMode is the stage's output.publish: --publish, where auto decides
// as dedupe-stage run would with this server. The harness's in-process
// server stands for run's embedded one (the stage reaches it by URL, which
// auto would otherwise read as an external server of unknown syncing).
func (r *runner) publishMode(cfg config.Config) string {
	if r.f.publish != config.PublishAuto || !r.nats.embedded() {
		return r.f.publish
	}
	run := cfg
	run.NATS.URL = ""
	if atomic, _ := run.PublishAtomic(true); atomic {
		return config.PublishAtomic
	}
	return config.PublishAsync
}
