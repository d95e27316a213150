package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// The partitions mode measures what each partition and each instance of a
// group costs: for each partition count, a group of --instances instances
// started at once on a 3-node cluster, the time until every partition is
// owned, then the JetStream API requests (the servers' jsz counters), the
// CPU, the pull requests waiting on the members' consumers, and each
// instance's memory and open files, idle and under a paced load. See the
// "partitions" section of bench/README.md.

// Key prefixes of the partitions mode: one key per partition to take the
// pins, and the paced load.
const (
	ptPinPrefix  = "ptp"
	ptLoadPrefix = "ptl"
)

// definePartitions defines the partitions mode's flags.
func definePartitions(fs *flag.FlagSet, f *flags) {
	defineStage(fs, f, false)
	defineProcs(fs, f)
	fs.StringVar(&f.ptSizes, "sizes", "64,1024", "partition counts (state.partitions), each a group of its own, in order")
	fs.IntVar(&f.ptInstances, "instances", 16, "instances of each group, started at once")
	fs.DurationVar(&f.ptIdle, "idle", time.Minute, "the idle window measured once every partition is owned")
	fs.DurationVar(&f.ptLoad, "load", time.Minute, "the load window: events published at --rate")
	fs.IntVar(&f.ptRate, "rate", 500, "events/s of the load window, keys spread over the partitions")
	fs.Float64Var(&f.ptCap, "cpu-cap", 0, "CPU cap per instance in cores (cgroup v1 cpu quota); 0: uncapped")
	fs.IntVar(&f.payloadSize, "payload-size", 256, "payload bytes per event")
	fs.Uint64Var(&f.seed, "seed", 1, "key seed")
}

// checkPartitions parses --sizes.
func checkPartitions(f *flags) error {
	var err error
	if f.ptCounts, err = parseList("sizes", f.ptSizes, fmt.Sprintf("1..%d (state.MaxPartitions)", state.MaxPartitions), false, func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && n >= 1 && n <= state.MaxPartitions
	}); err != nil {
		return err
	}
	if f.ptInstances < 1 || f.ptRate < 1 || f.ptCap < 0 {
		return fmt.Errorf("--instances %d, --rate %d, --cpu-cap %v: want >= 1, >= 1, >= 0", f.ptInstances, f.ptRate, f.ptCap)
	}
	return nil
}

// PartitionsRun is what the partitions mode measured.
type PartitionsRun struct {
	Instances int              `json:"instances"`
	CPUCap    float64          `json:"cpu_cap_cores"`
	Capped    bool             `json:"capped"`
	Points    []PartitionPoint `json:"points"`
	// PerPartition is the slope between the two largest points: what one
	// more partition adds to the group (API requests, pulls) or to each
	// instance (memory, open files).
	PerPartition *PartitionCost `json:"per_partition,omitempty"`
	OK           bool           `json:"ok"`
}

// PartitionPoint is one group of Partitions partitions.
type PartitionPoint struct {
	Partitions int `json:"partitions"`
	// ReadySeconds is the start of every instance until every /readyz
	// answers; OwnedSeconds until every partition is owned (one message
	// per partition published at the start: a pin is taken by a
	// partition's first delivery).
	ReadySeconds, OwnedSeconds float64
	Idle, Load                 PartitionCost
	Lost, Duplicated, Foreign  int
	Notes                      []string `json:"notes,omitempty"`
}

// PartitionCost is one window's figures: the JetStream API requests the
// servers answered (the sum of their jsz api.total) per second, over the
// group and per instance; CPU in cores of the instances and of the
// servers; and, sampled after the window, the pull requests waiting on the
// group's member consumers (num_waiting) and each instance's mean
// resident memory, open files and goroutines, and the servers' RSS.
type PartitionCost struct {
	Seconds, Events                    float64
	APIPerSec, APIPerSecPerInst        float64
	APIErrors                          float64
	StageCores, ServerCores            float64
	PullsWaiting                       float64
	InstRSSMiB, InstAnonMiB, InstFiles float64
	InstGoroutines, ServerRSSMiB       float64
}

// runPartitionsMode runs each partition count in turn into res. Every
// process and cgroup is gone when it returns.
func runPartitionsMode(ctx context.Context, f *flags, res *Results) error {
	run := &PartitionsRun{Instances: f.ptInstances, CPUCap: f.ptCap, OK: true}
	res.Partitions = run
	pe, err := startProcEnv(ctx, f, f.workDir, f.ptCap > 0)
	if err != nil {
		return err
	}
	defer pe.close()
	res.Settings = pe.describe() + fmt.Sprintf("; %d instances started at once, key as subject token", f.ptInstances)
	for i, parts := range f.ptCounts {
		f.partitions = parts
		pt, err := pe.partitionPoint(ctx, i, parts, run)
		if pt != nil {
			run.Points = append(run.Points, *pt)
			run.OK = run.OK && pt.Lost == 0 && pt.Duplicated == 0 && pt.Foreign == 0
		}
		if err != nil {
			run.OK = false
			return fmt.Errorf("%d partitions: %w", parts, err)
		}
	}
	if n := len(run.Points); n > 1 {
		run.PerPartition = slopeOf(run.Points[n-2], run.Points[n-1])
	}
	return nil
}

// slopeOf is the cost of one more partition between points a and b.
func slopeOf(a, b PartitionPoint) *PartitionCost {
	d := float64(b.Partitions - a.Partitions)
	per := func(x, y float64) float64 { return (y - x) / d }
	return &PartitionCost{
		APIPerSec: per(a.Idle.APIPerSec, b.Idle.APIPerSec), APIPerSecPerInst: per(a.Idle.APIPerSecPerInst, b.Idle.APIPerSecPerInst),
		StageCores: per(a.Idle.StageCores, b.Idle.StageCores), ServerCores: per(a.Idle.ServerCores, b.Idle.ServerCores),
		PullsWaiting: per(a.Idle.PullsWaiting, b.Idle.PullsWaiting), InstRSSMiB: per(a.Idle.InstRSSMiB, b.Idle.InstRSSMiB),
		InstAnonMiB: per(a.Idle.InstAnonMiB, b.Idle.InstAnonMiB), InstFiles: per(a.Idle.InstFiles, b.Idle.InstFiles),
		InstGoroutines: per(a.Idle.InstGoroutines, b.Idle.InstGoroutines), ServerRSSMiB: per(a.Idle.ServerRSSMiB, b.Idle.ServerRSSMiB),
	}
}

// partitionPoint runs one group of parts partitions: start, own, idle,
// load, stop, verify.
func (e *procEnv) partitionPoint(ctx context.Context, idx, parts int, run *PartitionsRun) (*PartitionPoint, error) {
	fmt.Fprintf(logOut, "== partitions: %d partitions, %d instances\n", parts, e.f.ptInstances)
	pt := &PartitionPoint{Partitions: parts}
	n := namesForRow(100 + idx)
	names := make([]string, e.f.ptInstances)
	for k := range names {
		names[k] = fmt.Sprintf("i%02d", k)
	}
	insts, cfg, err := e.configureGroup(ctx, filepath.Join(e.dir, fmt.Sprintf("partitions-%d", parts)), n, names, soSubject, false, 0, nil)
	defer func() { e.release(n, cfg, insts) }()
	if err != nil {
		return nil, err
	}
	// Every instance at once, as a deployment of a group starts them.
	t0 := time.Now()
	run.Capped, err = e.startAll(ctx, insts, fmt.Sprintf("p%d-", idx), e.f.ptCap, e.f.timeout)
	if err != nil {
		return pt, err
	}
	pt.ReadySeconds = time.Since(t0).Seconds()
	pins := pinKeys(e.f.seed, parts)
	if _, err := publishAll(ctx, e.js, parts, func(p int) *nats.Msg {
		return n.msg(soSubject, KeyString(ptPinPrefix, e.f.seed, pins[p]), pins[p], e.f.payloadSize)
	}, &progress{}); err != nil {
		return pt, err
	}
	var got []int
	if err := waitUntil(ctx, e.f.timeout, 500*time.Millisecond, fmt.Sprintf("every one of %d partitions owned", parts), insts, func() (bool, string) {
		got = owned(ctx, insts)
		sum := 0
		for _, o := range got {
			sum += max(o, 0)
		}
		return sum == parts, fmt.Sprintf("owned by instance %v, -1: no answer", got)
	}); err != nil {
		return pt, err
	}
	pt.OwnedSeconds = time.Since(t0).Seconds()
	fmt.Fprintf(logOut, "  %d partitions: ready after %.1fs, every partition owned after %.1fs (%v)\n", parts, pt.ReadySeconds, pt.OwnedSeconds, got)
	cons, err := e.consumersOf(ctx, n.input)
	if err != nil {
		return pt, err
	}
	if err := e.waitDrained(ctx, cons, insts, e.f.timeout, nil); err != nil {
		return pt, err
	}
	if pt.Idle, err = e.window(ctx, insts, cons, e.f.ptIdle, nil); err != nil {
		return pt, fmt.Errorf("idle: %w", err)
	}
	events := int(e.f.ptLoad.Seconds()) * e.f.ptRate
	if pt.Load, err = e.window(ctx, insts, cons, e.f.ptLoad, func(wctx context.Context) error {
		start := time.Now()
		return natstest.Publish(wctx, e.js, events, func(i int) *nats.Msg {
			pace(start, i, float64(e.f.ptRate))
			return n.msg(soSubject, KeyString(ptLoadPrefix, e.f.seed, i), i, e.f.payloadSize)
		}, nil)
	}); err != nil {
		return pt, fmt.Errorf("load: %w", err)
	}
	pt.Load.Events = float64(events)
	if err := e.waitDrained(ctx, cons, insts, e.f.timeout, nil); err != nil {
		return pt, err
	}
	for _, in := range insts {
		e.stop(in)
	}
	return pt, e.verifyPoint(ctx, n, pt, pins, events)
}

// verifyPoint reads the group's output: every load key once, and every pin
// key once.
func (e *procEnv) verifyPoint(ctx context.Context, n streamNames, pt *PartitionPoint, pins []int, events int) error {
	wantPin := map[int]int{}
	for _, k := range pins {
		wantPin[k] = 1
	}
	t, err := e.tallyOutput(ctx, n, map[string]int{ptLoadPrefix: events, ptPinPrefix: slices.Max(pins) + 1})
	if err != nil {
		return err
	}
	pt.Lost, pt.Duplicated = t.exact(map[string]func(int) int{ptPinPrefix: func(i int) int { return wantPin[i] }, ptLoadPrefix: once})
	pt.Foreign = t.foreign
	return nil
}

// pinKeys returns, for each of parts partitions, the index of the first
// key of prefix ptPinPrefix whose subject token the input's transform puts
// in it (state.PartitionFNV, as the transform computes it).
func pinKeys(seed uint64, parts int) []int {
	keys, left := make([]int, parts), parts
	for i := range keys {
		keys[i] = -1
	}
	for k := 0; left > 0; k++ {
		if p := state.PartitionFNV([]byte(KeyString(ptPinPrefix, seed, k)), parts); keys[p] < 0 {
			keys[p], left = k, left-1
		}
	}
	return keys
}

// window measures one window of length d, while work (when not nil) runs
// in it: the servers' API counters and CPU, the instances' CPU; then the
// pulls waiting and the processes' memory and open files.
func (e *procEnv) window(ctx context.Context, insts []*instance, cons []consumerRef, d time.Duration, work func(context.Context) error) (PartitionCost, error) {
	var c PartitionCost
	api0, err0 := e.jsz(ctx)
	cpu0 := e.cpuNow(insts)
	t0 := time.Now()
	wctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	var werr error
	var wg sync.WaitGroup
	if work != nil {
		wg.Go(func() { werr = work(wctx) })
	}
	select {
	case <-ctx.Done():
		return c, ctx.Err()
	case <-time.After(d):
	}
	wg.Wait()
	c.Seconds = time.Since(t0).Seconds()
	api1, err1 := e.jsz(ctx)
	_, stage, server := cpu0.since(e, insts)
	if err := errors.Join(werr, err0, err1); err != nil {
		return c, err
	}
	c.APIPerSec = (api1[0] - api0[0]) / c.Seconds
	c.APIErrors = api1[1] - api0[1]
	c.APIPerSecPerInst = c.APIPerSec / float64(len(insts))
	c.StageCores, c.ServerCores = stage/c.Seconds, server/c.Seconds
	infos, err := e.infos(ctx, cons)
	if err != nil {
		return c, err
	}
	for _, ci := range infos {
		c.PullsWaiting += float64(ci.NumWaiting)
	}
	for _, in := range insts {
		st, _ := proctest.Status(in.proc.Pid())
		files, _ := proctest.OpenFiles(in.proc.Pid())
		c.InstRSSMiB += float64(st["VmRSS"]) / (1 << 20) / float64(len(insts))
		c.InstAnonMiB += float64(st["RssAnon"]) / (1 << 20) / float64(len(insts))
		c.InstFiles += float64(files) / float64(len(insts))
		if fs, err := metrictest.Scrape(ctx, in.addr); err == nil {
			c.InstGoroutines += fs.Sum("go_goroutines", nil) / float64(len(insts))
		}
	}
	for _, pid := range e.cl.Pids() {
		st, _ := proctest.Status(pid)
		c.ServerRSSMiB += float64(st["VmRSS"]) / (1 << 20)
	}
	return c, nil
}

// jsz returns the sum over the nodes of their JetStream API requests
// answered and of those that failed (/jsz api.total, api.errors).
func (e *procEnv) jsz(ctx context.Context) ([2]float64, error) {
	var sum [2]float64
	for _, n := range e.cl.Nodes {
		var v struct {
			API struct{ Total, Errors float64 } `json:"api"`
		}
		if err := get(ctx, fmt.Sprintf("http://127.0.0.1:%d/jsz", n.MonitorPort), func(r io.Reader) error { return json.NewDecoder(r).Decode(&v) }); err != nil {
			return sum, fmt.Errorf("jsz of %s: %w", n.Name, err)
		}
		sum[0], sum[1] = sum[0]+v.API.Total, sum[1]+v.API.Errors
	}
	return sum, nil
}

// printPartitions prints the partitions table.
func printPartitions(w io.Writer, r *PartitionsRun) {
	fmt.Fprintf(w, "\n%d instances per group, CPU cap %g (applied: %v)\n", r.Instances, r.CPUCap, r.Capped)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "partitions\twindow\tready s\towned s\tevents/s\tAPI req/s\tper instance\tAPI errors\tstage cores\tserver cores\tpulls waiting\tinst RSS MiB\tinst anon MiB\tinst files\tinst goroutines\tserver RSS MiB\tlost\tdup\t")
	row := func(parts any, name string, ready, owned float64, c PartitionCost, lost, dup int) {
		fmt.Fprintf(tw, "%v\t%s\t%.1f\t%.1f\t%.0f\t%.1f\t%.2f\t%.0f\t%.3f\t%.3f\t%.0f\t%.2f\t%.2f\t%.1f\t%.1f\t%.1f\t%d\t%d\t\n", parts, name, ready, owned,
			c.Events/max(c.Seconds, 1e-9), c.APIPerSec, c.APIPerSecPerInst, c.APIErrors, c.StageCores, c.ServerCores, c.PullsWaiting,
			c.InstRSSMiB, c.InstAnonMiB, c.InstFiles, c.InstGoroutines, c.ServerRSSMiB, lost, dup)
	}
	for _, p := range r.Points {
		row(p.Partitions, "idle", p.ReadySeconds, p.OwnedSeconds, p.Idle, p.Lost, p.Duplicated)
		row(p.Partitions, "load", p.ReadySeconds, p.OwnedSeconds, p.Load, p.Lost, p.Duplicated)
	}
	if s := r.PerPartition; s != nil {
		row("+1 partition", "idle", 0, 0, *s, 0, 0)
	}
	tw.Flush()
	for _, p := range r.Points {
		for _, n := range p.Notes {
			fmt.Fprintf(w, "note (%d partitions): %s\n", p.Partitions, n)
		}
	}
}
