package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dedupe-stage/dedupe-stage/config"
)

// Kind is one of the configurations the compare mode runs.
type Kind string

// The configurations, in the order they run by default (stage-refresh only
// when --configs names it); kinds describes each.
const (
	KindRaw           Kind = "raw"
	KindRawAtomic     Kind = "raw-atomic"
	KindRawFast       Kind = "raw-fast"
	KindJetStream     Kind = "jetstream"
	KindStageBloom    Kind = "stage-bloom"
	KindStageNoFilter Kind = "stage-nofilter"
	KindStageRefresh  Kind = "stage-refresh"
)

// kinds are the configurations with their stream token and description.
var kinds = []struct {
	kind        Kind
	token, what string
}{
	{KindRaw, "raw", "consume -> publish -> ack, routed by key, no dedupe, one publish per message"},
	{KindRawAtomic, "rawatomic", "the raw loop, each batch forwarded as atomic batches"},
	{KindRawFast, "rawfast", "the raw loop, each batch forwarded as one fast batch"},
	{KindJetStream, "js", "the raw loop, Nats-Msg-Id = key, output duplicate window = W"},
	{KindStageBloom, "bloom", "dedupe-stage, Bloom pre-check on"},
	{KindStageNoFilter, "nofilter", "dedupe-stage, pre-check off (every lookup reads Badger)"},
	{KindStageRefresh, "refresh", "dedupe-stage, Bloom pre-check on, window.refresh_on_repeat (each repeat moves its key's window)"},
}

// info returns k's stream token and description ("" for no configuration).
func (k Kind) info() (token, what string) {
	for _, d := range kinds {
		if d.kind == k {
			return d.token, d.what
		}
	}
	return string(k), ""
}

func (k Kind) isStage() bool { return strings.HasPrefix(string(k), "stage-") }

// filtered reports whether k is a stage configuration with the Bloom
// pre-check on.
func (k Kind) filtered() bool { return k == KindStageBloom || k == KindStageRefresh }

// isRaw reports whether k is a loop without dedupe (it forwards every copy).
func (k Kind) isRaw() bool { return strings.HasPrefix(string(k), "raw") }

// defineCompare defines the compare mode's flags.
func defineCompare(fs *flag.FlagSet, f *flags) {
	defineWorkload(fs, f, 0.1, "burst=0.2,immediate=0.3,seconds=0.3,near=0.1,past=0.1")
	defineStage(fs, f, config.Default().NATS.Embedded.SyncAlways)
	fs.StringVar(&f.keyMode, "key", "header", "where the stage reads the key: header (Event-Id) or json (field id)")
	fs.StringVar(&f.configs, "configs", "raw,raw-atomic,jetstream,stage-bloom,stage-nofilter", "configurations to run, in order; "+kindNames())
	fs.IntVar(&f.rounds, "rounds", 1, "run every configuration this many times, interleaved, the order rotated each round, and report each one's median round by events/s")
	fs.IntVar(&f.warmup, "warmup", 20_000, "events of an untimed warm-up run of the first configuration (0: none)")
	fs.IntVar(&f.latencyEvents, "latency-events", 20_000, "events of the paced latency phase after each drain (0: none)")
	fs.Float64Var(&f.latencyRate, "latency-rate", 0, "events/s of the latency phase; 0: --latency-load times the first configuration's drain rate")
	fs.Float64Var(&f.latencyLoad, "latency-load", 0.25, "latency phase rate as a share of the first configuration's events/s")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of each timed drain to PREFIX-<config>.pprof (PREFIX-<config>-round<N>.pprof with --rounds > 1)")
	fs.DurationVar(&f.pollEvery, "poll", 5*time.Millisecond, "consumer poll interval (drain detection and the stage's clock)")
}

// kindNames lists the configurations for --configs' help and errors.
func kindNames() string {
	var names []string
	for _, d := range kinds {
		names = append(names, string(d.kind))
	}
	return strings.Join(names, ", ")
}

// checkCompare parses --configs.
func checkCompare(f *flags) error {
	var err error
	if f.kinds, err = parseList("configs", f.configs, kindNames(), false, func(c string) (Kind, bool) {
		_, what := Kind(c).info()
		return Kind(c), what != ""
	}); err != nil {
		return err
	}
	switch {
	case f.keyMode != "header" && f.keyMode != "json":
		return fmt.Errorf("--key %q: want header or json", f.keyMode)
	case f.rounds < 1:
		return fmt.Errorf("--rounds %d: want >= 1", f.rounds)
	}
	return nil
}

// CompareRun is what the compare mode measured.
type CompareRun struct {
	Workload *WorkloadInfo `json:"workload"`
	// Results holds each configuration's median round; AllRounds every
	// round's result.
	Results   []*Result `json:"results"`
	AllRounds []*Result `json:"all_rounds"`
	// Ratios are events/s of one configuration over another's
	// ("stage-bloom/raw-atomic"), and "stage-refresh cpu µs/repeat"
	// (window.refresh_on_repeat's CPU beyond stage-bloom per repeat of
	// the backlog); a ratio whose configurations did not run is left out.
	Ratios map[string]float64 `json:"ratios,omitempty"`
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
	KeySource         string         `json:"key_source"`
	Seed              uint64         `json:"seed"`
	Window            string         `json:"window"`
	Span              string         `json:"span"`
	FilterExpected    uint64         `json:"filter_expected_keys"`
	LatencyEvents     int            `json:"latency_events"`
	LatencyKeys       int            `json:"latency_keys"`
	LatencyRatePerSec float64        `json:"latency_rate_per_sec"`
}

// runCompareMode runs --configs side by side, round after round, into
// res.
func runCompareMode(ctx context.Context, f *flags, res *Results) error {
	win, err := benchWindow(f)
	if err != nil {
		return err
	}
	w := win.W
	res.Settings = fmt.Sprintf("embedded nats-server (sync_always=%v), state.sync_writes=%v, %d partitions, stage output.publish=%s", f.syncAlways, f.syncWrites, f.partitions, f.publish)
	thr, err := backlog(f, f.events, w)
	if err != nil {
		return err
	}
	fmt.Fprintf(logOut, "generated %d events (%d keys), W %v, span %v\n", f.events, thr.Keys, w, thr.Span)
	lat, err := latencyWorkload(f, w, thr.Keys)
	if err != nil {
		return err
	}
	env, err := startNATS(f.workDir, f.syncAlways)
	if err != nil {
		return err
	}
	defer env.quit()
	r := &runner{f: f, nats: env, thr: thr, lat: lat, t0: time.Now().Truncate(time.Second), latRate: f.latencyRate}
	run := &CompareRun{Workload: &WorkloadInfo{
		Events: thr.Events(), MainEvents: len(thr.Main), LateEvents: len(thr.Late), Keys: thr.Keys, Repeats: thr.Events() - thr.Keys,
		ByClass: map[string]int{}, Mix: f.mix.String(), BurstSize: f.burstSize, PayloadBytes: f.payloadSize,
		KeySource: f.keyMode, Seed: f.seed, Window: w.String(), Span: thr.Span.String(),
		FilterExpected: r.stageConfig(KindStageBloom).Filter.ExpectedKeys, LatencyEvents: len(lat.Main), LatencyKeys: lat.Keys,
	}}
	res.Compare = run
	for c := ClassFirst; c < numClasses; c++ {
		run.Workload.ByClass[c.String()] = thr.ByClass[c]
	}
	if f.warmup > 0 {
		if err := warmUp(ctx, r); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	defer func() {
		run.Results = medians(run.AllRounds, f.kinds)
		run.Ratios = compareRatios(run.Results, run.Workload)
	}()
	for round := 1; round <= f.rounds; round++ {
		for i := range f.kinds {
			k := f.kinds[(i+round-1)%len(f.kinds)]
			if err := ctx.Err(); err != nil {
				return err
			}
			if f.rounds > 1 && i == 0 {
				fmt.Fprintf(logOut, "-- round %d of %d\n", round, f.rounds)
			}
			r.round = round
			res, err := r.runConfig(ctx, k)
			if err != nil {
				return fmt.Errorf("%s (round %d): %w", k, round, err)
			}
			res.Round = round
			run.AllRounds = append(run.AllRounds, res)
			run.Workload.LatencyRatePerSec = r.latRate
			c := res.Correctness
			fmt.Fprintf(logOut, "  %s: expected %d forwards, output %d (+%d dropped by the output's window), lost %d, duplicated %d, dead-lettered %d\n",
				k, c.Expected, c.Output, c.DroppedByOutput, c.Lost, c.Duplicated, c.DeadLettered)
		}
	}
	return nil
}

// backlog generates the workload of a timed backlog of events (prefix
// thr) with the shape the flags give.
func backlog(f *flags, events int, w time.Duration) (*Workload, error) {
	keys := f.keys
	if keys == 0 {
		keys = int(math.Round(float64(events) * (1 - f.repeatRatio)))
	}
	thr, err := Generate(Spec{Prefix: "thr", Seed: f.seed, Events: events, Keys: keys, Mix: f.mix,
		BurstSize: f.burstSize, PayloadSize: f.payloadSize, W: w, Span: time.Duration(f.spanFactor * float64(w))})
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	return thr, nil
}

// latencyWorkload generates the latency phase's events: fresh keys, the
// backlog's share of repeats, only the short ages (the stage's clock
// stands still meanwhile).
func latencyWorkload(f *flags, w time.Duration, keys int) (*Workload, error) {
	mix := f.mix
	mix[ClassNear], mix[ClassPast] = 0, 0
	if s := mix[ClassBurst] + mix[ClassImmediate] + mix[ClassSeconds]; s > 0 {
		for c := range mix {
			mix[c] /= s
		}
	} else {
		mix[ClassImmediate] = 1
	}
	if f.latencyEvents == 0 {
		return &Workload{Spec: Spec{Prefix: "lat", W: w}}, nil
	}
	n := max(1, int(math.Round(float64(f.latencyEvents)*float64(keys)/float64(f.events))))
	lat, err := Generate(Spec{Prefix: "lat", Seed: f.seed + 1, Events: f.latencyEvents, Keys: min(n, f.latencyEvents), Mix: mix,
		BurstSize: f.burstSize, PayloadSize: f.payloadSize, W: w, Span: 2 * time.Minute})
	if err != nil {
		return nil, fmt.Errorf("latency workload: %w", err)
	}
	return lat, nil
}

// warmUp runs the first configuration once on a small workload of its own
// and throws the result away: the first measured run then does not pay
// for a cold process and server.
func warmUp(ctx context.Context, r *runner) error {
	f := r.f
	fmt.Fprintf(logOut, "-- warm-up: %d events through %s (not measured)\n", f.warmup, f.kinds[0])
	spec := r.thr.Spec
	spec.Prefix, spec.Events = "wup", f.warmup
	spec.Keys = max(1, int(float64(f.warmup)*float64(r.thr.Keys)/float64(r.thr.Events())))
	thr, err := Generate(spec)
	if err != nil {
		return err
	}
	wr := *r
	wr.thr, wr.lat, wr.round = thr, &Workload{Spec: Spec{Prefix: "wul", W: spec.W}}, 0
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
		m := *sorted[(len(sorted)-1)/2]
		if len(rs) > 1 {
			for _, r := range rs {
				m.AllRounds = append(m.AllRounds, r.EventsPerSec)
			}
		}
		out = append(out, &m)
	}
	return out
}

// compareRatios computes the ratios the project's targets are stated in
// from what ran (see CompareRun.Ratios).
func compareRatios(results []*Result, wi *WorkloadInfo) map[string]float64 {
	by := map[Kind]*Result{}
	for _, r := range results {
		by[Kind(r.Config)] = r
	}
	out := map[string]float64{}
	for _, p := range [][2]Kind{
		{KindStageBloom, KindRaw}, {KindStageNoFilter, KindRaw}, {KindJetStream, KindRaw}, {KindRawFast, KindRawAtomic},
		{KindStageBloom, KindRawAtomic}, {KindStageBloom, KindJetStream}, {KindStageRefresh, KindStageBloom},
	} {
		if a, b := by[p[0]], by[p[1]]; a != nil && b != nil && b.EventsPerSec > 0 {
			out[string(p[0])+"/"+string(p[1])] = a.EventsPerSec / b.EventsPerSec
		}
	}
	var fastest *Result
	for _, k := range []Kind{KindRaw, KindRawAtomic, KindRawFast} {
		if r := by[k]; r != nil && (fastest == nil || r.EventsPerSec > fastest.EventsPerSec) {
			fastest = r
		}
	}
	if sb := by[KindStageBloom]; sb != nil && fastest != nil && fastest.EventsPerSec > 0 {
		out["stage-bloom/fastest raw ("+fastest.Config+")"] = sb.EventsPerSec / fastest.EventsPerSec
	}
	if js, sb := by[KindJetStream], by[KindStageBloom]; js != nil && sb != nil && sb.RAMPerKey > 0 {
		out["jetstream/stage-bloom RAM per key"] = js.RAMPerKey / sb.RAMPerKey
	}
	if sb, rf := by[KindStageBloom], by[KindStageRefresh]; sb != nil && rf != nil && wi != nil && wi.MainEvents > wi.Keys {
		out["stage-refresh cpu µs/repeat"] = (rf.CPUMicrosPerEvent - sb.CPUMicrosPerEvent) * float64(wi.MainEvents) / float64(wi.MainEvents-wi.Keys)
	}
	return out
}

// printCompare prints the configurations' tables, their notes and the
// ratios.
func printCompare(w io.Writer, res *CompareRun) {
	if wi := res.Workload; wi != nil {
		fmt.Fprintf(w, "workload: %s events (%s timed backlog + %s near/past copies judged after it), %s keys, %s repeats (%s; bursts of %d), payload %d B, key from %s, W %s, first copies over %s, seed %d; filter sized for %s keys\n",
			itoa(wi.Events), itoa(wi.MainEvents), itoa(wi.LateEvents), itoa(wi.Keys), itoa(wi.Repeats), wi.Mix, wi.BurstSize,
			wi.PayloadBytes, wi.KeySource, wi.Window, wi.Span, wi.Seed, itoa(wi.FilterExpected))
		fmt.Fprintf(w, "latency phase: %s events (%s keys) paced at %.0f events/s after each drain\n\n", itoa(wi.LatencyEvents), itoa(wi.LatencyKeys), wi.LatencyRatePerSec)
	}
	var raw float64
	for _, r := range res.Results {
		if r.Config == string(KindRaw) {
			raw = r.EventsPerSec
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "config\tevents/s\tvs raw\tdrain s\tCPU µs/event\tother load\tp50 ms\tp99 ms\tp99.9 ms\tRSS MiB\theap MiB\tpeak RSS MiB\texpected\toutput\tlost\tduplicated\tdead-lettered\t")
	for _, r := range res.Results {
		vs := "-"
		if raw > 0 {
			vs = fmt.Sprintf("%.2f", r.EventsPerSec/raw)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f\t%.1f\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t\n", r.Config, r.EventsPerSec, vs, r.DrainSeconds,
			r.CPUMicrosPerEvent, r.DrainCPU.OtherCores, r.Latency.P50ms, r.Latency.P99ms, r.Latency.P999ms, mib(r.MemAfter.RSS), mib(r.MemAfter.Heap), mib(r.MemAfter.PeakRSS),
			r.Correctness.Expected, r.Correctness.Output+r.Correctness.DroppedByOutput*boolInt(Kind(r.Config).isStage()), r.Correctness.Lost, r.Correctness.Duplicated, r.Correctness.DeadLettered)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "config\ttracked keys\tdedupe RAM MiB\tRAM B/key\tfilter B/key\tdisk MiB\tdisk B/key\tstore reads/event\tskip ratio\tFP observed\tFP estimated\tstart-up ms\t")
	for _, r := range res.Results {
		if Kind(r.Config).isRaw() {
			fmt.Fprintf(tw, "%s\t0\t(%s)\t-\t-\t-\t-\t-\t-\t-\t-\t-\t\n", r.Config, mib(r.DedupeHeapBytes))
			continue
		}
		if r.Config == string(KindJetStream) {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f\t-\t-\t-\t-\t-\t-\t-\t-\t\n", r.Config, r.TrackedKeys, mib(r.DedupeHeapBytes), r.RAMPerKey)
			continue
		}
		fb, skip, fp, est := "-", "-", "-", "-"
		if Kind(r.Config).filtered() {
			fb = fmt.Sprintf("%.2f", float64(r.FilterBytes)/float64(r.TrackedKeys))
			skip, fp, est = fmt.Sprintf("%.3f", r.SkipRatio), fmt.Sprintf("%.4f", r.FalsePositiveRate), fmt.Sprintf("%.4f", r.EstimatedFPRate)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f\t%s\t%s\t%.1f\t%.3f\t%s\t%s\t%s\t%.0f\t\n", r.Config, r.TrackedKeys, mib(r.DedupeHeapBytes), r.RAMPerKey, fb,
			mib(r.DiskBytes), r.DiskPerKey, r.StoreReadsPerEvent, skip, fp, est, r.StartupMs)
	}
	tw.Flush()
	printRatios(w, res.Ratios)
	for _, r := range res.Results {
		if len(r.AllRounds) > 1 {
			fmt.Fprintf(w, "note (%s): events/s of each round %.0f; the table shows round %d (the median)\n", r.Config, r.AllRounds, r.Round)
		}
		if si := r.Stage; si != nil {
			fmt.Fprintf(w, "note (%s): %.0f batches, mean %.1f messages; publish mean %.2f ms (p99 <= %.2f); commit mean %.2f ms (p99 <= %.2f)\n",
				r.Config, si.Batches, si.MeanBatchSize, si.PublishMeanMs, si.PublishP99Ms, si.CommitMeanMs, si.CommitP99Ms)
		}
		for _, n := range r.Notes {
			fmt.Fprintf(w, "note (%s): %s\n", r.Config, n)
		}
		if Kind(r.Config).isStage() {
			fmt.Fprintf(w, "note (%s): %d late copies in %d groups: %d forwarded again past W, %d repeats near the end (stage counted %.0f)\n",
				r.Config, r.LateEvents, r.LateGroups, r.ForwardedAgain, r.NearExpected, r.NearWindowEnd)
		}
	}
	fmt.Fprintln(w)
}

// printRatios prints the compare mode's ratios against their targets.
func printRatios(w io.Writer, ratios map[string]float64) {
	targets := map[string]string{
		"stage-bloom/raw": " (target >= 0.90 without fsync)", "stage-bloom/raw-atomic": " (target >= 0.70 with fsync always)",
		"stage-bloom/jetstream": " (target >= 5)", "jetstream/stage-bloom RAM per key": " (target >= 40)",
	}
	for _, n := range slices.Sorted(maps.Keys(ratios)) {
		fmt.Fprintf(w, "ratio: %s %.2f%s\n", n, ratios[n], targets[n])
	}
}
