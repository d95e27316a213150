package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// ScalePoint is the state at N tracked keys, measured in a fresh process
// so that RSS belongs to this point only.
type ScalePoint struct {
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
	// key costs, without the fixed part. Nil on the first measured point
	// and on extrapolated ones.
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
	// Extrapolated marks a point that did not finish within the timeout;
	// its figures are extrapolated from the largest measured point.
	Extrapolated bool   `json:"extrapolated,omitempty"`
	Note         string `json:"note,omitempty"`
}

// runScale measures each scale point in its own process, in order.
func runScale(ctx context.Context, f *flags, dir string) ([]*ScalePoint, error) {
	var pts []*ScalePoint
	var errs []error
	for s := range strings.SplitSeq(f.scale, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(strings.ReplaceAll(s, "_", "")))
		if err != nil || n < 1 {
			return pts, fmt.Errorf("--scale: bad key count %q", s)
		}
		exe, err := os.Executable()
		if err != nil {
			return pts, err
		}
		pdir := filepath.Join(dir, fmt.Sprintf("scale-%d", n))
		args := []string{"--scale-point", strconv.Itoa(n), "--scale-dir", pdir,
			"--partitions", strconv.Itoa(f.partitions), "--sync-writes=" + strconv.FormatBool(f.syncWrites),
			"--progress", f.progressEvery.String()}
		if f.memprofile != "" {
			args = append(args, "--memprofile", f.memprofile)
		}
		if f.window > 0 {
			args = append(args, "--window", f.window.String())
		}
		fmt.Fprintf(logOut, "== scale: %d keys (own process, timeout %v)\n", n, f.scaleTimeout)
		pctx, cancel := context.WithTimeout(ctx, f.scaleTimeout)
		cmd := exec.CommandContext(pctx, exe, args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, os.Stderr
		err = cmd.Run()
		timedOut := pctx.Err() != nil
		cancel()
		if !f.keep {
			os.RemoveAll(pdir)
		}
		if timedOut && ctx.Err() == nil {
			p := extrapolate(pts, n)
			if p != nil {
				p.Note = fmt.Sprintf("did not finish within %v on this machine; extrapolated linearly from the %d-key point", f.scaleTimeout, pts[len(pts)-1].Keys)
				pts = append(pts, p)
			}
			fmt.Fprintf(logOut, "  scale %d: timed out after %v\n", n, f.scaleTimeout)
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("scale point %d: %w", n, err))
			continue
		}
		var p ScalePoint
		if err := json.Unmarshal(out.Bytes(), &p); err != nil {
			errs = append(errs, fmt.Errorf("scale point %d: %w", n, err))
			continue
		}
		if prev := lastMeasured(pts); prev != nil && prev.Keys != p.Keys {
			m := slope(prev, &p)
			p.Marginal = &m
		}
		pts = append(pts, &p)
		fmt.Fprintf(logOut, "  scale %d: fill %.0fs, RSS after open %s MiB (anon %s, file %s; %.1f B/key), disk %.1f B/key, start-up %.0f ms from snapshot, %.0f ms rebuild\n",
			n, p.FillSec, mib(p.AfterOpen.RSS), mib(p.AfterOpen.RSSAnon), mib(p.AfterOpen.RSSFile), p.RSSPerKey, p.DiskPerKey, p.StartupSnapshotMs, p.StartupRebuildMs)
		fmt.Fprintf(logOut, "  scale %d: after open: Go heap live %s MiB, held by the Go runtime %s MiB, anonymous RSS %s MiB\n",
			n, mib(p.AfterOpen.Heap), mib(p.AfterOpen.RuntimeHeld), mib(p.AfterOpen.RSSAnon))
		if len(p.FileRSSByKind) > 0 {
			fmt.Fprintf(logOut, "  scale %d: file-backed RSS after open by file: tables %s MiB, memtable logs %s MiB, value logs %s MiB, other %s MiB\n",
				n, mib(p.FileRSSByKind["sst"]), mib(p.FileRSSByKind["mem"]), mib(p.FileRSSByKind["vlog"]), mib(p.FileRSSByKind["other"]))
		}
		if p.Marginal != nil {
			fmt.Fprintf(logOut, "  scale %d: marginal RSS per key since %d keys: %.2f B (anon %.2f, file %.2f); fixed part %s MiB\n",
				n, p.Marginal.FromKeys, p.Marginal.RSSPerKey, p.Marginal.AnonPerKey, p.Marginal.FilePerKey, mib(p.Marginal.FixedRSS))
		}
	}
	return pts, errors.Join(errs...)
}

// extrapolate scales the largest measured point linearly to n keys: the
// per-key figures stay, the fixed part (baseline) stays.
func extrapolate(pts []*ScalePoint, n int) *ScalePoint {
	var last *ScalePoint
	for _, p := range pts {
		if !p.Extrapolated {
			last = p
		}
	}
	if last == nil {
		return nil
	}
	k := float64(n) / float64(last.Keys)
	grow := func(m MemSnap) MemSnap {
		return MemSnap{
			RSS:     last.Baseline.RSS + int64(float64(m.RSS-last.Baseline.RSS)*k),
			RSSAnon: last.Baseline.RSSAnon + int64(float64(m.RSSAnon-last.Baseline.RSSAnon)*k),
			RSSFile: last.Baseline.RSSFile + int64(float64(m.RSSFile-last.Baseline.RSSFile)*k),
			Heap:    last.Baseline.Heap + int64(float64(m.Heap-last.Baseline.Heap)*k),
		}
	}
	return &ScalePoint{
		Keys: n, Partitions: last.Partitions, Extrapolated: true,
		FillSec: last.FillSec * k, FillPerSec: last.FillPerSec,
		Baseline: last.Baseline, AfterFill: grow(last.AfterFill), AfterOpen: grow(last.AfterOpen),
		RSSPerKey: last.RSSPerKey, RSSAnonPerKey: last.RSSAnonPerKey, RSSFilePerKey: last.RSSFilePerKey,
		HeapPerKey:  last.HeapPerKey,
		FilterBytes: uint64(float64(last.FilterBytes) * k), FilterPerKey: last.FilterPerKey,
		DiskBytes: int64(float64(last.DiskBytes) * k), DiskPerKey: last.DiskPerKey,
		StartupSnapshotMs: last.StartupSnapshotMs * k, StartupRebuildMs: last.StartupRebuildMs * k,
	}
}

// Slope is how resident memory grows between two measured scale points.
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
func slope(a, b *ScalePoint) Slope {
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

// lastMeasured is the last point of pts that is not extrapolated, or nil.
func lastMeasured(pts []*ScalePoint) *ScalePoint {
	for i := len(pts) - 1; i >= 0; i-- {
		if !pts[i].Extrapolated {
			return pts[i]
		}
	}
	return nil
}

// marginalPerKey is the RSS slope between the two largest measured scale
// points: what one more tracked key costs, without the fixed part.
func marginalPerKey(pts []*ScalePoint) float64 {
	if p := lastMeasured(pts); p != nil && p.Marginal != nil {
		return p.Marginal.RSSPerKey
	}
	return 0
}

// runScalePoint is the child process of one scale point: it fills a store
// with N keys spread over the window, measures it open, closes it,
// measures the disk, and times two reopenings (snapshot, rebuild). It
// prints the ScalePoint as JSON on stdout.
func runScalePoint(f *flags) int {
	p, err := scalePoint(context.Background(), f)
	return printChild("scale point", p, err)
}

// printChild ends a child process of the scale mode: v as JSON on stdout
// and exit code 0, or err on stderr and 1.
func printChild(what string, v any, err error) int {
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %s: %v\n", what, err)
		return 1
	}
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
	return 0
}

// scaleOptions are the store options of a scale point of n keys on clock.
func scaleOptions(f *flags, n int, clock window.Clock) (state.Options, error) {
	cfg := config.Default()
	if f.window > 0 {
		cfg.Window.Paths = []config.Path{{Name: "bench", Max: config.Duration(f.window)}}
		cfg.Window.Margin = 0
	}
	win, err := cfg.Window.Derive()
	if err != nil {
		return state.Options{}, err
	}
	opts := state.DefaultOptions(f.scaleDir, win)
	opts.Partitions = f.partitions
	opts.Clock = clock
	opts.Filter.ExpectedKeys = uint(n)
	opts.Filter.FalsePositiveRate = cfg.Filter.FalsePositiveRate
	opts.Filter.Generations = cfg.Filter.Generations
	opts.MemoryBudget = int64(cfg.State.MemoryBudget)
	opts.SyncWrites = f.syncWrites
	opts.GCInterval = 0
	opts.SnapshotInterval = 0
	opts.Logger = warnLogger(os.Stderr)
	return opts, nil
}

func scalePoint(ctx context.Context, f *flags) (*ScalePoint, error) {
	n := f.scalePoint
	p := &ScalePoint{Keys: n, Partitions: f.partitions}
	fillBaseline := readMem()

	clock := window.NewManualClock(time.Now().Truncate(time.Second))
	opts, err := scaleOptions(f, n, clock)
	if err != nil {
		return nil, err
	}
	win := opts.Window
	st, err := state.Open(ctx, opts)
	if err != nil {
		return nil, err
	}

	start := time.Now()
	if err := fillScale(st, opts.Partitions, clock, win.W, n, f.progressEvery); err != nil {
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
	p.DiskBytes, p.DiskApparent = diskUsage(f.scaleDir)
	p.DiskPerKey = float64(p.DiskBytes) / float64(n)

	// Reopen from the snapshots in a fresh process: the start-up and the
	// memory of a restarted stage with N keys. In this process the
	// runtime's metadata would still be sized for the fill's peak heap.
	r, err := reopenInChild(ctx, f, clock.Now())
	if err != nil {
		return nil, err
	}
	p.Baseline, p.AfterOpen, p.FileRSSByKind = r.Baseline, r.AfterOpen, r.FileRSSByKind
	p.StartupSnapshotMs = r.StartupMs
	p.FilterBytes = r.FilterBytes
	p.FilterPerKey = float64(p.FilterBytes) / float64(n)
	p.RSSPerKey = float64(p.AfterOpen.RSS-p.Baseline.RSS) / float64(n)
	p.RSSAnonPerKey = float64(p.AfterOpen.RSSAnon-p.Baseline.RSSAnon) / float64(n)
	p.RSSFilePerKey = float64(p.AfterOpen.RSSFile-p.Baseline.RSSFile) / float64(n)
	p.HeapPerKey = float64(p.AfterOpen.Heap-p.Baseline.Heap) / float64(n)

	// Reopen without snapshots: a full rebuild.
	for i := range opts.Partitions {
		if err := os.Remove(filepath.Join(state.PartitionDir(f.scaleDir, i), state.SnapshotFile)); err != nil {
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

// fillScale claims n keys into st for a scale point: chunks of keys, each
// chunk claimed per partition (two goroutines, one per core), the clock
// moved between chunks so that the first-seen times spread over 99% of w
// as steady traffic would.
func fillScale(st *state.Store, partitions int, clock *window.ManualClock, w time.Duration, n int, progressEvery time.Duration) error {
	const chunk = 1 << 14
	steps := (n + chunk - 1) / chunk
	step := w / 100 * 99 / time.Duration(steps)
	prog := startProgress(fmt.Sprintf("scale %d fill", n), uint64(n), progressEvery, nil)
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
	next := make(chan int, len(claims))
	for i := range claims {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	errs := make([]error, len(claims))
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if len(claims[i]) == 0 {
					continue
				}
				res, err := st.Partition(i).Claim(claims[i])
				if err != nil {
					errs[i] = err
					continue
				}
				for j, r := range res {
					if !r.New {
						errs[i] = fmt.Errorf("partition %d: key %q claimed twice", i, claims[i][j].Key)
						break
					}
				}
			}
		}()
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

// Reopen is what the process that reopens a filled store measures.
type Reopen struct {
	Baseline      MemSnap          `json:"mem_baseline"`
	AfterOpen     MemSnap          `json:"mem_after_open"`
	FileRSSByKind map[string]int64 `json:"rss_file_by_kind,omitempty"`
	StartupMs     float64          `json:"startup_ms"`
	FilterBytes   uint64           `json:"filter_bytes"`
}

// reopenInChild runs this binary with --scale-reopen-at to reopen the
// scale point's store from its snapshots at clock time now.
func reopenInChild(ctx context.Context, f *flags, now time.Time) (*Reopen, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"--scale-point", strconv.Itoa(f.scalePoint), "--scale-dir", f.scaleDir,
		"--scale-reopen-at", strconv.FormatInt(now.UnixNano(), 10),
		"--partitions", strconv.Itoa(f.partitions), "--sync-writes=" + strconv.FormatBool(f.syncWrites)}
	if f.window > 0 {
		args = append(args, "--window", f.window.String())
	}
	if f.memprofile != "" {
		args = append(args, "--memprofile", f.memprofile)
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("reopen in a fresh process: %w", err)
	}
	var r Reopen
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return nil, fmt.Errorf("reopen in a fresh process: %w", err)
	}
	return &r, nil
}

// runScaleReopen is the child process of reopenInChild: it opens the store
// from its snapshots, measures, closes it and prints a Reopen as JSON.
func runScaleReopen(f *flags) int {
	r, err := scaleReopen(context.Background(), f)
	return printChild("scale reopen", r, err)
}

func scaleReopen(ctx context.Context, f *flags) (*Reopen, error) {
	r := &Reopen{Baseline: readMem()}
	clock := window.NewManualClock(time.Unix(0, f.scaleReopenAt))
	opts, err := scaleOptions(f, f.scalePoint, clock)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	st, err := state.Open(ctx, opts)
	if err != nil {
		return nil, err
	}
	r.StartupMs = ms(time.Since(start))
	r.AfterOpen = readMem()
	r.FileRSSByKind = fileRSSByKind()
	r.FilterBytes = st.Stats().FilterBytes
	if f.memprofile != "" {
		if err := writeHeapProfile(fmt.Sprintf("%s-%d.pprof", f.memprofile, f.scalePoint)); err != nil {
			st.Close()
			return nil, err
		}
	}
	return r, st.Close()
}
