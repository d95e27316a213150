package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/bench/loop"
	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/stage"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// Result is what one configuration measured (bench/README.md, "compare",
// says how each figure is taken).
type Result struct {
	Config      string `json:"config"`
	Description string `json:"description"`
	Round       int    `json:"round"`
	// Events is the timed backlog; LateEvents the near and past copies
	// judged after it in LateGroups groups at known clock readings.
	Events, LateEvents, LateGroups int
	PublishSeconds                 float64 `json:"publish_seconds"`
	DrainSeconds                   float64 `json:"drain_seconds"`
	EventsPerSec                   float64 `json:"events_per_sec"`
	// AllRounds holds the events/s of every round of this configuration.
	AllRounds         []float64       `json:"events_per_sec_all_rounds,omitempty"`
	DrainCPU          CPUUse          `json:"drain_cpu"`
	CPUMicrosPerEvent float64         `json:"cpu_us_per_event"`
	Stage             *StageInternals `json:"stage_internals,omitempty"`
	Latency           Latency         `json:"latency"`
	// MemAfter is after all phases with the pipeline still open; its
	// PeakRSS is the peak since the drain started.
	MemAfter MemSnap `json:"mem_after"`
	// DedupeHeapBytes is the Go heap of the dedupe memory: the stage's
	// store, or the nats-server's output dedupe map (raw: the control).
	TrackedKeys     int     `json:"tracked_keys"`
	DedupeHeapBytes int64   `json:"dedupe_heap_bytes"`
	RAMPerKey       float64 `json:"ram_bytes_per_key"`
	FilterBytes     uint64  `json:"filter_bytes"`
	DiskBytes       int64   `json:"disk_bytes"`
	DiskPerKey      float64 `json:"disk_bytes_per_key"`
	// The store's counters (stage only), over all phases.
	StoreReadsPerEvent, SkipRatio, FalsePositiveRate, EstimatedFPRate float64
	// NearWindowEnd is the stage's count of repeats caught near the
	// window's end; NearExpected and ForwardedAgain (copies past W) the
	// ground truth's.
	NearWindowEnd  float64
	NearExpected   int
	ForwardedAgain int
	StartupMs      float64  `json:"startup_empty_ms"`
	Correctness    Correct  `json:"correctness"`
	Notes          []string `json:"notes,omitempty"`
}

// Latency is the producer's publish (Bench-Sent) to the server storing the
// forwarded copy, over the forwarded events of the paced latency phase.
type Latency struct {
	Events, Forwarded                       int
	RatePerSec, P50ms, P99ms, P999ms, MaxMs float64
}

// Correct compares the output with the ground truth: forwards Expected,
// messages in the output, forwards its own window dropped (DroppedByOutput),
// Lost, Duplicated, Redelivered (raw only: redelivered and so forwarded
// again, the baseline's nature) and DeadLettered.
type Correct struct {
	Expected, Output, DroppedByOutput, Lost, Duplicated, Redelivered, DeadLettered int
	OK                                                                             bool
}

// runner runs the configurations against one server and workload.
type runner struct {
	f        *flags
	nats     *natsEnv
	thr, lat *Workload // the backlog (main and late phases) and the latency phase
	t0       time.Time // the stage clock's start
	latRate  float64
	round    int // the round running, from 1
}

// stageConfig returns the stage configuration of kind: the bench's
// streams on the in-process server (f.stageConfig), the key source, and
// the filter on or off.
func (r *runner) stageConfig(kind Kind) config.Config {
	n := namesFor(kind)
	nc := r.nats.cfg
	if r.nats.srv != nil {
		nc.URL = r.nats.srv.ClientURL()
	}
	cfg := r.f.stageConfig(nc, n, kind == KindStageRefresh, r.thr.Keys+r.lat.Keys)
	cfg.Input.Subjects, cfg.Input.Consumer = []string{"in." + n.token + ".>"}, "bench-"+n.token
	cfg.Key = r.keyConfig()
	cfg.State.DataDir = filepath.Join(r.f.workDir, string(kind))
	cfg.Filter.Enabled = kind.filtered()
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
	_, what := kind.info()
	res := &Result{Config: string(kind), Description: what, Events: len(r.thr.Main), LateEvents: len(r.thr.Late)}
	fmt.Fprintf(logOut, "== %s: %s\n", kind, what)

	hnc, err := r.nats.connect()
	if err != nil {
		return nil, err
	}
	defer hnc.Close()
	hjs, err := jetstream.New(hnc)
	if err != nil {
		return nil, err
	}
	deleteStreams(hjs, n.input, n.output, n.dlq)
	if !r.f.keep {
		defer deleteStreams(hjs, n.input, n.output, n.dlq)
	}
	// 1. The backlog.
	pub, last, firstSeq, err := r.publishBacklog(ctx, kind, hnc, hjs, n, res)
	if err != nil {
		return nil, err
	}

	// 2. The system under test.
	cfg := r.stageConfig(kind)
	snc, err := r.nats.connect()
	if err != nil {
		return nil, err
	}
	defer snc.Close()
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
	// The heap held by the output stream's dedupe map (raw: the control).
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

// publishBacklog creates the input stream and publishes the backlog into
// it: it returns the publisher and the stream's last and first sequence.
func (r *runner) publishBacklog(ctx context.Context, kind Kind, hnc *nats.Conn, hjs jetstream.JetStream, n streamNames, res *Result) (*publisher, uint64, uint64, error) {
	in, err := hjs.CreateStream(ctx, jetstream.StreamConfig{Name: n.input, Subjects: []string{"in." + n.token + ".>"}, Storage: jetstream.FileStorage})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("create input stream: %w", err)
	}
	pjs, err := jetstream.New(hnc, jetstream.WithPublishAsyncMaxPending(4096), jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		return nil, 0, 0, err
	}
	pub := &publisher{js: pjs, subject: "in." + n.token + ".orders", keyMode: r.f.keyMode}
	prog := startProgress(string(kind)+" publish backlog", uint64(len(r.thr.Main)), r.f.progressDur, nil)
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
	prog := startProgress(string(kind)+" drain", uint64(len(r.thr.Main)), r.f.progressDur, forwarded)
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
	prog := startProgress(string(kind)+" latency phase", uint64(len(r.lat.Main)), r.f.progressDur, nil)
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
			s.forwards = slices.Repeat([]uint8{1}, r.thr.Keys)
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
	prog := startProgress(string(kind)+" late copies", uint64(len(r.thr.Late)), r.f.progressDur, nil)
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
	s.forwards = slices.Repeat([]uint8{1}, r.thr.Keys)
	res.ForwardedAgain, res.NearExpected = JudgeLate(groups, r.thr.W, config.Default().Window.NearFraction, kind == KindStageRefresh, s.windowStart, s.forwards)
	return last, nil
}

// build creates the system under test for kind, not yet running.
func (r *runner) build(ctx context.Context, kind Kind, cfg config.Config, n streamNames, hjs jetstream.JetStream, snc *nats.Conn, res *Result) (*sut, error) {
	if kind.isStage() {
		s := &sut{reg: prometheus.NewRegistry(), clock: window.NewManualClock(r.t0.Add(r.thr.Main[0].At))}
		start := time.Now()
		// The workload's times are intended, not the input's stored
		// times: each message is judged at the clock's reading, which
		// follows them (driveClock, runLate).
		inputTime := func(jetstream.Msg, time.Time) time.Time { return s.clock.Now() }
		st, err := stage.New(ctx, stage.Options{Config: cfg, Conn: snc, Registry: s.reg, Logger: warnLogger(), Clock: s.clock, InputTime: inputTime})
		if err != nil {
			return nil, fmt.Errorf("stage.New: %w", err)
		}
		res.StartupMs = ms(time.Since(start))
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
		AllowAtomicPublish: kind == KindRawAtomic, AllowBatchPublish: kind == KindRawFast}); err != nil {
		return nil, fmt.Errorf("create output stream: %w", err)
	}
	if _, err := hjs.CreateOrUpdateConsumer(ctx, n.input, stage.ConsumerToCreate(cfg.Input)); err != nil {
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
	lo.Atomic, lo.Fast = kind == KindRawAtomic, kind == KindRawFast
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

// measureStage reads the store's counters and metrics, checks the late
// keys' window starts, and measures the heap the store holds and its disk
// use. It closes s.st.
func (r *runner) measureStage(ctx context.Context, res *Result, s *sut, cfg config.Config) error {
	st := s.st
	stats := st.Store().Stats()
	total := float64(r.thr.Events() + len(r.lat.Main))
	res.StoreReadsPerEvent = float64(stats.StoreReads+stats.ClaimStoreReads) / total
	if stats.Lookups > 0 && cfg.Filter.Enabled {
		res.SkipRatio = float64(stats.FilterNegatives) / float64(stats.Lookups)
	}
	if absent := stats.FilterNegatives + stats.FalsePositives; absent > 0 && cfg.Filter.Enabled {
		res.FalsePositiveRate = float64(stats.FalsePositives) / float64(absent)
	}
	res.EstimatedFPRate = stats.FilterEstimatedFP
	res.FilterBytes = stats.FilterBytes
	res.NearWindowEnd = gathered(s.reg).Sum("dedupe_repeats_near_window_end_total", nil)
	si := stageInternals(gathered(s.reg))
	res.Stage = &si
	res.TrackedKeys = r.thr.Keys + r.lat.Keys

	// The late copies forwarded again (or, with refresh, repeated) must
	// have moved their key's window start to the group's clock.
	for k, want := range s.windowStart {
		if rec, _, found, err := st.Store().Find([]byte(r.thr.Key(int(k)))); err != nil || !found || !rec.WindowStart().Equal(want) {
			res.Notes = append(res.Notes, fmt.Sprintf("late key %d has another window start than the ground truth", k))
		}
	}
	open := readMem()
	if err := st.Close(); err != nil {
		return fmt.Errorf("close stage: %w", err)
	}
	closed := readMem()
	res.DedupeHeapBytes = open.Heap - closed.Heap
	res.RAMPerKey = float64(res.DedupeHeapBytes) / float64(res.TrackedKeys)
	res.DiskBytes, _ = diskUsage(cfg.State.Dir())
	res.DiskPerKey = float64(res.DiskBytes) / float64(res.TrackedKeys)
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
	Batches       float64 `json:"batches"`
	MeanBatchSize float64 `json:"mean_batch_size"`
	// NewPerBatch is the messages forwarded per batch (the output batch).
	NewPerBatch float64 `json:"new_per_batch"`
	// Publish is a batch's publish of its new messages until every PubAck;
	// Commit is its state commit (one Badger transaction, fsynced with
	// state.sync_writes): mean and the upper bound of the bucket holding
	// p99.
	PublishMeanMs float64 `json:"publish_mean_ms"`
	PublishP99Ms  float64 `json:"publish_p99_ms"`
	CommitMeanMs  float64 `json:"commit_mean_ms"`
	CommitP99Ms   float64 `json:"commit_p99_ms"`
}

// stageInternals reads the stage's histograms from its metrics.
func stageInternals(fs metrictest.Families) StageInternals {
	var si StageInternals
	if c, sum, _ := fs.Histogram("dedupe_batch_messages", 0); c > 0 {
		si.Batches, si.MeanBatchSize = c, sum/c
		si.NewPerBatch = fs.Sum("dedupe_messages_total", map[string]string{"outcome": "new"}) / c
	}
	if c, sum, p99 := fs.Histogram("dedupe_publish_seconds", 0.99); c > 0 {
		si.PublishMeanMs, si.PublishP99Ms = 1000*sum/c, 1000*p99
	}
	if c, sum, p99 := fs.Histogram("dedupe_commit_seconds", 0.99); c > 0 {
		si.CommitMeanMs, si.CommitP99Ms = 1000*sum/c, 1000*p99
	}
	return si
}

// gathered gathers the stage's registry (nothing when it cannot).
func gathered(g prometheus.Gatherer) metrictest.Families {
	fs, _ := metrictest.Gathered(g)
	return fs
}

// warnLogger logs warnings and errors to stderr.
func warnLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// publishMode is the stage's output.publish: --publish, where auto decides
// as dedupe-stage run would with this server. The harness's in-process
// server stands for run's embedded one (the stage reaches it by URL, which
// auto would otherwise read as an external server of unknown syncing).
func (r *runner) publishMode(cfg config.Config) string {
	if r.f.publish != config.PublishAuto {
		return r.f.publish
	}
	run := cfg
	run.NATS.URL = ""
	if atomic, _ := run.PublishAtomic(true); atomic {
		return config.PublishAtomic
	}
	return config.PublishAsync
}

// startProfile starts a CPU profile of kind's timed drain when --cpuprofile
// is set, and returns what stops it; a profile that cannot be written is a
// warning, not a failed run.
func (r *runner) startProfile(kind Kind) func() {
	if r.f.cpuProfile == "" {
		return func() {}
	}
	path := r.f.cpuProfile + "-" + string(kind) + ".pprof"
	if r.f.rounds > 1 {
		path = fmt.Sprintf("%s-%s-round%d.pprof", r.f.cpuProfile, kind, r.round)
	}
	f, err := os.Create(path) //nolint:gosec // the path is the operator's flag
	if err == nil {
		if err = pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
		}
	}
	if err != nil {
		fmt.Fprintf(logOut, "warning: cpuprofile: %v\n", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			fmt.Fprintf(logOut, "warning: cpuprofile: %v\n", err)
			return
		}
		fmt.Fprintf(logOut, "  cpu profile of the drain: %s\n", path)
	}
}
