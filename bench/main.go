// Command bench measures dedupe-stage against its peers on one workload, in
// one run, on one machine, and checks every configuration against the
// ground truth:
//
//  1. raw: a consume -> publish -> ack loop without dedupe (the ceiling);
//  2. jetstream: the same loop with Nats-Msg-Id = key into an output
//     stream whose duplicate window is W (JetStream's own dedupe);
//  3. stage-bloom: dedupe-stage with the Bloom pre-check;
//  4. stage-nofilter: dedupe-stage with the pre-check off;
//  5. stage-refresh (only when --configs names it): stage-bloom with
//     window.refresh_on_repeat, the sliding window.
//
// It prints a table, writes a JSON file and an SVG chart next to it, and
// exits non-zero when any configuration lost or duplicated an event. With
// --scale it also measures RAM, disk and start-up time of the state at
// millions of keys; --scaleout runs scale_out instead, as processes of the
// real binary on a 3-node cluster, optionally CPU-capped. See
// bench/README.md for the method.
//
//	go run ./bench --events 1000000 --repeat-ratio 0.1 --out bench-results/results.json
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// flags are the harness's options.
type flags struct {
	events, keys, burstSize, payloadSize int
	repeatRatio, spanFactor              float64
	ages, keyMode, configs               string
	seed                                 uint64
	window                               time.Duration

	rounds, warmup           int
	latencyEvents            int
	latencyRate, latencyLoad float64

	natsURL, dir         string
	syncAlways, keep     bool
	publish              string
	partitions           int
	syncWrites           bool
	out, cpuprofile      string
	memprofile           string
	timeout              time.Duration
	progressEvery        time.Duration
	pollEvery            time.Duration
	lagSample            int
	scale                string
	scaleTimeout         time.Duration
	scalePoint           int
	scaleDir             string
	scaleReopenAt        int64
	render               string
	mix                  Mix
	kinds                []Kind
	commandLine, workDir string

	// The scale-out mode (--scaleout).
	scaleOut               bool
	soRows, soInst, soCaps string
	soModes                []string
	soInstances            []int
	cpuCaps                []float64
	badRatio               float64
	replicas               int
	soAckWait, soWarmup    time.Duration
	soBundleMax            int

	// The hand-over mode (--handover).
	handOver                 bool
	hoKeys, hoPartitions     int
	hoCopies                 int
	hoAckWait, hoLoadTimeout time.Duration
	hoSnapshotInterval       time.Duration
	hoStop                   string // kill or term: how instance a is stopped
	stageEnv                 string // KEY=VALUE,... added to the environment of stage processes
}

func parseFlags(args []string) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	for _, define := range []func(*flag.FlagSet, *flags){defineWorkloadFlags, defineRunFlags, defineScaleFlags, defineScaleOutFlags, defineHandOverFlags} {
		define(fs, f)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if set["stage-env"] && !f.scaleOut && !f.handOver {
		return nil, errors.New("--stage-env applies to the stage processes of --scaleout and --handover")
	}
	for _, kv := range strings.Split(f.stageEnv, ",") {
		if k, _, ok := strings.Cut(kv, "="); f.stageEnv != "" && (!ok || k == "") {
			return nil, fmt.Errorf("--stage-env: %q, want KEY=VALUE", kv)
		}
	}
	if f.scaleOut {
		if err := scaleOutFlags(f, set); err != nil {
			return nil, err
		}
	}
	if f.handOver {
		if err := handOverFlags(f, set); err != nil {
			return nil, err
		}
	}
	var err error
	if f.mix, err = ParseMix(f.ages); err != nil {
		return nil, err
	}
	if f.kinds, err = parseKinds(f); err != nil {
		return nil, err
	}
	switch {
	case f.keyMode != "header" && f.keyMode != "json":
		return nil, fmt.Errorf("--key %q: want header or json", f.keyMode)
	case f.repeatRatio < 0 || f.repeatRatio >= 1:
		return nil, fmt.Errorf("--repeat-ratio %v: want 0 <= r < 1", f.repeatRatio)
	case f.spanFactor <= 0 || f.spanFactor >= 1:
		return nil, fmt.Errorf("--span-factor %v: want 0 < f < 1", f.spanFactor)
	case f.payloadSize < 64:
		return nil, fmt.Errorf("--payload-size %d: want >= 64 (the JSON envelope)", f.payloadSize)
	case f.rounds < 1:
		return nil, fmt.Errorf("--rounds %d: want >= 1", f.rounds)
	case f.publish != config.PublishAuto && f.publish != config.PublishAtomic && f.publish != config.PublishAsync:
		return nil, fmt.Errorf("--publish %q: want auto, atomic or async", f.publish)
	case f.partitions < 1:
		return nil, fmt.Errorf("--partitions %d: want >= 1", f.partitions)
	case len(f.kinds) == 0 && f.scale == "" && f.scalePoint == 0 && f.render == "" && !f.scaleOut && !f.handOver:
		return nil, errors.New("nothing to do: --configs is empty and --scale is not set")
	}
	f.commandLine = "go run ./bench " + strings.Join(args, " ")
	return f, nil
}

// defineWorkloadFlags defines the flags of the workload: events, keys, repeats and their ages, payloads.
func defineWorkloadFlags(fs *flag.FlagSet, f *flags) {
	fs.IntVar(&f.events, "events", 200_000, "events in the timed backlog")
	fs.IntVar(&f.keys, "keys", 0, "distinct keys in the backlog (cardinality); 0: from --repeat-ratio")
	fs.Float64Var(&f.repeatRatio, "repeat-ratio", 0.1, "share of events that are copies of an earlier key (used when --keys is 0)")
	fs.StringVar(&f.ages, "ages", "burst=0.2,immediate=0.3,seconds=0.3,near=0.1,past=0.1", "share of repeats per age class: burst (back to back), immediate (<=1s), seconds (2-60s), near (0.82-0.88W), past (1.12-1.2W, forwarded again)")
	fs.IntVar(&f.burstSize, "burst-size", 3, "extra copies in one burst")
	fs.IntVar(&f.payloadSize, "payload-size", 256, "payload bytes per event (a JSON object carrying the key as \"id\")")
	fs.Uint64Var(&f.seed, "seed", 1, "workload seed: the same seed and flags give the same events")
	fs.StringVar(&f.keyMode, "key", "header", "where the stage reads the key: header (Event-Id) or json (field id)")
	fs.Float64Var(&f.spanFactor, "span-factor", 0.9, "first copies spread over span-factor*W of logical time (0 < f < 1)")
	fs.DurationVar(&f.window, "window", 0, "dedupe window W; 0: the configuration default (1h10m)")
}

// defineRunFlags defines the flags of the configurations run, the server, the stage and the measurements.
func defineRunFlags(fs *flag.FlagSet, f *flags) {
	fs.StringVar(&f.configs, "configs", "raw,raw-atomic,jetstream,stage-bloom,stage-nofilter", "configurations to run, in order (stage-refresh, stage-bloom with window.refresh_on_repeat, is not in the default); empty with --scale runs only the scale mode")
	fs.IntVar(&f.rounds, "rounds", 1, "run every configuration this many times, interleaved, the order rotated each round (round 2 starts with the second configuration), and report each one's median round by events/s; with --scaleout, every row that many times, in rounds of all rows, with each round's ratios and their medians (at most 20)")
	fs.IntVar(&f.warmup, "warmup", 20_000, "events of an untimed warm-up run of the first configuration before the measured ones (0: none)")
	fs.IntVar(&f.latencyEvents, "latency-events", 20_000, "events of the paced latency phase after each drain (0: none)")
	fs.Float64Var(&f.latencyRate, "latency-rate", 0, "events/s of the latency phase; 0: --latency-load times the first configuration's drain rate")
	fs.Float64Var(&f.latencyLoad, "latency-load", 0.25, "latency phase rate as a share of the first configuration's events/s (with --latency-rate 0)")
	fs.StringVar(&f.natsURL, "nats-url", "", "use an existing nats-server instead of the embedded default (server heap is then not measured)")
	fs.BoolVar(&f.syncAlways, "sync-always", config.Default().NATS.Embedded.SyncAlways, "embedded server: fsync every JetStream write (the embedded default)")
	fs.StringVar(&f.publish, "publish", config.PublishAuto, "stage output.publish: auto (as dedupe-stage run decides: atomic batches on the embedded server with --sync-always, else async), atomic or async")
	fs.IntVar(&f.partitions, "partitions", config.Default().State.Partitions, "stage partitions (and loop workers)")
	fs.BoolVar(&f.syncWrites, "sync-writes", true, "stage: fsync each state commit (state.sync_writes; the bench sets it, where dedupe-stage run follows nats.embedded.sync_always when unset)")
	fs.StringVar(&f.dir, "dir", "", "scratch directory for JetStream and state; default a new temp dir, removed at the end")
	fs.BoolVar(&f.keep, "keep", false, "keep the scratch directory and streams")
	fs.StringVar(&f.out, "out", "results.json", "JSON results file; the SVG chart is written next to it (same name, .svg)")
	fs.StringVar(&f.cpuprofile, "cpuprofile", "", "write a CPU profile of each timed drain to PREFIX-<config>.pprof")
	fs.DurationVar(&f.timeout, "timeout", 20*time.Minute, "bound on each phase (publish, drain)")
	fs.DurationVar(&f.progressEvery, "progress", 2*time.Second, "progress line interval on stderr (0: none)")
	fs.DurationVar(&f.pollEvery, "poll", 5*time.Millisecond, "consumer poll interval (drain detection and the stage's clock)")
	fs.IntVar(&f.lagSample, "lag-sample", 20_000, "keys sampled to measure the stage clock's lag")
}

// defineScaleFlags defines the flags of the scale mode.
func defineScaleFlags(fs *flag.FlagSet, f *flags) {
	fs.StringVar(&f.scale, "scale", "", "comma-separated key counts (e.g. 1000000,10000000,50000000): state RAM, disk and start-up at N keys")
	fs.DurationVar(&f.scaleTimeout, "scale-timeout", 45*time.Minute, "bound on each scale point")
	fs.StringVar(&f.memprofile, "memprofile", "", "with --scale: write heap profiles of each scale point, right after the fill to PREFIX-<keys>-fill.pprof and after the reopen from snapshots to PREFIX-<keys>.pprof")
	fs.IntVar(&f.scalePoint, "scale-point", 0, "internal: measure one scale point in this process and print JSON")
	fs.StringVar(&f.scaleDir, "scale-dir", "", "internal: directory of the scale point")
	fs.Int64Var(&f.scaleReopenAt, "scale-reopen-at", 0, "internal: with --scale-point, only reopen the filled store at this clock time (Unix ns) and print JSON")
	fs.StringVar(&f.render, "render", "", "read a results JSON (for example one with scale points merged in), print its tables and write --out and its chart; run nothing")
}

// defineScaleOutFlags defines the flags of the scale-out mode.
func defineScaleOutFlags(fs *flag.FlagSet, f *flags) {
	fs.BoolVar(&f.scaleOut, "scaleout", false, "run the scale-out mode instead of --configs: a 3-node nats-server cluster, the stage as 1..N processes of the real binary (see bench/README.md)")
	fs.StringVar(&f.soRows, "scaleout-rows", "off,header,subject", "scale-out rows: off (scale_out off, one instance: the reference), header (scale_out on, key in a header: the route step runs), subject (scale_out on, key as a subject token); each followed by -refresh (subject-refresh) runs with window.refresh_on_repeat, right after the same row without it when both are given")
	fs.StringVar(&f.soInst, "scaleout-instances", "1,2,3", "scale-out: instance counts of the header and subject rows")
	fs.StringVar(&f.soCaps, "cpu-cap", "0,0.25", "scale-out: CPU cap per instance in cores (cgroup v1 cpu quota), one set of rows per value; 0: uncapped")
	fs.Float64Var(&f.badRatio, "bad-ratio", 0.01, "scale-out: share of the backlog's events without a usable key (dead-lettered once each)")
	fs.IntVar(&f.replicas, "replicas", 3, "scale-out: replicas of every stream (scale_out.replicas, and the reference's streams)")
	fs.DurationVar(&f.soAckWait, "scaleout-ack-wait", config.Default().Input.AckWait.D(), "scale-out: input.ack_wait of the instances (the pin's TTL)")
	fs.IntVar(&f.soBundleMax, "route-bundle-max", config.DefaultScaleOut().RouteBundleMax, "scale-out: scale_out.route_bundle_max of the instances (copies of one partition per routed message; 0: each alone)")
	fs.DurationVar(&f.soWarmup, "scaleout-warmup", 2*time.Minute, "scale-out: bound on the warm-up that waits for the instances to share the partitions")
}

// defineHandOverFlags defines the flags of the hand-over mode.
func defineHandOverFlags(fs *flag.FlagSet, f *flags) {
	fs.BoolVar(&f.handOver, "handover", false, "run the hand-over mode instead of --configs: a 3-node nats-server cluster, instance a loaded then killed, instance b with an empty data dir taking over (see bench/README.md)")
	fs.IntVar(&f.hoKeys, "handover-keys", 1_000_000, "hand-over: distinct keys loaded through instance a before the kill")
	fs.IntVar(&f.hoPartitions, "handover-partitions", 1, "hand-over: state.partitions of the group")
	fs.IntVar(&f.hoCopies, "handover-copies", 10_000, "hand-over: copies of loaded keys published through b after the hand-over (none may be forwarded)")
	fs.DurationVar(&f.hoAckWait, "handover-ack-wait", config.Default().Input.AckWait.D(), "hand-over: input.ack_wait of the instances (the pin's TTL)")
	fs.DurationVar(&f.hoSnapshotInterval, "handover-snapshot-interval", 30*time.Second, "hand-over: scale_out.snapshot_interval of the instances")
	fs.DurationVar(&f.hoLoadTimeout, "handover-load-timeout", 20*time.Minute, "hand-over: bound on loading the keys (publish and drain)")
	fs.StringVar(&f.stageEnv, "stage-env", "", "scale-out and hand-over: comma-separated KEY=VALUE pairs added to the environment of the stage processes only (e.g. GOMEMLIMIT=130MiB)")
	fs.StringVar(&f.hoStop, "handover-stop", "kill", "hand-over: how instance a stops: kill (SIGKILL, a crash: its partitions move after the pin's TTL) or term (SIGTERM, a planned stop: it finishes, gives back and unpins them)")
}

// parseKinds parses --configs, which the scale-out and hand-over modes
// ignore.
func parseKinds(f *flags) ([]Kind, error) {
	var kinds []Kind
	configs := f.configs
	if f.scaleOut || f.handOver {
		configs = ""
	}
	for c := range strings.SplitSeq(configs, ",") {
		c = strings.TrimSpace(c)
		if c == "" {
			continue
		}
		k := Kind(c)
		found := false
		for _, a := range allKinds {
			found = found || a == k
		}
		if !found {
			return nil, fmt.Errorf("--configs: unknown %q (want raw, raw-atomic, jetstream, stage-bloom, stage-nofilter, stage-refresh)", c)
		}
		kinds = append(kinds, k)
	}
	return kinds, nil
}

// Results is the JSON document the harness writes.
type Results struct {
	Command string    `json:"command"`
	Started time.Time `json:"started"`
	Machine Machine   `json:"machine"`
	// Settings name the server and state settings that shape the numbers.
	Settings string        `json:"settings"`
	Workload *WorkloadInfo `json:"workload,omitempty"`
	Results  []*Result     `json:"results,omitempty"`
	// AllRounds holds every round's result when --rounds > 1; Results
	// holds each configuration's median round.
	AllRounds []*Result     `json:"all_rounds,omitempty"`
	Headline  *Headline     `json:"headline,omitempty"`
	Scale     []*ScalePoint `json:"scale,omitempty"`
	ScaleOut  *ScaleOutRun  `json:"scale_out,omitempty"`
	HandOver  *HandOverRun  `json:"handover,omitempty"`
	Errors    []string      `json:"errors,omitempty"`
}

// WorkloadInfo describes the workload.
type WorkloadInfo struct {
	// Events is every event of the backlog: MainEvents (the timed drain)
	// plus LateEvents (near and past copies, judged after it).
	Events            int            `json:"events"`
	MainEvents        int            `json:"main_events"`
	LateEvents        int            `json:"late_events"`
	Keys              int            `json:"keys"`
	Repeats           int            `json:"repeats"`
	ByClass           map[string]int `json:"events_by_class"`
	Mix               string         `json:"mix"`
	BurstSize         int            `json:"burst_size"`
	PayloadBytes      int            `json:"payload_bytes"`
	KeyBytes          int            `json:"key_bytes"`
	KeySource         string         `json:"key_source"`
	Seed              uint64         `json:"seed"`
	Window            string         `json:"window"`
	Span              string         `json:"span"`
	FilterExpected    uint64         `json:"filter_expected_keys"`
	LatencyEvents     int            `json:"latency_events"`
	LatencyKeys       int            `json:"latency_keys"`
	LatencyRatePerSec float64        `json:"latency_rate_per_sec"`
}

// Headline holds the figures the project's targets are stated in.
type Headline struct {
	// StageVsRaw is stage-bloom events/s over raw events/s (target >= 0.9 without fsync).
	StageVsRaw float64 `json:"stage_bloom_vs_raw"`
	// NoFilterVsRaw is stage-nofilter events/s over raw events/s.
	NoFilterVsRaw float64 `json:"stage_nofilter_vs_raw"`
	// JetStreamVsRaw is jetstream events/s over raw events/s.
	JetStreamVsRaw float64 `json:"jetstream_vs_raw"`
	// StageVsRawAtomic is stage-bloom events/s over raw-atomic events/s
	// (issue 12's target with fsync always: >= 0.7).
	StageVsRawAtomic float64 `json:"stage_bloom_vs_raw_atomic,omitempty"`
	// StageVsJetStream is stage-bloom events/s over jetstream events/s
	// (issue 12's target with fsync always: >= 5).
	StageVsJetStream float64 `json:"stage_bloom_vs_jetstream,omitempty"`
	// RAMRatio is jetstream RAM per key over stage-bloom RAM per key at
	// this key count (target >= 40).
	RAMRatio float64 `json:"jetstream_over_stage_ram_per_key"`
	// RAMRatioMarginal uses the stage's marginal RAM per key from the
	// scale mode instead (0 without --scale).
	RAMRatioMarginal float64 `json:"jetstream_over_stage_marginal_ram_per_key,omitempty"`
	// RefreshVsBloom is stage-refresh events/s over stage-bloom events/s,
	// and RefreshCPUPerRepeat the CPU µs stage-refresh spent beyond
	// stage-bloom per repeat of the timed backlog (issue 43).
	RefreshVsBloom      float64 `json:"stage_refresh_vs_stage_bloom,omitempty"`
	RefreshCPUPerRepeat float64 `json:"stage_refresh_cpu_us_per_repeat,omitempty"`
	// AllCorrect is true when no configuration lost, duplicated or
	// dead-lettered anything.
	AllCorrect bool `json:"all_correct"`
}

func main() {
	os.Exit(realMain(os.Args[1:]))
}

func realMain(args []string) int {
	f, err := parseFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	if f.scalePoint > 0 && f.scaleReopenAt != 0 {
		return runScaleReopen(f)
	}
	if f.scalePoint > 0 {
		return runScalePoint(f)
	}
	if f.render != "" {
		return render(f)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	win, err := benchWindow(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: window:", err)
		return 2
	}

	dir := f.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "dedupe-bench-"); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		defer func() {
			if !f.keep {
				os.RemoveAll(dir)
			}
		}()
	}
	f.workDir = dir
	res := &Results{Command: f.commandLine, Started: time.Now().UTC(), Machine: probeMachine(dir), Settings: settings(f)}
	failed := false

	if len(f.kinds) > 0 {
		failed = runComparisonMode(ctx, f, win.W, dir, res)
	}
	if f.scaleOut {
		failed = runScaleOutMode(ctx, f, win.W, dir, res, failed) || failed
	}
	if f.handOver && ctx.Err() == nil {
		failed = runHandOverMode(ctx, f, dir, res) || failed
	}
	if f.scale != "" && ctx.Err() == nil {
		pts, err := runScale(ctx, f, dir)
		res.Scale = pts
		if err != nil {
			res.Errors = append(res.Errors, err.Error())
			fmt.Fprintln(os.Stderr, "bench: scale:", err)
			failed = true
		}
	}
	res.Headline = headline(res)
	printTables(os.Stdout, res)
	if res.HandOver != nil {
		printHandOver(os.Stdout, res.HandOver)
	}
	if err := writeOutputs(f.out, res); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		failed = true
	}
	if !reportCorrect(res) {
		failed = true
	}
	if failed {
		return 1
	}
	return 0
}

// benchWindow is the dedupe window of the run: the configuration's
// default, or --window.
func benchWindow(f *flags) (window.Window, error) {
	cfg := config.Default()
	if f.window > 0 {
		cfg.Window.Paths = []config.Path{{Name: "bench", Max: config.Duration(f.window)}}
		cfg.Window.Margin = 0
	}
	return cfg.Window.Derive()
}

// runComparisonMode runs --configs side by side into res and reports
// whether it failed.
func runComparisonMode(ctx context.Context, f *flags, w time.Duration, dir string, res *Results) bool {
	all, wi, err := runComparison(ctx, f, w, dir)
	res.Workload, res.Results = wi, medians(all, f.kinds)
	if f.rounds > 1 {
		res.AllRounds = all
	}
	if err != nil {
		res.Errors = append(res.Errors, err.Error())
		fmt.Fprintln(os.Stderr, "bench:", err)
		return true
	}
	return false
}

// runScaleOutMode runs --scaleout into res and reports whether it failed;
// failed says whether an earlier mode did (the scratch dir is then kept).
func runScaleOutMode(ctx context.Context, f *flags, w time.Duration, dir string, res *Results, failed bool) bool {
	so, err := runScaleOut(ctx, f, w, dir)
	res.ScaleOut = so
	if so != nil && so.Cluster != "" {
		res.Settings = so.Cluster
	}
	if err != nil {
		res.Errors = append(res.Errors, err.Error())
		fmt.Fprintln(os.Stderr, "bench: scale-out:", err)
		failed = true
	}
	if failed || !scaleOutCorrect(so) {
		// Keep the logs and configurations for a look.
		f.keep = true
		fmt.Fprintf(os.Stderr, "bench: scale-out: logs and configurations kept in %s\n", dir)
	}
	if so != nil {
		so.Kept = f.keep || f.dir != ""
	}
	return failed
}

// runHandOverMode runs --handover into res and reports whether it failed
// or its ground truth was violated.
func runHandOverMode(ctx context.Context, f *flags, dir string, res *Results) bool {
	ho, err := runHandOver(ctx, f, dir)
	res.HandOver = ho
	if ho != nil && ho.Cluster != "" {
		res.Settings = ho.Cluster
	}
	if err != nil {
		res.Errors = append(res.Errors, err.Error())
		fmt.Fprintln(os.Stderr, "bench: hand-over:", err)
	}
	if err != nil || ho == nil || !ho.OK {
		f.keep = true
		fmt.Fprintf(os.Stderr, "bench: hand-over failed or not correct; logs and configurations kept in %s\n", dir)
		return true
	}
	return false
}

// reportCorrect says on stderr which results are not correct, and reports
// whether all are.
func reportCorrect(res *Results) bool {
	ok := true
	checked := res.Results
	if len(res.AllRounds) > 0 {
		checked = res.AllRounds
	}
	if so := res.ScaleOut; so != nil {
		for _, r := range so.Rows {
			if c := r.Correct; !c.OK {
				fmt.Fprintf(os.Stderr, "bench: scale-out %s is not correct: lost %d, duplicated %d, bad inputs not dead-lettered %d, extra dead letters %d\n",
					r.Row, c.Lost, c.Duplicated, c.DeadLetterLost, c.DeadLetterExtra)
				ok = false
			}
		}
	}
	for _, r := range checked {
		if !r.Correctness.OK {
			fmt.Fprintf(os.Stderr, "bench: %s (round %d) is not correct: lost %d, duplicated %d, dead-lettered %d\n",
				r.Config, r.Round, r.Correctness.Lost, r.Correctness.Duplicated, r.Correctness.DeadLettered)
			ok = false
		}
	}
	return ok
}

// runComparison generates the workloads and runs the configurations side
// by side against one server.
func runComparison(ctx context.Context, f *flags, w time.Duration, dir string) ([]*Result, *WorkloadInfo, error) {
	keys := f.keys
	if keys == 0 {
		keys = int(math.Round(float64(f.events) * (1 - f.repeatRatio)))
	}
	span := time.Duration(f.spanFactor * float64(w))
	fmt.Fprintf(logOut, "generating %d events (%d keys), W %v, span %v\n", f.events, keys, w, span)
	thr, err := Generate(Spec{Prefix: "thr", Seed: f.seed, Events: f.events, Keys: keys, Mix: f.mix,
		BurstSize: f.burstSize, PayloadSize: f.payloadSize, W: w, Span: span})
	if err != nil {
		return nil, nil, fmt.Errorf("workload: %w", err)
	}
	// The latency phase: fresh keys, the same repeat share, only the
	// short ages (the stage's clock stands still meanwhile).
	latMix := f.mix
	latMix[ClassNear], latMix[ClassPast] = 0, 0
	if s := latMix[ClassBurst] + latMix[ClassImmediate] + latMix[ClassSeconds]; s > 0 {
		for c := range latMix {
			latMix[c] /= s
		}
	} else {
		latMix[ClassImmediate] = 1
	}
	latKeys := max(1, int(math.Round(float64(f.latencyEvents)*float64(keys)/float64(f.events))))
	lat := &Workload{Spec: Spec{Prefix: "lat", W: w}}
	if f.latencyEvents > 0 {
		if lat, err = Generate(Spec{Prefix: "lat", Seed: f.seed + 1, Events: f.latencyEvents, Keys: min(latKeys, f.latencyEvents), Mix: latMix,
			BurstSize: f.burstSize, PayloadSize: f.payloadSize, W: w, Span: 2 * time.Minute}); err != nil {
			return nil, nil, fmt.Errorf("latency workload: %w", err)
		}
	}

	env, err := startNATS(f.natsURL, filepath.Join(dir, "nats"), f.syncAlways, warnLogger(os.Stderr))
	if err != nil {
		return nil, nil, err
	}
	defer env.quit()
	r := &runner{f: f, nats: env, thr: thr, lat: lat, dir: dir, t0: time.Now().Truncate(time.Second),
		latRate: f.latencyRate, log: warnLogger(os.Stderr)}
	wi := &WorkloadInfo{
		Events: thr.Events(), MainEvents: len(thr.Main), LateEvents: len(thr.Late), Keys: thr.Keys, Repeats: thr.Events() - thr.Keys,
		ByClass: map[string]int{}, Mix: f.mix.String(), BurstSize: f.burstSize, PayloadBytes: f.payloadSize, KeyBytes: keyLen,
		KeySource: f.keyMode, Seed: f.seed, Window: w.String(), Span: span.String(),
		FilterExpected: r.stageConfig(KindStageBloom, namesFor(KindStageBloom)).Filter.ExpectedKeys,
		LatencyEvents:  len(lat.Main), LatencyKeys: lat.Keys,
	}
	for c := ClassFirst; c < numClasses; c++ {
		wi.ByClass[c.String()] = thr.ByClass[c]
	}
	if f.warmup > 0 && len(f.kinds) > 0 {
		if err := warmUp(ctx, r, f, w); err != nil {
			return nil, wi, fmt.Errorf("warm-up: %w", err)
		}
	}
	var results []*Result
	for round := 1; round <= f.rounds; round++ {
		n := len(f.kinds)
		for i := range n {
			k := f.kinds[(i+round-1)%n]
			if ctx.Err() != nil {
				return results, wi, ctx.Err()
			}
			if f.rounds > 1 && i == 0 {
				fmt.Fprintf(logOut, "-- round %d of %d\n", round, f.rounds)
			}
			r.round = round
			res, err := r.runConfig(ctx, k)
			if err != nil {
				return results, wi, fmt.Errorf("%s (round %d): %w", k, round, err)
			}
			res.Round = round
			results = append(results, res)
			wi.LatencyRatePerSec = r.latRate
			c := res.Correctness
			fmt.Fprintf(logOut, "  %s: expected %d forwards, output %d (+%d dropped by the output's window), lost %d, duplicated %d, dead-lettered %d\n",
				k, c.Expected, c.Output, c.DroppedByOutput, c.Lost, c.Duplicated, c.DeadLettered)
		}
	}
	return results, wi, nil
}

// warmUp runs the first configuration once on a small workload of its own
// and throws the result away: the first measured run then does not pay
// for a cold process and server.
func warmUp(ctx context.Context, r *runner, f *flags, w time.Duration) error {
	fmt.Fprintf(logOut, "-- warm-up: %d events through %s (not measured)\n", f.warmup, f.kinds[0])
	spec := r.thr.Spec
	spec.Prefix, spec.Events = "wup", f.warmup
	spec.Keys = max(1, int(float64(f.warmup)*float64(r.thr.Keys)/float64(r.thr.Events())))
	thr, err := Generate(spec)
	if err != nil {
		return err
	}
	lspec := r.lat.Spec
	lspec.Prefix, lspec.Events, lspec.Keys = "wul", max(1, f.warmup/10), max(1, f.warmup/10*r.lat.Keys/max(1, r.lat.Events()))
	lat, err := Generate(lspec)
	if err != nil {
		lat = &Workload{Spec: Spec{Prefix: "wul", W: w}}
	}
	wr := *r
	wr.thr, wr.lat, wr.round = thr, lat, 0
	if wr.latRate == 0 {
		wr.latRate = 1000
	}
	saved := logOut
	logOut = io.Discard
	defer func() { logOut = saved }()
	_, err = wr.runConfig(ctx, f.kinds[0])
	return err
}

// medians returns, per configuration in kinds order, its round with the
// median events/s (the lower middle one for an even count), with the
// events/s of every round attached.
func medians(all []*Result, kinds []Kind) []*Result {
	var out []*Result
	for _, k := range kinds {
		var rs []*Result
		for _, r := range all {
			if r.Config == string(k) {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			continue
		}
		sorted := slices.Clone(rs)
		slices.SortFunc(sorted, func(a, b *Result) int { return cmp.Compare(a.EventsPerSec, b.EventsPerSec) })
		m := sorted[(len(sorted)-1)/2]
		if len(rs) > 1 {
			for _, r := range rs {
				m.AllRounds = append(m.AllRounds, r.EventsPerSec)
			}
		}
		out = append(out, m)
	}
	return out
}

// render re-renders a results file.
func render(f *flags) int {
	b, err := os.ReadFile(f.render)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	var res Results
	if err := json.Unmarshal(b, &res); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %s: %v\n", f.render, err)
		return 1
	}
	res.Headline = headline(&res)
	printTables(os.Stdout, &res)
	if err := writeOutputs(f.out, &res); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	return 0
}

// settings describes the server and state settings of the run.
func settings(f *flags) string {
	srv := fmt.Sprintf("embedded nats-server (sync_always=%v)", f.syncAlways)
	if f.natsURL != "" {
		srv = "nats-server at " + f.natsURL
	}
	return fmt.Sprintf("%s, state.sync_writes=%v, %d partitions, stage output.publish=%s", srv, f.syncWrites, f.partitions, f.publish)
}

// headline computes the target figures from what ran.
func headline(res *Results) *Headline {
	if len(res.Results) == 0 {
		return nil
	}
	by := map[string]*Result{}
	h := &Headline{AllCorrect: true}
	for _, r := range res.Results {
		by[r.Config] = r
		h.AllCorrect = h.AllCorrect && r.Correctness.OK
	}
	if raw := by[string(KindRaw)]; raw != nil && raw.EventsPerSec > 0 {
		if s := by[string(KindStageBloom)]; s != nil {
			h.StageVsRaw = s.EventsPerSec / raw.EventsPerSec
		}
		if s := by[string(KindStageNoFilter)]; s != nil {
			h.NoFilterVsRaw = s.EventsPerSec / raw.EventsPerSec
		}
		if s := by[string(KindJetStream)]; s != nil {
			h.JetStreamVsRaw = s.EventsPerSec / raw.EventsPerSec
		}
	}
	js, sb := by[string(KindJetStream)], by[string(KindStageBloom)]
	if ra := by[string(KindRawAtomic)]; ra != nil && sb != nil && ra.EventsPerSec > 0 {
		h.StageVsRawAtomic = sb.EventsPerSec / ra.EventsPerSec
	}
	if js != nil && sb != nil && js.EventsPerSec > 0 {
		h.StageVsJetStream = sb.EventsPerSec / js.EventsPerSec
	}
	if js != nil && sb != nil && sb.RAMPerKey > 0 {
		h.RAMRatio = js.RAMPerKey / sb.RAMPerKey
	}
	if js != nil && js.RAMPerKey > 0 {
		if m := marginalPerKey(res.Scale); m > 0 {
			h.RAMRatioMarginal = js.RAMPerKey / m
		}
	}
	refreshCost(h, sb, by[string(KindStageRefresh)], res.Workload)
	return h
}

// refreshCost fills h's figures of stage-refresh (rf) against stage-bloom
// (sb), when both ran.
func refreshCost(h *Headline, sb, rf *Result, wi *WorkloadInfo) {
	if sb == nil || rf == nil || sb.EventsPerSec <= 0 || wi == nil {
		return
	}
	h.RefreshVsBloom = rf.EventsPerSec / sb.EventsPerSec
	if repeats := wi.MainEvents - wi.Keys; repeats > 0 {
		h.RefreshCPUPerRepeat = (rf.CPUMicrosPerEvent - sb.CPUMicrosPerEvent) * float64(wi.MainEvents) / float64(repeats)
	}
}

// writeOutputs writes the JSON results and the SVG chart next to them.
func writeOutputs(path string, res *Results) error {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return err
	}
	svgPath := strings.TrimSuffix(path, filepath.Ext(path)) + ".svg"
	if err := os.WriteFile(svgPath, renderSVG(res), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(logOut, "wrote %s and %s\n", path, svgPath)
	return nil
}

// itoa formats n with thousands separators.
func itoa(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
