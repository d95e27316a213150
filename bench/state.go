package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// The state mode measures the store at N tracked keys: each point fills a
// store in a fresh process (so that RSS belongs to that point only),
// reopens it from its snapshots in another, and times a full rebuild. See
// the "state" section of bench/README.md.

// defineState defines the state mode's flags.
func defineState(fs *flag.FlagSet, f *flags) {
	fs.StringVar(&f.stateKeys, "keys", "1000000", "comma-separated key counts (e.g. 1000000,10000000,50000000)")
	fs.IntVar(&f.partitions, "partitions", config.Default().State.Partitions, "state.partitions")
	fs.BoolVar(&f.syncWrites, "sync-writes", true, "state.sync_writes: fsync each commit")
	fs.DurationVar(&f.window, "window", 0, "dedupe window W; 0: the configuration default (1h10m)")
	fs.StringVar(&f.memprofile, "memprofile", "", "write heap profiles of each point, after the fill to PREFIX-<keys>-fill.pprof and after the reopen to PREFIX-<keys>.pprof")
	fs.IntVar(&f.statePoint, "point", 0, "internal: measure one point of this many keys in the store at --dir and print JSON")
	fs.Int64Var(&f.reopenAt, "reopen-at", 0, "internal: with --point, only reopen the filled store at this clock time (Unix ns) and print JSON")
}

// checkState parses the key counts.
func checkState(f *flags) (err error) {
	f.stateCounts, err = parseList("keys", f.stateKeys, "key counts >= 1", false, func(s string) (int, bool) {
		n, err := strconv.Atoi(strings.ReplaceAll(s, "_", ""))
		return n, err == nil && n >= 1
	})
	return err
}

// StatePoint is the state at N tracked keys, measured in a fresh process
// so that RSS belongs to this point only.
type StatePoint struct {
	Keys       int     `json:"keys"`
	Partitions int     `json:"partitions"`
	FillSec    float64 `json:"fill_seconds"`
	FillPerSec float64 `json:"fill_keys_per_sec"`
	// FillBaseline is the filling process before the store opens;
	// AfterFill is that process with the store open right after claiming
	// N keys: Badger's table builders are still live.
	FillBaseline MemSnap `json:"mem_fill_baseline"`
	AfterFill    MemSnap `json:"mem_after_fill"`
	// Baseline is a fresh process before it opens the filled store, and
	// AfterOpen that process after opening it from its snapshots: the
	// memory a restarted stage holds for N keys.
	Baseline  MemSnap `json:"mem_baseline"`
	AfterOpen MemSnap `json:"mem_after_open"`
	// RSSPerKey is (AfterOpen.RSS - Baseline.RSS) / Keys; RSSAnonPerKey
	// and RSSFilePerKey split it into anonymous memory (Go heap, Badger's
	// memtables and caches) and file-backed memory (the touched pages of
	// Badger's memory-mapped files).
	RSSPerKey     float64 `json:"rss_bytes_per_key"`
	RSSAnonPerKey float64 `json:"rss_anon_bytes_per_key"`
	RSSFilePerKey float64 `json:"rss_file_bytes_per_key"`
	// Marginal is the RSS slope from the previous measured point to this
	// one (AfterOpen minus Baseline, per added key): what one more tracked
	// key costs, without the fixed part. Nil on the first point.
	Marginal *Slope `json:"marginal,omitempty"`
	// FileRSSByKind splits AfterOpen.RSSFile by the mapped file's kind
	// (see fileRSSByKind): which of Badger's files the open store holds in
	// memory.
	FileRSSByKind map[string]int64 `json:"rss_file_by_kind,omitempty"`
	// HeapPerKey is (AfterOpen.Heap - Baseline.Heap) / Keys.
	HeapPerKey   float64 `json:"heap_bytes_per_key"`
	FilterBytes  uint64  `json:"filter_bytes"`
	FilterPerKey float64 `json:"filter_bytes_per_key"`
	DiskBytes    int64   `json:"disk_bytes"`
	DiskApparent int64   `json:"disk_apparent_bytes"`
	DiskPerKey   float64 `json:"disk_bytes_per_key"`
	// StartupSnapshotMs is state.Open with the snapshots in place;
	// StartupRebuildMs with them removed (a full scan).
	StartupSnapshotMs float64 `json:"startup_snapshot_ms"`
	StartupRebuildMs  float64 `json:"startup_rebuild_ms"`
	RebuildScanned    uint64  `json:"rebuild_scanned"`
}

// runStateMode measures each point in its own process, in order, into
// res.
func runStateMode(ctx context.Context, f *flags, res *Results) error {
	res.Settings = fmt.Sprintf("state.Open with the stage's defaults, %d partitions, state.sync_writes=%v", f.partitions, f.syncWrites)
	var errs []error
	for _, n := range f.stateCounts {
		pdir := filepath.Join(f.workDir, fmt.Sprintf("state-%d", n))
		fmt.Fprintf(logOut, "== state: %d keys (own process, timeout %v)\n", n, f.timeout)
		pctx, cancel := context.WithTimeout(ctx, f.timeout)
		var p StatePoint
		err := child(pctx, f, &p, "--point", strconv.Itoa(n), "--dir", pdir, "--progress", f.progressDur.String())
		cancel()
		if !f.keep {
			os.RemoveAll(pdir)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("state point %d: %w", n, err))
			continue
		}
		if len(res.State) > 0 && res.State[len(res.State)-1].Keys != p.Keys {
			m := slope(res.State[len(res.State)-1], &p)
			p.Marginal = &m
		}
		res.State = append(res.State, &p)
		fmt.Fprintf(logOut, "  state %d: fill %.0fs, RSS after open %s MiB (anon %s, file %s; %.1f B/key), disk %.1f B/key, start-up %.0f ms from snapshot, %.0f ms rebuild\n",
			n, p.FillSec, mib(p.AfterOpen.RSS), mib(p.AfterOpen.RSSAnon), mib(p.AfterOpen.RSSFile), p.RSSPerKey, p.DiskPerKey, p.StartupSnapshotMs, p.StartupRebuildMs)
		fmt.Fprintf(logOut, "  state %d: after open: Go heap live %s MiB, held by the Go runtime %s MiB; file-backed RSS by file: tables %s MiB, memtable logs %s MiB, value logs %s MiB, other %s MiB\n",
			n, mib(p.AfterOpen.Heap), mib(p.AfterOpen.RuntimeHeld), mib(p.FileRSSByKind["sst"]), mib(p.FileRSSByKind["mem"]), mib(p.FileRSSByKind["vlog"]), mib(p.FileRSSByKind["other"]))
	}
	return errors.Join(errs...)
}

// child runs this binary in the state mode with the run's settings and
// args, and decodes the JSON it prints into v.
func child(ctx context.Context, f *flags, v any, args ...string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	args = append([]string{"state", "--partitions", strconv.Itoa(f.partitions), "--sync-writes=" + strconv.FormatBool(f.syncWrites),
		"--window", f.window.String(), "--memprofile", f.memprofile}, args...)
	cmd := exec.CommandContext(ctx, exe, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		return err
	}
	return json.Unmarshal(out.Bytes(), v)
}

// runStateChild is a child process of the state mode: one point, or with
// --reopen-at the reopening of its store. It prints its figures as JSON.
func runStateChild(f *flags) int {
	var v any
	var err error
	if f.reopenAt != 0 {
		v, err = stateReopen(context.Background(), f)
	} else {
		v, err = statePoint(context.Background(), f)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: state point: %v\n", err)
		return 1
	}
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
	return 0
}

// Slope is how resident memory grows between two measured points.
type Slope struct {
	// FromKeys and ToKeys are the key counts of the two points.
	FromKeys int `json:"from_keys"`
	ToKeys   int `json:"to_keys"`
	// RSSPerKey, AnonPerKey and FilePerKey are the growth of RSS, RssAnon
	// and RssFile (each after reopen, minus the point's baseline) per
	// added key.
	RSSPerKey  float64 `json:"rss_bytes_per_key"`
	AnonPerKey float64 `json:"rss_anon_bytes_per_key"`
	FilePerKey float64 `json:"rss_file_bytes_per_key"`
	// FixedRSS is the intercept of that line at 0 keys: the RSS the store
	// holds whatever the key count (Badger's memtables and caches, the
	// runtime), over the process's baseline.
	FixedRSS int64 `json:"fixed_rss_bytes"`
}

// slope is the memory growth from point a to point b (b.Keys != a.Keys).
func slope(a, b *StatePoint) Slope {
	dk := float64(b.Keys - a.Keys)
	grow := func(get func(MemSnap) int64) float64 {
		return float64((get(b.AfterOpen)-get(b.Baseline))-(get(a.AfterOpen)-get(a.Baseline))) / dk
	}
	s := Slope{
		FromKeys:   a.Keys,
		ToKeys:     b.Keys,
		RSSPerKey:  grow(func(m MemSnap) int64 { return m.RSS }),
		AnonPerKey: grow(func(m MemSnap) int64 { return m.RSSAnon }),
		FilePerKey: grow(func(m MemSnap) int64 { return m.RSSFile }),
	}
	s.FixedRSS = b.AfterOpen.RSS - b.Baseline.RSS - int64(s.RSSPerKey*float64(b.Keys))
	return s
}

// stateOptions are the store options of a point of n keys on clock.
func stateOptions(f *flags, n int, clock window.Clock) (state.Options, error) {
	cfg := config.Default()
	setWindow(&cfg, f.window)
	win, err := cfg.Window.Derive()
	if err != nil {
		return state.Options{}, err
	}
	opts := state.DefaultOptions(f.dir, win)
	opts.Partitions = f.partitions
	opts.Clock = clock
	opts.Filter.ExpectedKeys = uint(n)
	opts.Filter.FalsePositiveRate = cfg.Filter.FalsePositiveRate
	opts.Filter.Generations = cfg.Filter.Generations
	opts.MemoryBudget = int64(cfg.State.MemoryBudget)
	opts.SyncWrites = f.syncWrites
	opts.GCInterval = 0
	opts.SnapshotInterval = 0
	opts.Logger = warnLogger()
	return opts, nil
}

func statePoint(ctx context.Context, f *flags) (*StatePoint, error) {
	n := f.statePoint
	p := &StatePoint{Keys: n, Partitions: f.partitions}
	fillBaseline := readMem()

	clock := window.NewManualClock(time.Now().Truncate(time.Second))
	opts, err := stateOptions(f, n, clock)
	if err != nil {
		return nil, err
	}
	win := opts.Window
	st, err := state.Open(ctx, opts)
	if err != nil {
		return nil, err
	}

	start := time.Now()
	if err := fillState(st, opts.Partitions, clock, win.W, n, f.progressDur); err != nil {
		st.Close()
		return nil, err
	}
	p.FillSec = time.Since(start).Seconds()
	p.FillPerSec = float64(n) / p.FillSec
	p.AfterFill = readMem()
	p.FillBaseline = fillBaseline
	if f.memprofile != "" {
		if err := writeHeapProfile(fmt.Sprintf("%s-%d-fill.pprof", f.memprofile, n)); err != nil {
			st.Close()
			return nil, err
		}
	}
	if err := st.Close(); err != nil {
		return nil, err
	}
	p.DiskBytes, p.DiskApparent = diskUsage(f.dir)
	p.DiskPerKey = float64(p.DiskBytes) / float64(n)

	// Reopen from the snapshots in a fresh process: the start-up and the
	// memory of a restarted stage with N keys. In this process the
	// runtime's metadata would still be sized for the fill's peak heap.
	var r StatePoint
	if err := child(ctx, f, &r, "--point", strconv.Itoa(n), "--dir", f.dir, "--reopen-at", strconv.FormatInt(clock.Now().UnixNano(), 10)); err != nil {
		return nil, fmt.Errorf("reopen in a fresh process: %w", err)
	}
	p.Baseline, p.AfterOpen, p.FileRSSByKind = r.Baseline, r.AfterOpen, r.FileRSSByKind
	p.StartupSnapshotMs, p.FilterBytes = r.StartupSnapshotMs, r.FilterBytes
	p.FilterPerKey = float64(p.FilterBytes) / float64(n)
	p.RSSPerKey = float64(p.AfterOpen.RSS-p.Baseline.RSS) / float64(n)
	p.RSSAnonPerKey = float64(p.AfterOpen.RSSAnon-p.Baseline.RSSAnon) / float64(n)
	p.RSSFilePerKey = float64(p.AfterOpen.RSSFile-p.Baseline.RSSFile) / float64(n)
	p.HeapPerKey = float64(p.AfterOpen.Heap-p.Baseline.Heap) / float64(n)

	// Reopen without snapshots: a full rebuild.
	for i := range opts.Partitions {
		if err := os.Remove(filepath.Join(state.PartitionDir(f.dir, i), state.SnapshotFile)); err != nil {
			return nil, err
		}
	}
	// The rebuild logs at info, as the stage does, so that the log shows
	// the progress lines an operator sees during a long rebuild.
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	start = time.Now()
	st, err = state.Open(ctx, opts)
	if err != nil {
		return nil, err
	}
	p.StartupRebuildMs = ms(time.Since(start))
	for i := range st.Partitions() {
		p.RebuildScanned += st.Partition(i).FilterBuild().Scanned
	}
	if err := st.Close(); err != nil {
		return nil, err
	}
	if p.RebuildScanned != uint64(n) {
		return nil, fmt.Errorf("rebuild scanned %d records, want %d", p.RebuildScanned, n)
	}
	return p, nil
}

// fillState claims n keys into st for a point: chunks of keys, each
// chunk claimed per partition (two goroutines, one per core), the clock
// moved between chunks so that the first-seen times spread over 99% of w
// as steady traffic would.
func fillState(st *state.Store, partitions int, clock *window.ManualClock, w time.Duration, n int, progressDur time.Duration) error {
	const chunk = 1 << 14
	steps := (n + chunk - 1) / chunk
	step := w / 100 * 99 / time.Duration(steps)
	prog := startProgress(fmt.Sprintf("state %d fill", n), uint64(n), progressDur, nil)
	defer prog.end()
	claims := make([][]state.Claim, partitions)
	for from := 0; from < n; from += chunk {
		for i := range claims {
			claims[i] = claims[i][:0]
		}
		for i := from; i < min(n, from+chunk); i++ {
			k := []byte(KeyString("scl", 7, i))
			pi := state.PartitionOf(k, partitions)
			claims[pi] = append(claims[pi], state.Claim{Key: k, Fingerprint: uint64(i)})
		}
		if err := claimParallel(st, claims, 2); err != nil {
			return err
		}
		clock.Advance(step)
		prog.done.Store(uint64(min(n, from+chunk)))
	}
	return nil
}

// claimParallel claims each partition's batch, `workers` partitions at a
// time, and fails unless every claim is New.
func claimParallel(st *state.Store, claims [][]state.Claim, workers int) error {
	sem := make(chan struct{}, workers)
	errs := make([]error, len(claims))
	var wg sync.WaitGroup
	for i, batch := range claims {
		if len(batch) == 0 {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			res, err := st.Partition(i).Claim(batch)
			if j := slices.IndexFunc(res, func(r state.ClaimResult) bool { return !r.New }); err == nil && j >= 0 {
				err = fmt.Errorf("partition %d: key %q claimed twice", i, batch[j].Key)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func mib(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) }

// writeHeapProfile writes the live heap (after a GC) to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--memprofile: %w", err)
	}
	runtime.GC()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("--memprofile: %w", err)
	}
	return f.Close()
}

// stateReopen opens the point's store from its snapshots, measures it
// (Baseline, AfterOpen, FileRSSByKind, StartupSnapshotMs, FilterBytes) and
// closes it.
func stateReopen(ctx context.Context, f *flags) (*StatePoint, error) {
	r := &StatePoint{Baseline: readMem()}
	clock := window.NewManualClock(time.Unix(0, f.reopenAt))
	opts, err := stateOptions(f, f.statePoint, clock)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	st, err := state.Open(ctx, opts)
	if err != nil {
		return nil, err
	}
	r.StartupSnapshotMs = ms(time.Since(start))
	r.AfterOpen = readMem()
	r.FileRSSByKind = fileRSSByKind()
	r.FilterBytes = st.Stats().FilterBytes
	if f.memprofile != "" {
		if err := writeHeapProfile(fmt.Sprintf("%s-%d.pprof", f.memprofile, f.statePoint)); err != nil {
			st.Close()
			return nil, err
		}
	}
	return r, st.Close()
}

// printState prints the points' table.
func printState(w io.Writer, pts []*StatePoint) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	// "While writing" is the store still open right after the fill:
	// Badger's table builders are then live. The other memory columns are
	// after a reopen.
	fmt.Fprintln(tw, "keys\tfill s\tfill keys/s\twhile writing: heap / anon / peak RSS MiB\tRSS MiB (anon/file)\tRSS B/key (anon/file)\tmarginal B/key (anon/file)\theap B/key\tfilter B/key\tdisk MiB\tdisk B/key\tstart-up snapshot ms\trebuild ms\t")
	for _, p := range pts {
		marginal := "-"
		if m := p.Marginal; m != nil {
			marginal = fmt.Sprintf("%.2f (%.2f/%.2f)", m.RSSPerKey, m.AnonPerKey, m.FilePerKey)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%s / %s / %s\t%s (%s/%s)\t%.2f (%.2f/%.2f)\t%s\t%.1f\t%.2f\t%s\t%.1f\t%.0f\t%.0f\t\n", itoa(p.Keys), p.FillSec, p.FillPerSec,
			mib(p.AfterFill.Heap), mib(p.AfterFill.RSSAnon), mib(p.AfterFill.PeakRSS),
			mib(p.AfterOpen.RSS), mib(p.AfterOpen.RSSAnon), mib(p.AfterOpen.RSSFile), p.RSSPerKey, p.RSSAnonPerKey, p.RSSFilePerKey, marginal,
			p.HeapPerKey, p.FilterPerKey, mib(p.DiskBytes), p.DiskPerKey, p.StartupSnapshotMs, p.StartupRebuildMs)
	}
	tw.Flush()
	if m := pts[len(pts)-1].Marginal; m != nil {
		fmt.Fprintf(w, "marginal RSS per key between the two largest points (%d to %d keys): %.2f B (anon %.2f, file %.2f); fixed part (the line at 0 keys) %s MiB\n",
			m.FromKeys, m.ToKeys, m.RSSPerKey, m.AnonPerKey, m.FilePerKey, mib(m.FixedRSS))
	}
	fmt.Fprintln(w)
}
