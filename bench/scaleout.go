package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// The scaleout mode measures dedupe-stage as users run it with scale_out
// on: rows of 1..N instances on a 3-node cluster, each optionally CPU-capped,
// beside scale_out off. See the "scaleout" section of bench/README.md.

// Modes of a scale-out row.
const (
	// soOff is scale_out off, one instance, the key in a header: the
	// reference, on the same cluster and streams of the same replicas.
	soOff = "off"
	// soHeader is scale_out on with the key in a header: the route step
	// runs.
	soHeader = "header"
	// soSubject is scale_out on with the key as a subject token: the input
	// stream's transform partitions, no route step.
	soSubject = "subject"
	// soRefresh, after a mode (subject-refresh), runs that mode's row with
	// window.refresh_on_repeat: with scale_out on, each repeat the store
	// judges writes a key-state record in the batch's fenced publish.
	soRefresh = "-refresh"
)

// soMaxKeyLength is key.max_length of the instances: the workload's keys
// are 32 bytes, and a bad input with the key as a subject token carries a
// longer token.
const soMaxKeyLength = 64

// headerBad carries the index of a bad input, so that its dead letter maps
// back to it.
const headerBad = "Bench-Bad"

// defineScaleOut defines the scaleout mode's flags: no fsync per message,
// 30% repeats and only the ages of a drain by default.
func defineScaleOut(fs *flag.FlagSet, f *flags) {
	defineWorkload(fs, f, 0.3, "burst=0.2,immediate=0.4,seconds=0.4")
	defineStage(fs, f, false)
	defineProcs(fs, f)
	fs.IntVar(&f.rounds, "rounds", 1, "run every row this many times, in rounds of all rows (the order rotated each round), with each round's ratios and their medians (at most 20)")
	fs.StringVar(&f.soRows, "rows", "off,header,subject", "rows: off (scale_out off, one instance: the reference), header (the key in a header: the route step runs), subject (the key as a subject token); each followed by -refresh runs with window.refresh_on_repeat, right after the same row without it")
	fs.StringVar(&f.soInst, "instances", "1,2,3", "instance counts of the header and subject rows")
	fs.StringVar(&f.soCaps, "cpu-cap", "0,0.25", "CPU cap per instance in cores (cgroup v1 cpu quota), one set of rows per value; 0: uncapped")
	fs.Float64Var(&f.badRatio, "bad-ratio", 0.01, "share of the backlog's events without a usable key (dead-lettered once each)")
	fs.IntVar(&f.soBundleMax, "route-bundle-max", config.DefaultScaleOut().RouteBundleMax, "scale_out.route_bundle_max (copies of one partition per routed message; 0: each alone)")
	fs.IntVar(&f.soStandbys, "standbys", config.DefaultScaleOut().Standbys, "scale_out.standbys (warm standbys per partition; 0: none)")
	fs.DurationVar(&f.soWarmup, "warmup", 2*time.Minute, "bound on the warm-up that waits for the instances to share the partitions")
}

// checkScaleOut checks the scaleout flags and parses its lists.
func checkScaleOut(f *flags) error {
	if f.mix[ClassNear] > 0 || f.mix[ClassPast] > 0 {
		return fmt.Errorf("--ages %q: the stage runs on the wall clock here, so there are no near or past copies", f.ages)
	}
	var err error
	if f.soModes, err = parseList("rows", f.soRows, "off, header, subject, each optionally followed by "+soRefresh, true, func(m string) (string, bool) {
		mode, _ := strings.CutSuffix(m, soRefresh)
		return m, mode == soOff || mode == soHeader || mode == soSubject
	}); err != nil {
		return err
	}
	if f.soInstances, err = parseList("instances", f.soInst, fmt.Sprintf("1..%d (a group cannot use more instances than --partitions)", f.partitions), true, func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && n >= 1 && n <= f.partitions
	}); err != nil {
		return err
	}
	if f.cpuCaps, err = parseList("cpu-cap", f.soCaps, "0 (uncapped) or 0.01..64 cores", true, func(s string) (float64, bool) {
		c, err := strconv.ParseFloat(s, 64)
		return c, err == nil && c >= 0 && c <= 64 && (c == 0 || c*cgroupPeriod >= 1000)
	}); err != nil {
		return err
	}
	switch {
	case f.rounds < 1 || f.rounds > 20:
		return fmt.Errorf("--rounds %d: want 1..20", f.rounds)
	case f.badRatio < 0 || f.badRatio >= 0.5:
		return fmt.Errorf("--bad-ratio %v: want 0 <= r < 0.5", f.badRatio)
	case f.ackWait < config.MinScaleOutAckWait:
		return fmt.Errorf("--ack-wait %v: want at least %v", f.ackWait, config.MinScaleOutAckWait)
	}
	return nil
}

// soRow is one row of the scale-out table.
type soRow struct {
	mode      string // soOff, soHeader or soSubject
	refresh   bool   // window.refresh_on_repeat
	instances int
	cap       float64 // cores per instance; 0: uncapped
	round     int     // 1.. with --rounds above 1; 0 otherwise
}

func (r soRow) String() string {
	s := fmt.Sprintf("%s x%d", rowMode(r.mode, r.refresh), r.instances)
	if r.cap > 0 {
		s += fmt.Sprintf(" cap %g", r.cap)
	}
	if r.round > 0 {
		s += fmt.Sprintf(" round %d", r.round)
	}
	return s
}

// rowMode names a row's mode as --rows does.
func rowMode(mode string, refresh bool) string {
	if refresh {
		return mode + soRefresh
	}
	return mode
}

// planRows returns the rows to run: for each CPU cap, the modes in the
// order given (off with one instance; header and subject at each instance
// count), a refresh row right after the same row without refresh when both
// are given; with rounds above 1, all of them in each round, the order
// rotated (round 2 starts with the second row), so that no row always
// runs first or right after the largest.
func planRows(modes []string, instances []int, caps []float64, rounds int) []soRow {
	if rounds > 1 {
		one := planRows(modes, instances, caps, 1)
		var rows []soRow
		for round := 1; round <= rounds; round++ {
			for i := range one {
				r := one[(i+round-1)%len(one)]
				r.round = round
				rows = append(rows, r)
			}
		}
		return rows
	}
	var rows []soRow
	for _, c := range caps {
		for _, m := range modes {
			mode, refresh := strings.CutSuffix(m, soRefresh)
			if refresh && slices.Contains(modes, mode) {
				continue // right after the row without refresh
			}
			counts := instances
			if mode == soOff {
				counts = []int{1}
			}
			for _, n := range counts {
				rows = append(rows, soRow{mode: mode, refresh: refresh, instances: n, cap: c})
				if !refresh && slices.Contains(modes, m+soRefresh) {
					rows = append(rows, soRow{mode: mode, refresh: true, instances: n, cap: c})
				}
			}
		}
	}
	return rows
}

// ScaleOutRun is what the scaleout mode measured.
type ScaleOutRun struct {
	Workload ScaleOutLoad      `json:"workload"`
	Rows     []*ScaleOutRow    `json:"rows"`
	Ratios   []ScaleOutRatio   `json:"ratios,omitempty"`
	Refresh  []ScaleOutRefresh `json:"refresh,omitempty"`
	// CgroupError says why the CPU caps could not be applied.
	CgroupError string `json:"cgroup_error,omitempty"`
}

// ScaleOutLoad describes the scale-out backlog.
type ScaleOutLoad struct {
	// Events is Keyed plus Bad: events without a usable key (no key
	// header; with the key as a subject token, a token longer than
	// key.max_length), each to be dead-lettered once.
	Events, Keyed, Keys, Bad, Repeats int
	Mix                               string
	PayloadBytes, Partitions          int
	Seed                              uint64
}

// ScaleOutRow is one row's result.
type ScaleOutRow struct {
	Row       string  `json:"row"`
	Mode      string  `json:"mode"`
	Refresh   bool    `json:"refresh_on_repeat"`
	Instances int     `json:"instances"`
	CPUCap    float64 `json:"cpu_cap_cores"`
	Round     int     `json:"round,omitempty"`
	// Capped is false when a cap was asked for and could not be applied.
	Capped bool `json:"capped"`
	// RouteStep tells whether the route step ran; Publish how the
	// instances published: atomic (batches, fenced with scale_out on) or
	// async.
	RouteStep bool   `json:"route_step"`
	Publish   string `json:"output_publish"`
	// WarmupSeconds is how long the group took to share the partitions;
	// Spread is the partitions each instance owned then.
	WarmupSeconds  float64 `json:"warmup_seconds"`
	Spread         []int   `json:"partitions_owned_at_start,omitempty"`
	PublishSeconds float64 `json:"publish_seconds"`
	// DrainSeconds is from resuming the paused consumers to every one
	// having acknowledged everything; Drained is the events waiting in
	// them then; EventsPerSec is Drained / DrainSeconds.
	DrainSeconds float64 `json:"drain_seconds"`
	Drained      int     `json:"drained_events"`
	EventsPerSec float64 `json:"events_per_sec"`
	// The CPU of every instance (/proc/<pid>/stat) and of the three
	// servers over the drain, per drained event; OtherCores is the rest of
	// the machine's, in cores.
	StageCPUMicrosPerEvent  float64          `json:"stage_cpu_us_per_event"`
	ServerCPUMicrosPerEvent float64          `json:"server_cpu_us_per_event"`
	OtherCores              float64          `json:"other_cores"`
	PerInst                 []ScaleOutInst   `json:"instances_detail"`
	Stage                   ScaleOutInternal `json:"stage_internals"`
	Correct                 ScaleOutCorrect  `json:"correctness"`
	Notes                   []string         `json:"notes,omitempty"`
}

// ScaleOutInst is one instance's share of a drain: its CPU, the messages
// its partitions judged and it routed, the partitions it owned at the end
// and its takeovers.
type ScaleOutInst struct {
	Name                                  string
	CPUSeconds, Cores, CPUMicrosPerJudged float64
	Judged, Routed, Owned, Takeovers      float64
}

// ScaleOutInternal is the instances' metrics over the drain, summed: the
// stage's batches, and routed/s, copies per routed message (bundles),
// takeovers and fence refusals.
type ScaleOutInternal struct {
	StageInternals
	RoutedPerSec, CopiesPerRouted, Takeovers, FenceRefuse float64
}

// ScaleOutCorrect compares the output and dead-letter streams with the
// ground truth: every key of the warm-up and of the backlog once, every
// bad input dead-lettered once, nothing else; fences and key-state
// records counted apart.
type ScaleOutCorrect struct {
	Expected, Output, Fences, KeyState, Lost, Duplicated          int
	DeadLetterWant, DeadLettered, DeadLetterLost, DeadLetterExtra int
	OK                                                            bool
}

// soEnv is what every row shares.
type soEnv struct {
	*procEnv
	thr      *Workload
	bad      int
	warmKeys int // warm-up keys published so far, over all rows
}

// runScaleOutMode runs the scale-out rows into res.
func runScaleOutMode(ctx context.Context, f *flags, res *Results) error {
	win, err := benchWindow(f)
	if err != nil {
		return err
	}
	run := &ScaleOutRun{}
	res.ScaleOut = run
	thr, load, err := scaleOutWorkload(f, win.W)
	if err != nil {
		return err
	}
	run.Workload = load
	pe, err := startProcEnv(ctx, f, f.workDir, slices.ContainsFunc(f.cpuCaps, func(c float64) bool { return c > 0 }))
	if err != nil {
		return err
	}
	defer pe.close()
	if pe.capErr != nil {
		run.CgroupError = pe.capErr.Error()
	}
	res.Settings = pe.describe() + fmt.Sprintf(", %d partitions, scale_out.route_bundle_max %d, scale_out.standbys %d", f.partitions, f.soBundleMax, f.soStandbys)
	e := &soEnv{procEnv: pe, thr: thr, bad: load.Bad}
	defer func() {
		run.Ratios = scaleOutRatios(run.Rows, f.cpuCaps, f.rounds)
		run.Refresh = refreshCosts(run.Rows, load.Repeats, f.rounds)
	}()
	for i, row := range planRows(f.soModes, f.soInstances, f.cpuCaps, f.rounds) {
		r, err := e.runRow(ctx, i, row)
		if r != nil {
			run.Rows = append(run.Rows, r)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", row, err)
		}
		c := r.Correct
		fmt.Fprintf(logOut, "  %s: %.0f events/s; expected %d forwards, output %d (+%d fence messages, +%d key-state records), lost %d, duplicated %d; dead-lettered %d of %d bad inputs (+%d extra)\n",
			row, r.EventsPerSec, c.Expected, c.Output, c.Fences, c.KeyState, c.Lost, c.Duplicated, c.DeadLettered-c.DeadLetterExtra, c.DeadLetterWant, c.DeadLetterExtra)
	}
	return nil
}

// scaleOutWorkload generates the keyed events of the scale-out backlog;
// load describes the whole backlog, bad inputs included.
func scaleOutWorkload(f *flags, w time.Duration) (*Workload, ScaleOutLoad, error) {
	bad := int(math.Round(float64(f.events) * f.badRatio))
	keyed := f.events - bad
	thr, err := backlog(f, keyed, w)
	if err != nil {
		return nil, ScaleOutLoad{}, err
	}
	return thr, ScaleOutLoad{Events: f.events, Keyed: keyed, Keys: thr.Keys, Bad: bad, Repeats: keyed - thr.Keys, Mix: f.mix.String(),
		PayloadBytes: f.payloadSize, Seed: f.seed, Partitions: f.partitions}, nil
}

// namesForRow names the streams of row i (and of the other modes' groups).
func namesForRow(i int) streamNames { return namesOf("BSO", strconv.Itoa(i), "so"+strconv.Itoa(i)) }

// streams are the row's streams and the group's buckets.
func (n streamNames) streams(cfg config.Config) []string {
	bucket, _, _ := layout.Presence(cfg.ScaleOut.Group, cfg.Input.AckWait.D())
	return []string{n.input, n.output, n.dlq, n.routed, "KV_" + bucket, "KV_" + layout.HandOverBucket(cfg.ScaleOut.Group), "OBJ_" + layout.SnapshotBucket(cfg.ScaleOut.Group)}
}

// instanceConfig returns the configuration of instance name of a group of
// mode on e's cluster; edit, when not nil, changes it further.
func (e *procEnv) instanceConfig(mode string, refresh bool, n streamNames, name, dataDir, addr string, expectedKeys int, edit func(*config.Config)) config.Config {
	nc := config.Default().NATS
	nc.URL = e.cl.URLs()
	// The ground truth is the same with window.refresh_on_repeat: every
	// copy is judged during the drain, within the drain's time of its
	// key's first copy, so while the drain is shorter than W (noted when
	// it is not) no copy reaches a window end, the one thing refresh moves.
	cfg := e.f.stageConfig(nc, n, refresh, expectedKeys)
	if mode == soSubject {
		cfg.Key.Field = keys.FieldSpec{Source: keys.SourceSubject, SubjectToken: 3}
	} else {
		cfg.Key.Field.Header = headerKey
	}
	cfg.Key.MaxLength = soMaxKeyLength
	cfg.Input.Consumer, cfg.Input.AckWait = n.group, config.Duration(e.f.ackWait)
	cfg.Output.Publish = e.f.publish
	cfg.State.DataDir, cfg.HTTP.Addr = dataDir, addr
	so := &cfg.ScaleOut
	so.Enabled, so.Group, so.Instance, so.Replicas = mode != soOff, n.group, name, e.f.replicas
	so.RoutedStream, so.RoutedSubject, so.RouteBundleMax = n.routed, n.routedSubj, e.f.soBundleMax
	if edit != nil {
		edit(&cfg)
	}
	return cfg
}

// msg returns the input message of key (index i).
func (n streamNames) msg(mode, key string, i, payloadSize int) *nats.Msg {
	m := &nats.Msg{Subject: "in." + n.token + ".orders", Header: nats.Header{}, Data: Payload(key, i, payloadSize)}
	if mode == soSubject {
		m.Subject = "in." + n.token + "." + key
	} else {
		m.Header.Set(headerKey, key)
	}
	return m
}

// badMsg returns bad input j: no key header, or with the key as a subject
// token, a token longer than key.max_length.
func (n streamNames) badMsg(mode string, j int) *nats.Msg {
	m := &nats.Msg{Subject: "in." + n.token + ".orders", Header: nats.Header{}, Data: fmt.Appendf(nil, `{"bad":%d}`, j)}
	if mode == soSubject {
		m.Subject = fmt.Sprintf("in.%s.bad%0*d", n.token, soMaxKeyLength+8, j)
	}
	m.Header.Set(headerBad, strconv.Itoa(j))
	return m
}

// soRowRun is one row's run: what its phases share.
type soRowRun struct {
	*soEnv
	idx      int
	row      soRow
	n        streamNames
	res      *ScaleOutRow
	insts    []*instance
	cfg      config.Config // the last instance's (they differ by name, data dir and address)
	cons     []consumerRef // the group's consumers, found by the warm-up
	warmFrom int           // e.warmKeys before the row's warm-up
	before   []metrictest.Families
}

// runRow runs one row: create the streams, start the instances, warm the
// group up until it shares the partitions, pause its consumers, publish
// the backlog, resume them and time the drain, stop the instances, check
// the ground truth, delete the streams.
func (e *soEnv) runRow(ctx context.Context, idx int, row soRow) (*ScaleOutRow, error) {
	fmt.Fprintf(logOut, "== scale-out %s\n", row)
	r := &soRowRun{soEnv: e, idx: idx, row: row, n: namesForRow(idx),
		res: &ScaleOutRow{Row: row.String(), Mode: row.mode, Refresh: row.refresh, Instances: row.instances, CPUCap: row.cap, Round: row.round}}
	err := r.configure(ctx)
	defer func() { e.release(r.n, r.cfg, r.insts) }()
	if err != nil {
		return nil, err
	}
	for _, phase := range []func(context.Context) error{r.start, r.warmUp, r.publishBacklog, r.drain, r.stopAndVerify} {
		if err := phase(ctx); err != nil {
			return nil, err
		}
	}
	return r.res, nil
}

// configure writes each instance's configuration, creates the row's
// streams and notes what the row runs: the route step or not, and how the
// output is published.
func (r *soRowRun) configure(ctx context.Context) error {
	dir := filepath.Join(r.dir, "rows", fmt.Sprintf("%02d-%s", r.idx, strings.ReplaceAll(r.row.String(), " ", "-")))
	names := make([]string, r.row.instances)
	for k := range names {
		names[k] = "i" + strconv.Itoa(k)
	}
	var err error
	r.insts, r.cfg, err = r.configureGroup(ctx, dir, r.n, names, r.row.mode, r.row.refresh, r.thr.Keys+r.warmKeys+100_000, func(c *config.Config) { c.ScaleOut.Standbys = r.f.soStandbys })
	if routed, why := r.cfg.ScaleOutPartitioning().Routed(); err == nil && r.cfg.ScaleOut.Enabled {
		r.res.RouteStep = routed
		if routed != (r.row.mode == soHeader) {
			r.res.Notes = append(r.res.Notes, "route step "+strconv.FormatBool(routed)+": "+why)
		}
	}
	r.res.Publish = config.PublishAsync
	if atomic, _ := r.cfg.PublishAtomic(true); atomic {
		r.res.Publish = config.PublishAtomic
	}
	return err
}

// start starts the instances: the first alone, then the others.
func (r *soRowRun) start(ctx context.Context) error {
	prefix := fmt.Sprintf("r%d-", r.idx)
	first, err := r.startAll(ctx, r.insts[:1], prefix, r.row.cap, time.Minute)
	if err != nil {
		return err
	}
	rest, err := r.startAll(ctx, r.insts[1:], prefix, r.row.cap, time.Minute)
	if err != nil {
		return err
	}
	r.res.Capped = first && rest
	if r.row.cap > 0 && !r.res.Capped && r.capErr != nil {
		r.res.Notes = append(r.res.Notes, "not capped: "+r.capErr.Error())
	}
	return nil
}

// warmUp publishes rounds of new keys until the group shares the
// partitions: every one owned, none more than its fair share.
func (r *soRowRun) warmUp(ctx context.Context) error {
	res, start := r.res, time.Now()
	r.warmFrom = r.warmKeys
	for {
		if err := r.warmRound(ctx); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		res.Spread = owned(ctx, r.insts)
		if !r.cfg.ScaleOut.Enabled || fair(res.Spread, r.f.partitions) {
			break
		}
		if time.Since(start) > r.f.soWarmup {
			res.Notes = append(res.Notes, fmt.Sprintf("the instances did not share the partitions within --warmup %v (owned %v); measured as it was", r.f.soWarmup, res.Spread))
			break
		}
		time.Sleep(time.Second)
	}
	res.WarmupSeconds = time.Since(start).Seconds()
	fmt.Fprintf(logOut, "  %s: warm-up %d keys in %.1fs; partitions owned by instance: %v\n", r.row, r.warmKeys-r.warmFrom, res.WarmupSeconds, res.Spread)
	return nil
}

// fair reports whether the instances own every one of parts partitions
// between them and none more than its fair share.
func fair(owned []int, parts int) bool {
	sum := 0
	for _, n := range owned {
		if n < 0 || n > (parts+len(owned)-1)/len(owned) {
			return false
		}
		sum += n
	}
	return sum == parts
}

// warmRound publishes a round of new warm-up keys, finds the row's
// consumers and waits until they have acknowledged everything.
func (r *soRowRun) warmRound(ctx context.Context) error {
	count, from := max(100, 50*r.row.instances), r.warmKeys
	r.warmKeys += count
	if _, err := publishAll(ctx, r.js, count, func(i int) *nats.Msg {
		return r.n.msg(r.row.mode, KeyString("wup", r.f.seed, from+i), from+i, r.f.payloadSize)
	}, &progress{}); err != nil {
		return err
	}
	// The consumers exist once the instances are ready; list them after
	// the round, when the route step and the members have all been made.
	streams, want := []string{r.n.input}, 1
	if r.cfg.ScaleOut.Enabled {
		want = r.f.partitions
		if routed, _ := r.cfg.ScaleOutPartitioning().Routed(); routed {
			streams, want = append(streams, r.n.routed), want+1
		}
	}
	if err := waitUntil(ctx, time.Minute, 100*time.Millisecond, fmt.Sprintf("%d consumers on %v", want, streams), r.insts, func() (bool, string) {
		var err error
		r.cons, err = r.consumersOf(ctx, streams...)
		return err == nil && len(r.cons) >= want, fmt.Sprintf("%d found, %v", len(r.cons), err)
	}); err != nil {
		return err
	}
	return r.waitDrained(ctx, r.cons, r.insts, time.Minute, nil)
}

// backlogMsg returns the backlog's message i: the keyed events of the
// workload in order, with the bad inputs spread evenly among them.
func (e *soEnv) backlogMsg(mode string, n streamNames) func(i int) *nats.Msg {
	total := len(e.thr.Main) + e.bad
	nextBad, j, k := -1, 0, 0
	if e.bad > 0 {
		nextBad = total / (2 * e.bad)
	}
	return func(int) *nats.Msg {
		if j < e.bad && k+j == nextBad {
			m := n.badMsg(mode, j)
			j++
			nextBad = (2*j + 1) * total / (2 * e.bad)
			return m
		}
		ev := e.thr.Main[k]
		k++
		return n.msg(mode, e.thr.Key(int(ev.Key)), int(ev.Key), e.f.payloadSize)
	}
}

// publishBacklog pauses every consumer of the group and publishes the
// backlog, which then waits in them. On a cluster a pause takes effect
// after its answer, so it waits until each reports itself paused; an
// instance that joins a member again creates its consumer anew, which
// lifts the pause, so during the publish a consumer found unpaused is
// paused again (noted).
func (r *soRowRun) publishBacklog(ctx context.Context) error {
	res := r.res
	if err := r.pause(ctx, nil); err != nil {
		return err
	}
	r.before = make([]metrictest.Families, len(r.insts))
	for k, in := range r.insts {
		var err error
		if r.before[k], err = metrictest.Scrape(ctx, in.addr); err != nil {
			return err
		}
	}
	total := len(r.thr.Main) + r.bad
	prog := startProgress(r.row.String()+" publish backlog", uint64(total), r.f.progressDur, nil)
	pctx, cancel := context.WithTimeout(ctx, r.f.timeout)
	var repaused atomic.Int64
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for pctx.Err() == nil {
			_ = r.pause(pctx, &repaused)
			time.Sleep(100 * time.Millisecond)
		}
	}()
	took, err := publishAll(pctx, r.js, total, r.backlogMsg(r.row.mode, r.n), prog)
	cancel()
	<-watched
	prog.end()
	if err != nil {
		return fmt.Errorf("publish backlog: %w", err)
	}
	res.PublishSeconds = took.Seconds()
	if err := r.pause(ctx, nil); err != nil {
		return err
	}
	if n := repaused.Load(); n > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("a consumer was found unpaused %d times during the publish and paused again (an instance re-created a member's consumer)", n))
	}
	infos, err := r.infos(ctx, r.cons)
	if err != nil {
		return err
	}
	res.Drained = 0
	for _, ci := range infos {
		res.Drained += int(ci.NumPending) + ci.NumAckPending
	}
	if res.Drained != total {
		res.Notes = append(res.Notes, fmt.Sprintf("%d of the %d backlog events waited in the paused consumers when the drain began; events/s and CPU per event count those", res.Drained, total))
	}
	return nil
}

// pause pauses every consumer of the row that is not paused and, with
// repaused nil, waits up to 30s until each reports itself paused; with
// repaused, it counts the consumers it paused again and does not wait.
func (r *soRowRun) pause(ctx context.Context, repaused *atomic.Int64) error {
	var last error
	if natstest.Until(30*time.Second, 20*time.Millisecond, func() bool {
		infos, err := r.infos(ctx, r.cons)
		if last = err; err != nil {
			return repaused != nil || ctx.Err() != nil
		}
		all := true
		for i, ci := range infos {
			if ci.Paused {
				continue
			}
			all = false
			if _, last = r.js.PauseConsumer(ctx, r.cons[i].stream, r.cons[i].name, time.Now().Add(time.Hour)); last == nil && repaused != nil {
				repaused.Add(1)
			}
		}
		return all || repaused != nil
	}) && last == nil || repaused != nil {
		return nil
	}
	return fmt.Errorf("the row's consumers not paused within 30s: %v", last)
}

// drain resumes the consumers and times the drain: events/s, the CPU of
// the instances and of the servers, and each instance's own view of it.
func (r *soRowRun) drain(ctx context.Context) error {
	res := r.res
	cpu0, m0 := r.cpuNow(r.insts), readCPU()
	t0 := time.Now()
	for _, c := range r.cons {
		if _, err := r.js.ResumeConsumer(ctx, c.stream, c.name); err != nil {
			return fmt.Errorf("resume consumer %s: %w", c.name, err)
		}
	}
	prog := startProgress(r.row.String()+" drain (forwarded)", uint64(r.thr.Keys), r.f.progressDur, nil)
	base, counted := uint64(r.warmKeys-r.warmFrom), time.Now()
	err := r.waitDrained(ctx, r.cons, r.insts, r.f.timeout, func() {
		// The output's count is for the progress line only: not every poll.
		if r.f.progressDur > 0 && time.Since(counted) > r.f.progressDur/2 {
			counted = time.Now()
			if si, err := r.js.Stream(ctx, r.n.output); err == nil && si.CachedInfo().State.Msgs >= base {
				prog.done.Store(si.CachedInfo().State.Msgs - base)
			}
		}
	})
	drain := time.Since(t0)
	cpu, sSum, nSum := cpu0.since(r.procEnv, r.insts)
	machine := cpuSince(m0)
	prog.end()
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	res.DrainSeconds = drain.Seconds()
	res.EventsPerSec = float64(res.Drained) / drain.Seconds()
	if drain >= r.thr.W {
		res.Notes = append(res.Notes, fmt.Sprintf("the drain took %v, W is %v: a repeat may have been judged past its key's window, which the ground truth assumes none is", drain.Round(time.Second), r.thr.W))
	}
	res.StageCPUMicrosPerEvent = sSum * 1e6 / float64(res.Drained)
	res.ServerCPUMicrosPerEvent = nSum * 1e6 / float64(res.Drained)
	// The machine's busy time minus the stage's and the servers' (the
	// harness's own polling counts as other load).
	res.OtherCores = max(0, machine.OtherCores+machine.Cores-(sSum+nSum)/drain.Seconds())
	return r.perInstance(ctx, drain, cpu)
}

// perInstance adds the instances' own view of the drain: each one's CPU
// (cpu, seconds) and metrics, and their sum.
func (r *soRowRun) perInstance(ctx context.Context, drain time.Duration, cpu []float64) error {
	var sum metrictest.Families
	routed := map[string]string{"outcome": "routed"}
	for k, in := range r.insts {
		after, err := metrictest.Scrape(ctx, in.addr)
		if err != nil {
			return err
		}
		d := after.Minus(r.before[k])
		sum = append(sum, d...)
		pi := ScaleOutInst{Name: in.name, CPUSeconds: cpu[k], Cores: cpu[k] / drain.Seconds(), Judged: d.Sum("dedupe_messages_total", nil),
			Routed: d.Sum("dedupe_route_messages_total", routed), Owned: after.Sum("dedupe_partitions_owned", nil),
			Takeovers: d.Sum("dedupe_partition_takeovers_total", nil)}
		if pi.Judged > 0 {
			pi.CPUMicrosPerJudged = cpu[k] * 1e6 / pi.Judged
		}
		r.res.PerInst = append(r.res.PerInst, pi)
	}
	si := ScaleOutInternal{StageInternals: stageInternals(sum), RoutedPerSec: sum.Sum("dedupe_route_messages_total", routed) / drain.Seconds(),
		Takeovers: sum.Sum("dedupe_partition_takeovers_total", nil), FenceRefuse: sum.Sum("dedupe_fence_refusals_total", nil)}
	if c, s, _ := sum.Histogram("dedupe_route_copies_per_message", 0); c > 0 {
		si.CopiesPerRouted = s / c
	}
	r.res.Stage = si
	if judged := sum.Sum("dedupe_messages_total", nil); int(judged) < len(r.thr.Main) {
		r.res.Notes = append(r.res.Notes, fmt.Sprintf("the instances counted %.0f messages judged during the drain, the backlog has %d keyed events", judged, len(r.thr.Main)))
	}
	return nil
}

// stopAndVerify stops the instances, then checks the ground truth.
func (r *soRowRun) stopAndVerify(ctx context.Context) error {
	for _, in := range r.insts {
		if !r.stop(in) {
			r.res.Notes = append(r.res.Notes, in.name+" did not stop within 30s of SIGTERM; killed")
		}
	}
	if err := r.verify(ctx, r.n, r.warmFrom, r.res); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	return nil
}

// verify reads the row's output and dead-letter streams: every key of the
// warm-up (from warmFrom) and of the backlog once, fences and key-state
// records apart, every bad input dead-lettered once.
func (e *soEnv) verify(ctx context.Context, n streamNames, warmFrom int, res *ScaleOutRow) error {
	t, err := e.tallyOutput(ctx, n, map[string]int{e.thr.Prefix: e.thr.Keys, "wup": e.warmKeys})
	if err != nil {
		return err
	}
	c := &res.Correct
	*c = ScaleOutCorrect{Output: t.total - t.fences - t.keyState, Fences: t.fences, KeyState: t.keyState, Expected: e.thr.Keys + e.warmKeys - warmFrom}
	c.Lost, c.Duplicated = t.exact(map[string]func(int) int{e.thr.Prefix: once, "wup": func(i int) int { return boolInt(i >= warmFrom) }})
	if t.foreign > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d output messages carry no key of the workload", t.foreign))
		c.Duplicated += t.foreign
	}
	// Key-state records change no forward; a row that writes them without
	// refresh, or none with refresh in a group, did not run what it says.
	switch repeats := len(e.thr.Main) - e.thr.Keys; {
	case !res.Refresh && c.KeyState > 0:
		res.Notes = append(res.Notes, fmt.Sprintf("%d key-state records in the output of a row without window.refresh_on_repeat", c.KeyState))
	case res.Refresh && res.Mode != soOff && repeats > 0 && c.KeyState == 0:
		res.Notes = append(res.Notes, fmt.Sprintf("no key-state record in the output of a group with window.refresh_on_repeat (%d repeats)", repeats))
	}
	// The dead letters: each bad input once (by its Bench-Bad header),
	// nothing else, fences apart.
	dl, err := readTally(ctx, e.js, n.dlq, func(m jetstream.Msg) (string, int, bool) {
		j, err := strconv.Atoi(m.Headers().Get(headerBad))
		return "bad", j, err == nil && j >= 0
	}, map[string]int{"bad": e.bad}, n.dlqSubj, nil)
	if err != nil {
		return err
	}
	c.DeadLetterWant, c.DeadLettered = e.bad, dl.total-dl.fences
	c.DeadLetterLost, c.DeadLetterExtra = dl.exact(map[string]func(int) int{"bad": once})
	c.DeadLetterExtra += dl.foreign
	c.OK = c.Lost == 0 && c.Duplicated == 0 && c.DeadLetterLost == 0 && c.DeadLetterExtra == 0
	return nil
}
