// Command bench measures dedupe-stage in one of its modes and checks every
// run against the ground truth. It prints tables, writes a JSON file, and
// exits 1 when a run lost, duplicated or dead-lettered an event, or
// failed. `go run ./bench --help` lists the modes; bench/README.md gives
// the method of each.
//
//	go run ./bench compare --events 1000000 --out bench-results/results.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
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

// A mode is one kind of measurement: its flags and its run, which fills
// its part of the results.
type mode struct {
	name, summary string
	define        func(fs *flag.FlagSet, f *flags)
	check         func(f *flags) error
	run           func(ctx context.Context, f *flags, res *Results) error
}

// modes are the harness's modes; the first is the default.
var modes = []mode{
	{"compare", "the stage against its peers in one process: raw loops (one publish per message, atomic batches, fast batches), JetStream's own dedupe, the stage with and without its filter",
		defineCompare, checkCompare, runCompareMode},
	{"state", "the state at N keys, each point in a fresh process: memory, disk, start-up from snapshots and by a full rebuild",
		defineState, checkState, runStateMode},
	{"scaleout", "scale_out as users run it: a 3-node cluster of nats-server processes, 1..N instances of the binary, optionally CPU-capped, against scale_out off",
		defineScaleOut, checkScaleOut, runScaleOutMode},
	{"handover", "a group's hand-over: instance a loaded, snapshotted and killed (or stopped), b with an empty data dir taking over",
		defineHandOver, checkHandOver, runHandOverMode},
	{"partitions", "what each partition and each instance of a large group costs: start until every partition is owned, JetStream API requests idle and under load, pulls waiting, memory, open files",
		definePartitions, checkPartitions, runPartitionsMode},
}

// flags are the options of every mode; a mode defines the ones it reads.
type flags struct {
	mode mode
	// Every mode.
	out, dir, stageEnv   string
	cpuProfile           string
	keep                 bool
	timeout, progressDur time.Duration
	commandLine, workDir string
	// The workload (compare, scaleout).
	events, keys, burstSize, payloadSize int
	repeatRatio, spanFactor              float64
	ages, keyMode                        string
	seed                                 uint64
	window                               time.Duration
	mix                                  Mix
	// The stage and the server.
	partitions, rounds     int
	syncAlways, syncWrites bool
	publish                string
	replicas               int
	ackWait                time.Duration
	// compare.
	configs                  string
	kinds                    []Kind
	warmup, latencyEvents    int
	latencyRate, latencyLoad float64
	pollEvery                time.Duration
	// state.
	stateKeys, memprofile string
	stateCounts           []int
	statePoint            int
	reopenAt              int64
	// scaleout.
	soRows, soInst, soCaps string
	soModes                []string
	soInstances            []int
	cpuCaps                []float64
	badRatio               float64
	soWarmup               time.Duration
	soBundleMax            int
	soStandbys             int
	// handover.
	hoKeys, hoCopies   int
	hoLoadTimeout      time.Duration
	hoSnapshotInterval time.Duration
	hoStop             string
	// partitions.
	ptSizes             string
	ptCounts            []int
	ptInstances, ptRate int
	ptIdle, ptLoad      time.Duration
	ptCap               float64
}

// defineCommon defines the flags of every mode.
func defineCommon(fs *flag.FlagSet, f *flags) {
	fs.StringVar(&f.out, "out", "results.json", "JSON results file")
	fs.StringVar(&f.dir, "dir", "", "scratch directory; default a new temp dir, removed at the end unless a run failed")
	fs.BoolVar(&f.keep, "keep", false, "keep the scratch directory and streams")
	fs.DurationVar(&f.timeout, "timeout", 20*time.Minute, "bound on each phase (publish, drain)")
	fs.DurationVar(&f.progressDur, "progress", 2*time.Second, "progress line interval on stderr (0: none)")
}

// defineWorkload defines the workload's flags, with the mode's defaults of
// the share of repeats and their ages.
func defineWorkload(fs *flag.FlagSet, f *flags, repeatRatio float64, ages string) {
	fs.IntVar(&f.events, "events", 200_000, "events in the timed backlog")
	fs.IntVar(&f.keys, "keys", 0, "distinct keys in the backlog (cardinality); 0: from --repeat-ratio")
	fs.Float64Var(&f.repeatRatio, "repeat-ratio", repeatRatio, "share of events that are copies of an earlier key (used when --keys is 0)")
	fs.StringVar(&f.ages, "ages", ages, "share of repeats per age class: burst (back to back), immediate (<=1s), seconds (2-60s), near (0.82-0.88W), past (1.12-1.2W, forwarded again)")
	fs.IntVar(&f.burstSize, "burst-size", 3, "extra copies in one burst")
	fs.IntVar(&f.payloadSize, "payload-size", 256, "payload bytes per event (a JSON object carrying the key as \"id\")")
	fs.Uint64Var(&f.seed, "seed", 1, "workload seed: the same seed and flags give the same events")
	fs.Float64Var(&f.spanFactor, "span-factor", 0.9, "first copies spread over span-factor*W of logical time (0 < f < 1)")
	fs.DurationVar(&f.window, "window", 0, "dedupe window W; 0: the configuration default (1h10m)")
}

// defineStage defines the stage's and the server's flags, with the mode's
// default of the server's fsync.
func defineStage(fs *flag.FlagSet, f *flags, syncAlways bool) {
	fs.IntVar(&f.partitions, "partitions", config.Default().State.Partitions, "state.partitions (and loop workers)")
	fs.BoolVar(&f.syncAlways, "sync-always", syncAlways, "nats-server: fsync every JetStream write (sync_interval: always)")
	fs.BoolVar(&f.syncWrites, "sync-writes", true, "state.sync_writes: fsync each state commit")
	fs.StringVar(&f.publish, "publish", config.PublishAuto, "output.publish: auto (as dedupe-stage run decides), atomic or async")
}

// defineProcs defines the flags of the modes that run processes on a
// 3-node cluster.
func defineProcs(fs *flag.FlagSet, f *flags) {
	fs.IntVar(&f.replicas, "replicas", 3, "replicas of every stream")
	fs.DurationVar(&f.ackWait, "ack-wait", config.Default().Input.AckWait.D(), "input.ack_wait of the instances (the pin's TTL)")
	fs.StringVar(&f.stageEnv, "stage-env", "", "comma-separated KEY=VALUE pairs added to the environment of the stage processes only (e.g. GOMEMLIMIT=130MiB)")
}

// parseFlags parses a mode's command line: the mode's name first (compare
// when args start with a flag), then its flags.
func parseFlags(args []string) (*flags, error) {
	f := &flags{mode: modes[0]}
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		found := false
		for _, m := range modes {
			if m.name == args[0] {
				f.mode, found = m, true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown mode %q; go run ./bench --help lists them", args[0])
		}
		args = args[1:]
	}
	fs := flag.NewFlagSet("bench "+f.mode.name, flag.ContinueOnError)
	defineCommon(fs, f)
	f.mode.define(fs, f)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for kv := range strings.SplitSeq(f.stageEnv, ",") {
		if k, _, ok := strings.Cut(kv, "="); f.stageEnv != "" && (!ok || k == "") {
			return nil, fmt.Errorf("--stage-env: %q, want KEY=VALUE", kv)
		}
	}
	if f.ages != "" {
		var err error
		if f.mix, err = ParseMix(f.ages); err != nil {
			return nil, err
		}
	}
	switch {
	case f.repeatRatio < 0 || f.repeatRatio >= 1:
		return nil, fmt.Errorf("--repeat-ratio %v: want 0 <= r < 1", f.repeatRatio)
	case f.events > 0 && (f.spanFactor <= 0 || f.spanFactor >= 1):
		return nil, fmt.Errorf("--span-factor %v: want 0 < f < 1", f.spanFactor)
	case f.events > 0 && f.payloadSize < 64:
		return nil, fmt.Errorf("--payload-size %d: want >= 64 (the JSON envelope)", f.payloadSize)
	case f.publish != "" && f.publish != config.PublishAuto && f.publish != config.PublishAtomic && f.publish != config.PublishAsync:
		return nil, fmt.Errorf("--publish %q: want auto, atomic or async", f.publish)
	case f.partitions < 1:
		return nil, fmt.Errorf("--partitions %d: want >= 1", f.partitions)
	case f.replicas < 0 || f.replicas > 3:
		return nil, fmt.Errorf("--replicas %d: want 1..3 (the cluster has 3 nodes)", f.replicas)
	}
	if err := f.mode.check(f); err != nil {
		return nil, err
	}
	f.commandLine = strings.TrimSpace("go run ./bench " + f.mode.name + " " + strings.Join(args, " "))
	return f, nil
}

// parseList parses the comma-separated items of flag --name with parse,
// blank items skipped (and repeated ones with unique): an item parse
// refuses, or none at all, is an error saying what the flag wants.
func parseList[T comparable](name, s, want string, unique bool, parse func(string) (T, bool)) ([]T, error) {
	var out []T
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		v, ok := parse(item)
		if !ok {
			return nil, fmt.Errorf("--%s: %q, want %s", name, item, want)
		}
		if !unique || !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--%s is empty, want %s", name, want)
	}
	return out, nil
}

// usage lists the modes.
func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: go run ./bench [MODE] [flags]   (go run ./bench MODE --help lists its flags)\n\nmodes:")
	for _, m := range modes {
		fmt.Fprintf(w, "  %-11s %s\n", m.name, m.summary)
	}
}

// Results is the JSON document the harness writes: the mode's part is set.
type Results struct {
	Command string    `json:"command"`
	Mode    string    `json:"mode"`
	Started time.Time `json:"started"`
	Machine Machine   `json:"machine"`
	// Settings name the server and state settings that shape the numbers.
	Settings   string         `json:"settings"`
	Compare    *CompareRun    `json:"compare,omitempty"`
	State      []*StatePoint  `json:"state,omitempty"`
	ScaleOut   *ScaleOutRun   `json:"scale_out,omitempty"`
	HandOver   *HandOverRun   `json:"handover,omitempty"`
	Partitions *PartitionsRun `json:"partitions,omitempty"`
	Errors     []string       `json:"errors,omitempty"`
}

func main() {
	os.Exit(realMain(os.Args[1:]))
}

func realMain(args []string) int {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		usage(os.Stdout)
		return 0
	}
	f, err := parseFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	if f.statePoint > 0 {
		return runStateChild(f)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir := f.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "dedupe-bench-"); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
	}
	f.workDir = dir
	res := &Results{Command: f.commandLine, Mode: f.mode.name, Started: time.Now().UTC(), Machine: probeMachine(dir)}
	err = f.mode.run(ctx, f, res)
	if err != nil {
		res.Errors = append(res.Errors, err.Error())
		fmt.Fprintf(os.Stderr, "bench: %s: %v\n", f.mode.name, err)
	}
	printTables(os.Stdout, res)
	ok := err == nil && res.correct(os.Stderr)
	if werr := writeJSON(f.out, res); werr != nil {
		fmt.Fprintln(os.Stderr, "bench:", werr)
		ok = false
	}
	switch {
	case !ok && f.dir == "":
		fmt.Fprintf(os.Stderr, "bench: scratch dir (logs, configurations) kept in %s\n", dir)
	case !f.keep && f.dir == "":
		os.RemoveAll(dir)
	}
	if !ok {
		return 1
	}
	return 0
}

// correct says on w which runs are not correct, and reports whether all are.
func (res *Results) correct(w io.Writer) bool {
	var bad []string
	if c := res.Compare; c != nil {
		for _, r := range c.AllRounds {
			if t := r.Correctness; !t.OK {
				bad = append(bad, fmt.Sprintf("%s (round %d): lost %d, duplicated %d, dead-lettered %d", r.Config, r.Round, t.Lost, t.Duplicated, t.DeadLettered))
			}
		}
	}
	if so := res.ScaleOut; so != nil {
		for _, r := range so.Rows {
			if c := r.Correct; !c.OK {
				bad = append(bad, fmt.Sprintf("scale-out %s: lost %d, duplicated %d, bad inputs not dead-lettered %d, extra dead letters %d", r.Row, c.Lost, c.Duplicated, c.DeadLetterLost, c.DeadLetterExtra))
			}
		}
	}
	if h := res.HandOver; h != nil && !h.OK {
		bad = append(bad, "hand-over: ground truth violated")
	}
	if p := res.Partitions; p != nil && !p.OK {
		bad = append(bad, "partitions: ground truth violated")
	}
	for _, b := range bad {
		fmt.Fprintln(w, "bench: not correct:", b)
	}
	return len(bad) == 0
}

// benchWindow is the dedupe window of the run: the configuration's
// default, or --window.
func benchWindow(f *flags) (window.Window, error) {
	cfg := config.Default()
	setWindow(&cfg, f.window)
	return cfg.Window.Derive()
}

// setWindow sets cfg's window to w (0: the default stays).
func setWindow(cfg *config.Config, w time.Duration) {
	if w > 0 {
		cfg.Window.Paths = []config.Path{{Name: "bench", Max: config.Duration(w)}}
		cfg.Window.Margin = 0
	}
}

// writeJSON writes the results.
func writeJSON(path string, res *Results) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(logOut, "wrote %s\n", path)
	return nil
}

// itoa formats a count with thousands separators.
func itoa[T int | uint64](n T) string {
	s := strconv.FormatUint(uint64(n), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// printTables writes the results as plain-text tables.
func printTables(w io.Writer, res *Results) {
	m := res.Machine
	fmt.Fprintf(w, "\nsettings: %s\n", res.Settings)
	fmt.Fprintf(w, "machine: %d CPUs (%s), %s, %s, fsync p50 %.0fµs p99 %.0fµs, %s\n", m.NumCPU, m.CPUModel, m.MemTotal, m.Disk, m.FsyncP50us, m.FsyncP99us, m.GoVersion)
	if c := res.Compare; c != nil && len(c.Results) > 0 {
		printCompare(w, c)
	}
	if len(res.State) > 0 {
		printState(w, res.State)
	}
	if res.ScaleOut != nil {
		printScaleOut(w, res.ScaleOut)
	}
	if res.HandOver != nil {
		printHandOver(w, res.HandOver)
	}
	if res.Partitions != nil {
		printPartitions(w, res.Partitions)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
