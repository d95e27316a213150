package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/handover"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// The scale-out mode (--scaleout) measures dedupe-stage as users run it
// with scale_out on: three nats-server processes forming one cluster on
// loopback, replicated file streams, and the stage as 1..N processes of
// the real binary, each optionally capped to a CPU quota. See the "Scale-out
// mode" section of bench/README.md.

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
	// soRefresh, after a mode (subject-refresh), runs that mode's row
	// with window.refresh_on_repeat (the sliding window): with scale_out
	// on, each repeat the store judges writes a key-state record to the
	// output stream in the batch's fenced publish.
	soRefresh = "-refresh"
)

// soMaxKeyLength is key.max_length of the instances: the workload's keys
// are 32 bytes, and a bad input with the key as a subject token carries a
// longer token.
const soMaxKeyLength = 64

// headerBad carries the index of a bad input, so that its dead letter maps
// back to it.
const headerBad = "Bench-Bad"

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

// rowMode names a row's mode as --scaleout-rows does: the mode, with
// soRefresh after it when the row runs window.refresh_on_repeat.
func rowMode(mode string, refresh bool) string {
	if refresh {
		return mode + soRefresh
	}
	return mode
}

// planRows returns the rows to run: for each CPU cap, the modes in the
// order given (the reference, off, one instance; header and subject at
// each instance count), a mode's refresh row (its name followed by
// soRefresh) right after the same row without refresh when both are
// given; with rounds above 1, all of them again in each round, so that a
// ratio's rows run side by side in every round, the order rotated each
// round (round 2 starts with the second row), so that no row always runs
// first or right after the largest.
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
			both := !refresh && slices.Contains(modes, m+soRefresh)
			counts := instances
			if mode == soOff {
				counts = []int{1}
			}
			for _, n := range counts {
				rows = append(rows, soRow{mode: mode, refresh: refresh, instances: n, cap: c})
				if both {
					rows = append(rows, soRow{mode: mode, refresh: true, instances: n, cap: c})
				}
			}
		}
	}
	return rows
}

// ScaleOutRun is what the scale-out mode measured.
type ScaleOutRun struct {
	// Cluster describes the servers and streams.
	Cluster  string          `json:"cluster"`
	Workload ScaleOutLoad    `json:"workload"`
	Rows     []*ScaleOutRow  `json:"rows"`
	Ratios   []ScaleOutRatio `json:"ratios,omitempty"`
	// Refresh is window.refresh_on_repeat's cost: each refresh row
	// against the same row without refresh.
	Refresh []ScaleOutRefresh `json:"refresh,omitempty"`
	// CgroupError says why the CPU caps could not be applied ("" when
	// they were, or none was asked for).
	CgroupError string `json:"cgroup_error,omitempty"`
	// Dir holds the binaries, the cluster's store and every log; it is
	// removed at the end unless Kept (--keep, --dir, or a failure).
	Dir  string `json:"dir"`
	Kept bool   `json:"dir_kept"`
}

// ScaleOutLoad describes the scale-out workload.
type ScaleOutLoad struct {
	// Events is every event of the timed backlog: Keyed plus Bad.
	Events int `json:"events"`
	Keyed  int `json:"keyed_events"`
	Keys   int `json:"keys"`
	// Bad is the events without a usable key (no key header; with the key
	// as a subject token, a token longer than key.max_length): each must
	// be dead-lettered once.
	Bad int `json:"bad_events"`
	// Repeats is the keyed events beyond each key's first: Keyed - Keys.
	Repeats      int    `json:"repeats"`
	Mix          string `json:"mix"`
	PayloadBytes int    `json:"payload_bytes"`
	Seed         uint64 `json:"seed"`
	Partitions   int    `json:"partitions"`
}

// ScaleOutRow is one row's result.
type ScaleOutRow struct {
	Row  string `json:"row"`
	Mode string `json:"mode"`
	// Refresh tells whether the instances ran window.refresh_on_repeat.
	Refresh   bool    `json:"refresh_on_repeat"`
	Instances int     `json:"instances"`
	CPUCap    float64 `json:"cpu_cap_cores"`
	// Round is the row's round with --rounds above 1 (1..), else 0.
	Round int `json:"round,omitempty"`
	// Capped is false when a cap was asked for and could not be applied.
	Capped bool `json:"capped"`
	// RouteStep tells whether the route step ran; Publish how the
	// instances published their output: atomic (batches, fenced with
	// scale_out on) or async (one publish per message).
	RouteStep bool   `json:"route_step"`
	Publish   string `json:"output_publish"`
	// WarmupSeconds is the time the group took, before the backlog, to
	// share the partitions (new keys published in rounds until it did).
	WarmupSeconds float64 `json:"warmup_seconds"`
	// Spread is the partitions each instance owned when the drain began.
	Spread []int `json:"partitions_owned_at_start,omitempty"`
	// PublishSeconds is the backlog's publish, with the group's consumers
	// paused (untimed).
	PublishSeconds float64 `json:"publish_seconds"`
	// DrainSeconds is from resuming the consumers to every consumer of
	// the group having acknowledged everything.
	DrainSeconds float64 `json:"drain_seconds"`
	// Drained is the backlog events still waiting in the consumers when
	// they were resumed: every event unless the pause leaked (noted).
	Drained int `json:"drained_events"`
	// EventsPerSec is Drained / DrainSeconds.
	EventsPerSec float64 `json:"events_per_sec"`
	// StageCPUMicrosPerEvent is the CPU of every instance over the drain
	// (/proc/<pid>/stat utime + stime), per drained event.
	StageCPUMicrosPerEvent float64 `json:"stage_cpu_us_per_event"`
	// ServerCPUMicrosPerEvent is the same for the three nats-servers.
	ServerCPUMicrosPerEvent float64 `json:"server_cpu_us_per_event"`
	// OtherCores is the CPU the rest of the machine (neither the stage nor
	// the servers) used during the drain, in cores.
	OtherCores float64          `json:"other_cores"`
	PerInst    []ScaleOutInst   `json:"instances_detail"`
	Stage      ScaleOutInternal `json:"stage_internals"`
	Correct    ScaleOutCorrect  `json:"correctness"`
	Notes      []string         `json:"notes,omitempty"`
}

// ScaleOutInst is one instance's share of a drain.
type ScaleOutInst struct {
	Name       string  `json:"name"`
	CPUSeconds float64 `json:"cpu_seconds"`
	Cores      float64 `json:"cores"`
	// Judged is the input messages its partitions judged
	// (dedupe_messages_total); CPUMicrosPerJudged its CPU per one.
	Judged             float64 `json:"judged"`
	CPUMicrosPerJudged float64 `json:"cpu_us_per_judged"`
	Routed             float64 `json:"routed"`
	PartitionsOwned    float64 `json:"partitions_owned_at_end"`
	Takeovers          float64 `json:"takeovers"`
}

// ScaleOutInternal is read from the instances' /metrics, the difference
// over the drain, summed over the instances.
type ScaleOutInternal struct {
	// Batches and MeanBatchSize: dedupe_batch_messages, messages per
	// partition batch; NewPerBatch: messages forwarded per batch (the
	// output batch).
	Batches       float64 `json:"batches"`
	MeanBatchSize float64 `json:"mean_batch_size"`
	NewPerBatch   float64 `json:"new_per_batch"`
	// A batch's output publish until every PubAck (dedupe_publish_seconds)
	// and its state commit (dedupe_commit_seconds): mean and the upper
	// bound of the bucket holding p99.
	PublishMeanMs float64 `json:"publish_mean_ms"`
	PublishP99Ms  float64 `json:"publish_p99_ms"`
	CommitMeanMs  float64 `json:"commit_mean_ms"`
	CommitP99Ms   float64 `json:"commit_p99_ms"`
	// RoutedPerSec is dedupe_route_messages_total{outcome="routed"} over
	// the drain time.
	RoutedPerSec float64 `json:"routed_per_sec"`
	// CopiesPerRouted is dedupe_route_copies_per_message's mean: the
	// inputs one routed message (a bundle or a copy alone) carries.
	CopiesPerRouted float64 `json:"copies_per_routed_message"`
	// Takeovers is partitions taken over during the drain (a partition
	// that moves pauses).
	Takeovers   float64 `json:"takeovers"`
	FenceRefuse float64 `json:"fence_refusals"`
}

// ScaleOutCorrect compares the output and dead-letter streams with the
// ground truth: every key of the warm-up and of the backlog once, every
// bad input dead-lettered once, nothing else; fence messages and
// key-state records counted apart.
type ScaleOutCorrect struct {
	Expected int `json:"expected_forwards"`
	// Output is the forwards in the output stream: its messages but the
	// fences and key-state records.
	Output int `json:"output_messages"`
	Fences int `json:"fence_messages"`
	// KeyState is the key-state records (handover.KeyStateSubject) in the
	// output stream: with window.refresh_on_repeat in a group, one per
	// repeat the store judged (a later copy of a key new in the same
	// batch writes none).
	KeyState   int `json:"key_state_records"`
	Lost       int `json:"lost"`
	Duplicated int `json:"duplicated"`
	// DeadLetterWant is the bad inputs; DeadLetterLost and
	// DeadLetterExtra the ones not dead-lettered, and dead letters beyond
	// one per bad input (including any of a good input).
	DeadLetterWant  int  `json:"dead_letter_expected"`
	DeadLettered    int  `json:"dead_lettered"`
	DeadLetterLost  int  `json:"dead_letter_lost"`
	DeadLetterExtra int  `json:"dead_letter_extra"`
	OK              bool `json:"ok"`
}

// ScaleOutRatio holds, for one CPU cap, the ratios issue 22's targets are
// stated in (0 where a row did not run).
type ScaleOutRatio struct {
	CPUCap float64 `json:"cpu_cap_cores"`
	// Round is the round the ratios are of (1..), with --rounds above 1;
	// 0 for a single round, or for the medians of every round's ratios
	// (MedianOf rounds).
	Round    int `json:"round,omitempty"`
	MedianOf int `json:"median_of_rounds,omitempty"`
	// HeaderVsOff and SubjectVsOff: events/s of one instance with
	// scale_out on over off (targets >= 0.5 and >= 0.8).
	HeaderVsOff  float64 `json:"header_1_vs_off"`
	SubjectVsOff float64 `json:"subject_1_vs_off"`
	// Header and Subject 2 and 3 instances over 1 (targets when capped:
	// >= 1.7 and >= 2.5).
	Header2v1  float64 `json:"header_2_vs_1"`
	Header3v1  float64 `json:"header_3_vs_1"`
	Subject2v1 float64 `json:"subject_2_vs_1"`
	Subject3v1 float64 `json:"subject_3_vs_1"`
	// CPU µs per event of one instance with scale_out on over off
	// (target <= 2).
	CPUHeaderVsOff  float64 `json:"cpu_per_event_header_1_vs_off"`
	CPUSubjectVsOff float64 `json:"cpu_per_event_subject_1_vs_off"`
}

// ScaleOutRefresh is window.refresh_on_repeat's cost in one row: the row
// with refresh (Mode, Instances, CPUCap) against the same row without,
// run in the same round.
type ScaleOutRefresh struct {
	Mode      string  `json:"mode"`
	Instances int     `json:"instances"`
	CPUCap    float64 `json:"cpu_cap_cores"`
	// Round is the round of both rows (1..), with --rounds above 1; 0 for
	// a single round, or for the medians of every round's figures
	// (MedianOf rounds).
	Round    int `json:"round,omitempty"`
	MedianOf int `json:"median_of_rounds,omitempty"`
	// EventsVsWithout is events/s with refresh over without.
	EventsVsWithout float64 `json:"events_per_sec_vs_without"`
	// StageCPUPerRepeat and ServerCPUPerRepeat are the CPU µs the
	// instances and the three nats-servers spent beyond the row without
	// refresh, per repeat of the backlog.
	StageCPUPerRepeat  float64 `json:"stage_cpu_us_per_repeat"`
	ServerCPUPerRepeat float64 `json:"server_cpu_us_per_repeat"`
	// KeyStatePerRepeat is the refresh row's key-state records in the
	// output per repeat of the backlog (0 with scale_out off, which
	// writes none; below 1 as far as repeats arrive in the same batch as
	// their key's first copy).
	KeyStatePerRepeat float64 `json:"key_state_records_per_repeat"`
}

// soEnv is what every row shares.
type soEnv struct {
	f        *flags
	cs       *children
	cl       *natsCluster
	js       jetstream.JetStream
	thr      *Workload
	bad      int
	stageBin string
	dir      string
	capErr   error
	warmKeys int // warm-up keys published so far, over all rows
}

// runScaleOut runs the scale-out rows. Every process it starts is stopped
// and every cgroup removed before it returns.
func runScaleOut(ctx context.Context, f *flags, w time.Duration, dir string) (*ScaleOutRun, error) {
	run := &ScaleOutRun{Dir: dir}
	cs := &children{}
	defer cs.closeAll()

	thr, load, err := scaleOutWorkload(f, w)
	if err != nil {
		return nil, err
	}
	run.Workload = load
	bad := load.Bad

	binDir := filepath.Join(dir, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return nil, err
	}
	env := &soEnv{f: f, cs: cs, thr: thr, bad: bad, dir: dir,
		stageBin: filepath.Join(binDir, "dedupe-stage")}
	natsBin := filepath.Join(binDir, "nats-server")
	fmt.Fprintf(logOut, "building dedupe-stage and nats-server into %s\n", binDir)
	if err := buildBinary(ctx, env.stageBin, "github.com/dedupe-stage/dedupe-stage/cmd/dedupe-stage"); err != nil {
		return nil, err
	}
	if err := buildBinary(ctx, natsBin, "github.com/nats-io/nats-server/v2"); err != nil {
		return nil, err
	}
	if slices.ContainsFunc(f.cpuCaps, func(c float64) bool { return c > 0 }) {
		env.capErr = probeCgroup()
		if env.capErr != nil {
			run.CgroupError = env.capErr.Error()
			fmt.Fprintf(logOut, "warning: CPU caps cannot be applied, every instance runs uncapped: %v\n", env.capErr)
		}
	}

	clDir := filepath.Join(dir, "cluster")
	if err := os.MkdirAll(clDir, 0o755); err != nil {
		return nil, err
	}
	fmt.Fprintf(logOut, "starting 3 nats-server processes (sync_always=%v) in %s\n", f.syncAlways, clDir)
	if env.cl, err = startCluster(ctx, cs, natsBin, clDir, 3, f.syncAlways); err != nil {
		return nil, err
	}
	nc, err := nats.Connect(env.cl.urls(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	if env.js, err = jetstream.New(nc); err != nil {
		return nil, err
	}
	sync := "no fsync per message (sync_interval default)"
	if f.syncAlways {
		sync = "fsync per message (sync_interval: always)"
	}
	run.Cluster = fmt.Sprintf("3 nats-server processes (%s) on loopback, %s; R%d file streams; stage: %d partitions, state.sync_writes=%v, input.ack_wait %v, scale_out.route_bundle_max %d",
		nc.ConnectedServerVersion(), sync, f.replicas, f.partitions, f.syncWrites, f.soAckWait, f.soBundleMax)

	for i, row := range planRows(f.soModes, f.soInstances, f.cpuCaps, f.rounds) {
		if err := ctx.Err(); err != nil {
			return run, err
		}
		r, err := env.runRow(ctx, i, row)
		if r != nil {
			run.Rows = append(run.Rows, r)
		}
		if err != nil {
			return run, fmt.Errorf("%s: %w", row, err)
		}
		c := r.Correct
		fmt.Fprintf(logOut, "  %s: %.0f events/s; expected %d forwards, output %d (+%d fence messages, +%d key-state records), lost %d, duplicated %d; dead-lettered %d of %d bad inputs (+%d extra)\n",
			row, r.EventsPerSec, c.Expected, c.Output, c.Fences, c.KeyState, c.Lost, c.Duplicated, c.DeadLettered-c.DeadLetterExtra, c.DeadLetterWant, c.DeadLetterExtra)
	}
	run.Ratios = scaleOutRatios(run.Rows, f.cpuCaps, f.rounds)
	run.Refresh = refreshCosts(run.Rows, load.Repeats, f.rounds)
	return run, nil
}

// scaleOutWorkload generates the keyed events of the scale-out backlog;
// load describes the whole backlog, bad inputs included.
func scaleOutWorkload(f *flags, w time.Duration) (*Workload, ScaleOutLoad, error) {
	bad := int(math.Round(float64(f.events) * f.badRatio))
	keyed := f.events - bad
	nkeys := f.keys
	if nkeys == 0 {
		nkeys = int(math.Round(float64(keyed) * (1 - f.repeatRatio)))
	}
	span := time.Duration(f.spanFactor * float64(w))
	thr, err := Generate(Spec{Prefix: "thr", Seed: f.seed, Events: keyed, Keys: nkeys, Mix: f.mix,
		BurstSize: f.burstSize, PayloadSize: f.payloadSize, W: w, Span: span})
	if err != nil {
		return nil, ScaleOutLoad{}, fmt.Errorf("workload: %w", err)
	}
	if len(thr.Late) > 0 {
		return nil, ScaleOutLoad{}, errors.New("workload: the scale-out mode has no late phase (the stage runs on the wall clock)")
	}
	load := ScaleOutLoad{Events: f.events, Keyed: keyed, Keys: thr.Keys, Bad: bad, Repeats: keyed - thr.Keys, Mix: f.mix.String(),
		PayloadBytes: f.payloadSize, Seed: f.seed, Partitions: f.partitions}
	return thr, load, nil
}

// probeCgroup checks that the cgroup v1 cpu controller takes a new group
// with a quota.
func probeCgroup() error {
	dir := filepath.Join(cgroupRoot, fmt.Sprintf("dedupe-bench-%d-probe", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("cgroup v1 cpu controller: %w", err)
	}
	defer os.Remove(dir)
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.Itoa(cgroupPeriod)), 0); err != nil {
		return fmt.Errorf("cgroup v1 cpu controller: %w", err)
	}
	return nil
}

// soNames are a row's streams, subjects and group.
type soNames struct {
	token                          string
	input, output, dlq, routed     string
	inSubjects, outPrefix, dlqSubj string
	routedSubj, group, consumer    string
}

func namesForRow(i int) soNames {
	t := "so" + strconv.Itoa(i)
	return soNames{
		token: t,
		input: "BSO_IN_" + strconv.Itoa(i), output: "BSO_OUT_" + strconv.Itoa(i), dlq: "BSO_DLQ_" + strconv.Itoa(i),
		routed:     "BSO_ROUTED_" + strconv.Itoa(i),
		inSubjects: "in." + t + ".*", outPrefix: "out_" + t, dlqSubj: "dlq." + t,
		routedSubj: "routed." + t, group: "bso" + strconv.Itoa(i), consumer: "bso" + strconv.Itoa(i),
	}
}

// instance is one dedupe-stage process of a row.
type instance struct {
	name    string
	cfgPath string
	addr    string // HTTP (metrics) address
	proc    *child
	capped  bool
}

// yaml returns the configuration of instance name of row.
func (e *soEnv) yaml(row soRow, n soNames, name, dataDir, addr string) string {
	key := fmt.Sprintf("  source: header\n  header: %s\n", headerKey)
	if row.mode == soSubject {
		key = "  source: subject\n  subject_token: 3\n"
	}
	// The ground truth is the same with window.refresh_on_repeat. The
	// stage runs on the wall clock and the backlog waits in paused
	// consumers, so every copy is judged during the drain, within the
	// drain's time of its key's first copy (the workload's ages only set
	// the publish order; scaleOutFlags refuses ages near or past W). While
	// the drain is shorter than W (1h10m unless --window; noted when it
	// is not, which would break every row's truth), no copy reaches its
	// key's window end, the one thing refresh moves: a repeat is a repeat
	// with refresh or without.
	window := ""
	if e.f.window > 0 {
		window = fmt.Sprintf("  paths: [{name: bench, max: %s}]\n  margin: 0s\n", e.f.window)
	}
	if row.refresh {
		window += "  refresh_on_repeat: true\n"
	}
	if window != "" {
		window = "window:\n" + window
	}
	expected := max(config.Default().Filter.ExpectedKeys, uint64(e.thr.Keys+e.warmKeys+100_000))
	return fmt.Sprintf(`nats:
  url: %q
  create_streams: true
key:
%s  max_length: %d
input:
  stream: %s
  subjects: [%q]
  consumer: %s
  ack_wait: %s
output:
  stream: %s
  subject_prefix: %s
  publish: %s
dead_letter:
  stream: %s
  subject: %s
%sstate:
  data_dir: %q
  partitions: %d
  sync_writes: %v
filter:
  expected_keys: %d
http:
  addr: %q
log:
  level: info
  format: text
scale_out:
  enabled: %v
  group: %s
  instance: %s
  replicas: %d
  routed_stream: %s
  routed_subject: %s
  route_bundle_max: %d
`, e.cl.urls(), key, soMaxKeyLength, n.input, n.inSubjects, n.consumer, e.f.soAckWait, n.output, n.outPrefix, e.f.publish, n.dlq, n.dlqSubj,
		window, dataDir, e.f.partitions, e.f.syncWrites, expected, addr,
		row.mode != soOff, n.group, name, e.f.replicas, n.routed, n.routedSubj, e.f.soBundleMax)
}

// msg returns the input message of key i of prefix (a workload key).
func (n soNames) msg(mode, key string, i, payloadSize int) *nats.Msg {
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
func (n soNames) badMsg(mode string, j int) *nats.Msg {
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
	n        soNames
	rowDir   string
	res      *ScaleOutRow
	insts    []*instance
	cfg      config.Config // the instances' configuration (the last one's: they differ by name, data dir and address)
	hjs      jetstream.JetStream
	cons     []soConsumer // the group's consumers, found by the warm-up
	warmFrom int          // e.warmKeys before the row's warm-up
	before   []series     // each instance's metrics before the drain
}

// runRow runs one row: create the streams, start the instances, warm the
// group up until it shares the partitions, pause its consumers, publish the
// backlog, resume them and time the drain, stop the instances, check the
// ground truth, delete the streams.
func (e *soEnv) runRow(ctx context.Context, idx int, row soRow) (*ScaleOutRow, error) {
	fmt.Fprintf(logOut, "== scale-out %s\n", row)
	r := &soRowRun{soEnv: e, idx: idx, row: row, n: namesForRow(idx),
		res: &ScaleOutRow{Row: row.String(), Mode: row.mode, Refresh: row.refresh, Instances: row.instances, CPUCap: row.cap, Round: row.round}}
	if err := r.configure(); err != nil {
		return nil, err
	}
	if !e.f.keep {
		defer e.deleteRow(r.n, r.cfg)
	}
	// 1. The streams, created as the stage would (stage.StreamsToCreate)
	// but with --replicas, so that every row writes to replicated streams.
	if err := e.createStreams(ctx, r.cfg); err != nil {
		return nil, err
	}
	defer func() {
		for _, in := range r.insts {
			if in.proc != nil {
				e.cs.release(in.proc, 30*time.Second)
			}
		}
	}()
	for _, phase := range []func(context.Context) error{r.start, r.warmUp, r.publishBacklog, r.drain, r.stopAndVerify} {
		if err := phase(ctx); err != nil {
			return nil, err
		}
	}
	return r.res, nil
}

// configure writes each instance's configuration and notes what the row
// runs: the route step or not, and how the output is published.
func (r *soRowRun) configure() error {
	r.rowDir = filepath.Join(r.dir, "rows", fmt.Sprintf("%02d-%s", r.idx, strings.ReplaceAll(r.row.String(), " ", "-")))
	if err := os.MkdirAll(r.rowDir, 0o755); err != nil {
		return err
	}
	ports, err := proctest.Ports(r.row.instances)
	if err != nil {
		return err
	}
	r.insts = make([]*instance, r.row.instances)
	for k := range r.insts {
		name := "i" + strconv.Itoa(k)
		in := &instance{name: name, cfgPath: filepath.Join(r.rowDir, name+".yaml"), addr: fmt.Sprintf("127.0.0.1:%d", ports[k])}
		y := r.yaml(r.row, r.n, name, filepath.Join(r.rowDir, name+"-data"), in.addr)
		if err := os.WriteFile(in.cfgPath, []byte(y), 0o644); err != nil {
			return err
		}
		c, err := config.Parse([]byte(y))
		if err != nil {
			return fmt.Errorf("%s: %w", in.cfgPath, err)
		}
		if err := c.Validate(); err != nil {
			return fmt.Errorf("%s: %w", in.cfgPath, err)
		}
		r.cfg = c
		r.insts[k] = in
	}
	res := r.res
	if routed, why := r.cfg.ScaleOutPartitioning().Routed(); r.cfg.ScaleOut.Enabled {
		res.RouteStep = routed
		if routed != (r.row.mode == soHeader) {
			res.Notes = append(res.Notes, "route step "+strconv.FormatBool(routed)+": "+why)
		}
	}
	// The output stream allows atomic publish (stage.StreamsToCreate).
	res.Publish = config.PublishAsync
	if atomic, _ := r.cfg.PublishAtomic(true); atomic {
		res.Publish = config.PublishAtomic
	}
	return nil
}

// start starts the instances: the first alone, then the others.
func (r *soRowRun) start(ctx context.Context) error {
	res := r.res
	res.Capped = r.row.cap > 0
	for k, in := range r.insts {
		if err := r.startInstance(ctx, r.row, r.idx, in, r.rowDir); err != nil {
			return err
		}
		res.Capped = res.Capped && in.capped
		if k == 0 || k == len(r.insts)-1 {
			for _, in := range r.insts[:k+1] {
				if err := waitReady(ctx, in, 60*time.Second); err != nil {
					return err
				}
			}
		}
	}
	if r.row.cap > 0 && !res.Capped {
		res.Notes = append(res.Notes, "not capped: "+r.capErr.Error())
	}
	return nil
}

// warmUp publishes new keys in rounds until the group shares the
// partitions.
func (r *soRowRun) warmUp(ctx context.Context) error {
	var err error
	if r.hjs, err = jetstream.New(r.js.Conn(), jetstream.WithPublishAsyncMaxPending(4096)); err != nil {
		return err
	}
	res, start := r.res, time.Now()
	r.warmFrom = r.warmKeys
	for {
		if r.cons, err = r.warmRound(ctx, r.hjs, r.row, r.n, r.insts, r.cfg); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		res.Spread = r.spread(ctx, r.insts, r.cfg)
		if !r.cfg.ScaleOut.Enabled || res.Spread != nil {
			break
		}
		if time.Since(start) > r.f.soWarmup {
			res.Spread = r.owned(ctx, r.insts)
			res.Notes = append(res.Notes, fmt.Sprintf("the instances did not share the partitions within --scaleout-warmup %v (owned %v); measured as it was", r.f.soWarmup, res.Spread))
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	res.WarmupSeconds = time.Since(start).Seconds()
	fmt.Fprintf(logOut, "  %s: warm-up %d keys in %.1fs; partitions owned by instance: %v\n", r.row, r.warmKeys-r.warmFrom, res.WarmupSeconds, res.Spread)
	return nil
}

// publishBacklog pauses every consumer of the group and publishes the
// backlog, which then waits in them.
func (r *soRowRun) publishBacklog(ctx context.Context) error {
	res := r.res
	for _, c := range r.cons {
		if _, err := r.js.PauseConsumer(ctx, c.stream, c.name, time.Now().Add(time.Hour)); err != nil {
			return fmt.Errorf("pause consumer %s: %w", c.name, err)
		}
	}
	// On a cluster the answer can come before the consumer's leader
	// applies the pause.
	if err := r.waitPaused(ctx, r.cons, 30*time.Second); err != nil {
		return err
	}
	r.before = make([]series, len(r.insts))
	for k, in := range r.insts {
		var err error
		if r.before[k], err = scrape(ctx, in.addr); err != nil {
			return err
		}
	}
	total := len(r.thr.Main) + r.bad
	prog := startProgress(r.row.String()+" publish backlog", uint64(total), r.f.progressEvery, nil)
	pctx, cancel := context.WithTimeout(ctx, r.f.timeout)
	stopWatch, repaused := r.keepPaused(pctx, r.cons)
	took, err := publishAll(pctx, r.hjs, total, r.backlogMsg(r.row, r.n), prog)
	stopWatch()
	cancel()
	prog.end()
	if err != nil {
		return fmt.Errorf("publish backlog: %w", err)
	}
	res.PublishSeconds = took.Seconds()
	if err := r.waitPaused(ctx, r.cons, 30*time.Second); err != nil {
		return err
	}
	if n := repaused.Load(); n > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("a consumer was found unpaused %d times during the publish and paused again (an instance re-created a member's consumer)", n))
	}
	// With the consumers paused, the backlog waits in them: what does at
	// the resume is what the drain handles, and what events/s counts.
	res.Drained = total
	if waiting, err := r.waiting(ctx, r.cons); err != nil {
		return err
	} else if waiting != uint64(total) {
		res.Drained = int(waiting)
		res.Notes = append(res.Notes, fmt.Sprintf("%d of the %d backlog events waited in the paused consumers when the drain began; events/s and CPU per event count those", waiting, total))
	}
	return nil
}

// drain resumes the consumers and times the drain: events/s, the CPU of
// the instances and of the servers, and each instance's own view of it.
func (r *soRowRun) drain(ctx context.Context) error {
	res := r.res
	pids := func(ps []*child) []int {
		out := make([]int, len(ps))
		for i, p := range ps {
			out[i] = p.Pid()
		}
		return out
	}
	var stagePs []*child
	for _, in := range r.insts {
		stagePs = append(stagePs, in.proc)
	}
	sCPU0, nCPU0, m0 := cpuOf(pids(stagePs)), cpuOf(pids(r.cl.nodes)), readCPU()
	t0 := time.Now()
	for _, c := range r.cons {
		if _, err := r.js.ResumeConsumer(ctx, c.stream, c.name); err != nil {
			return fmt.Errorf("resume consumer %s: %w", c.name, err)
		}
	}
	prog := startProgress(r.row.String()+" drain (forwarded)", uint64(r.thr.Keys), r.f.progressEvery, nil)
	base := uint64(r.warmKeys - r.warmFrom)
	var counted time.Time
	err := r.waitDrained(ctx, r.cons, r.insts, r.f.timeout, func() {
		// The output's count is for the progress line only: not every poll.
		if r.f.progressEvery <= 0 || time.Since(counted) < r.f.progressEvery/2 {
			return
		}
		counted = time.Now()
		if si, err := r.js.Stream(ctx, r.n.output); err == nil && si.CachedInfo().State.Msgs >= base {
			prog.done.Store(si.CachedInfo().State.Msgs - base)
		}
	})
	drain := time.Since(t0)
	sCPU1, nCPU1, wall := cpuOf(pids(stagePs)), cpuOf(pids(r.cl.nodes)), time.Since(m0.at).Seconds()
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
	cpu := make([]float64, len(sCPU1))
	var sSum, nSum float64
	for i := range sCPU1 {
		cpu[i] = (sCPU1[i] - sCPU0[i]).Seconds()
		sSum += cpu[i]
	}
	for i := range nCPU1 {
		nSum += (nCPU1[i] - nCPU0[i]).Seconds()
	}
	res.StageCPUMicrosPerEvent = sSum * 1e6 / float64(res.Drained)
	res.ServerCPUMicrosPerEvent = nSum * 1e6 / float64(res.Drained)
	// The machine's busy time minus the stage's and the servers' (the
	// harness's own polling counts as other load).
	res.OtherCores = max(0, machine.OtherCores+machine.Cores-(sSum+nSum)/wall)
	return r.perInstance(ctx, drain, cpu)
}

// perInstance adds the instances' own view of the drain: each one's CPU
// (cpu, seconds) and metrics, and their sum.
func (r *soRowRun) perInstance(ctx context.Context, drain time.Duration, cpu []float64) error {
	res := r.res
	sum := series{}
	for k, in := range r.insts {
		after, err := scrape(ctx, in.addr)
		if err != nil {
			return err
		}
		d := after.minus(r.before[k])
		sum.add(d)
		pi := ScaleOutInst{Name: in.name, CPUSeconds: cpu[k], Cores: cpu[k] / drain.Seconds(), Judged: d.sum("dedupe_messages_total"),
			Routed: d.sum("dedupe_route_messages_total", `outcome="routed"`), PartitionsOwned: after.sum("dedupe_partitions_owned"),
			Takeovers: d.sum("dedupe_partition_takeovers_total")}
		if pi.Judged > 0 {
			pi.CPUMicrosPerJudged = cpu[k] * 1e6 / pi.Judged
		}
		res.PerInst = append(res.PerInst, pi)
	}
	res.Stage = internals(sum, drain)
	if judged := sum.sum("dedupe_messages_total"); int(judged) < len(r.thr.Main) {
		res.Notes = append(res.Notes, fmt.Sprintf("the instances counted %.0f messages judged during the drain, the backlog has %d keyed events", judged, len(r.thr.Main)))
	}
	return nil
}

// stopAndVerify stops the instances, then checks the ground truth.
func (r *soRowRun) stopAndVerify(ctx context.Context) error {
	for _, in := range r.insts {
		if !r.cs.release(in.proc, 30*time.Second) {
			r.res.Notes = append(r.res.Notes, in.name+" did not stop within 30s of SIGTERM; killed")
		}
		in.proc = nil
	}
	if err := r.verify(ctx, r.n, r.warmFrom, r.res); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	return nil
}

// startInstance starts in, in a CPU cgroup when the row is capped.
func (e *soEnv) startInstance(ctx context.Context, row soRow, idx int, in *instance, rowDir string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var env []string
	if e.f.stageEnv != "" {
		env = strings.Split(e.f.stageEnv, ",")
	}
	p, err := e.cs.startEnv("dedupe-stage "+in.name, filepath.Join(rowDir, in.name+".log"), env, e.stageBin, "run", "--config", in.cfgPath)
	if err != nil {
		return err
	}
	in.proc = p
	if row.cap > 0 && e.capErr == nil {
		if err := capCPU(p, fmt.Sprintf("dedupe-bench-%d-r%d-%s", os.Getpid(), idx, in.name), row.cap); err != nil {
			fmt.Fprintf(logOut, "warning: %s runs uncapped: %v\n", in.name, err)
			return nil
		}
		in.capped = true
	}
	return nil
}

// waitReady waits until in's /readyz answers 200.
func waitReady(ctx context.Context, in *instance, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if !in.proc.Running() {
			return fmt.Errorf("%s exited before it was ready: %v\n%s", in.name, in.proc.Err(), in.proc.LogTail(3000))
		}
		if scrapeReady(ctx, in.addr) == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %v; log %s:\n%s", in.name, timeout, in.proc.LogPath, in.proc.LogTail(3000))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// createStreams creates the row's streams from stage.StreamsToCreate with
// --replicas each, asking again for up to a minute while the cluster does
// not answer.
func (e *soEnv) createStreams(ctx context.Context, cfg config.Config) error {
	streams, err := stage.StreamsToCreate(cfg)
	if err != nil {
		return err
	}
	for _, s := range streams {
		sc := s.Config
		sc.Replicas = e.f.replicas
		deadline := time.Now().Add(time.Minute)
		for {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := e.js.CreateStream(rctx, sc)
			cancel()
			if err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				break
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				return fmt.Errorf("create stream %s (%s): %w", sc.Name, s.Field, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

// deleteRow deletes the row's streams and the group's presence, hand-over and
// snapshot buckets.
func (e *soEnv) deleteRow(n soNames, cfg config.Config) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bucket, _, _ := layout.Presence(cfg.ScaleOut.Group, cfg.Input.AckWait.D())
	for _, s := range []string{n.input, n.output, n.dlq, n.routed, "KV_" + bucket, "KV_" + layout.HandOverBucket(cfg.ScaleOut.Group), "OBJ_" + layout.SnapshotBucket(cfg.ScaleOut.Group)} {
		if err := e.js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			fmt.Fprintf(logOut, "warning: delete stream %s: %v\n", s, err)
		}
	}
}

// backlogMsg returns the backlog's message i: the keyed events of the
// workload in order, with the bad inputs spread evenly among them.
func (e *soEnv) backlogMsg(row soRow, n soNames) func(i int) *nats.Msg {
	total := len(e.thr.Main) + e.bad
	nextBad, j, k := -1, 0, 0
	if e.bad > 0 {
		nextBad = total / (2 * e.bad)
	}
	return func(int) *nats.Msg {
		if j < e.bad && k+j == nextBad {
			m := n.badMsg(row.mode, j)
			j++
			nextBad = (2*j + 1) * total / (2 * e.bad)
			return m
		}
		ev := e.thr.Main[k]
		k++
		return n.msg(row.mode, e.thr.Key(int(ev.Key)), int(ev.Key), e.f.payloadSize)
	}
}

// soConsumer is a consumer of the group (or the stage's, with scale_out
// off).
type soConsumer struct{ stream, name string }

// warmRound publishes a round of new warm-up keys, waits until the group
// has acknowledged everything and returns the consumers of the row.
func (e *soEnv) warmRound(ctx context.Context, js jetstream.JetStream, row soRow, n soNames, insts []*instance, cfg config.Config) ([]soConsumer, error) {
	count := max(100, 50*row.instances)
	from := e.warmKeys
	e.warmKeys += count
	if _, err := publishAll(ctx, js, count, func(i int) *nats.Msg {
		k := KeyString("wup", e.f.seed, from+i)
		return n.msg(row.mode, k, from+i, e.f.payloadSize)
	}, startProgress("", 0, 0, nil)); err != nil {
		return nil, err
	}
	// The consumers exist once the instances are ready; list them after
	// the round, when the route step and the members have all been made.
	var cons []soConsumer
	streams := []string{n.input}
	if routed, _ := cfg.ScaleOutPartitioning().Routed(); cfg.ScaleOut.Enabled && routed {
		streams = append(streams, n.routed)
	}
	want := 1
	if cfg.ScaleOut.Enabled {
		want = cfg.State.Partitions
		if len(streams) > 1 {
			want++
		}
	}
	deadline := time.Now().Add(time.Minute)
	for len(cons) < want {
		cons = cons[:0]
		for _, s := range streams {
			st, err := e.js.Stream(ctx, s)
			if err != nil {
				return nil, err
			}
			names := st.ConsumerNames(ctx)
			for name := range names.Name() {
				cons = append(cons, soConsumer{stream: s, name: name})
			}
			if err := names.Err(); err != nil {
				return nil, err
			}
		}
		if len(cons) >= want {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d consumers on %v after a minute, want %d", len(cons), streams, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return cons, e.waitDrained(ctx, cons, insts, time.Minute, nil)
}

// waitDrained polls every consumer until none has messages pending or
// unacknowledged; it fails after timeout or when an instance exits.
func (e *soEnv) waitDrained(ctx context.Context, cons []soConsumer, insts []*instance, timeout time.Duration, onPoll func()) error {
	every := max(e.f.pollEvery, 20*time.Millisecond)
	return pollDrained(ctx, every, timeout, func() (bool, string, error) {
		for _, in := range insts {
			if !in.proc.Running() {
				return false, "", fmt.Errorf("%s exited: %v\n%s", in.name, in.proc.Err(), in.proc.LogTail(3000))
			}
		}
		done, last := true, ""
		for _, c := range cons {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ci, err := e.js.Consumer(rctx, c.stream, c.name)
			var info *jetstream.ConsumerInfo
			if err == nil {
				info, err = ci.Info(rctx)
			}
			cancel()
			if err != nil {
				done, last = false, fmt.Sprintf("%s: %v", c.name, err)
				break
			}
			if info.NumPending > 0 || info.NumAckPending > 0 {
				done, last = false, fmt.Sprintf("%s: %d pending, %d unacknowledged", c.name, info.NumPending, info.NumAckPending)
				break
			}
		}
		if onPoll != nil {
			onPoll()
		}
		return done, last, nil
	}, func(last string) error {
		return fmt.Errorf("the group did not acknowledge everything within %v (%s)", timeout, last)
	})
}

// keepPaused checks every 100 ms, until stop is called, that the
// consumers of cons are still paused, and pauses again one that is not:
// an instance that joins a member again (after releasing it for balance)
// creates its consumer anew, which lifts the pause. repaused counts those.
func (e *soEnv) keepPaused(ctx context.Context, cons []soConsumer) (stop func(), repaused *atomic.Int64) {
	repaused = &atomic.Int64{}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for _, c := range cons {
				rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				ci, err := e.js.Consumer(rctx, c.stream, c.name)
				if err == nil && !ci.CachedInfo().Paused {
					if _, err := e.js.PauseConsumer(rctx, c.stream, c.name, time.Now().Add(time.Hour)); err == nil {
						repaused.Add(1)
					}
				}
				cancel()
			}
		}
	}()
	return func() { cancel(); <-done }, repaused
}

// waitPaused waits until every consumer of cons reports itself paused.
func (e *soEnv) waitPaused(ctx context.Context, cons []soConsumer, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, c := range cons {
		for {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ci, err := e.js.Consumer(rctx, c.stream, c.name)
			var info *jetstream.ConsumerInfo
			if err == nil {
				info, err = ci.Info(rctx)
			}
			cancel()
			if err == nil && info.Paused {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("consumer %s not paused within %v (%v)", c.name, timeout, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

// waiting returns the messages pending or unacknowledged in cons.
func (e *soEnv) waiting(ctx context.Context, cons []soConsumer) (uint64, error) {
	var sum uint64
	for _, c := range cons {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ci, err := e.js.Consumer(rctx, c.stream, c.name)
		var info *jetstream.ConsumerInfo
		if err == nil {
			info, err = ci.Info(rctx)
		}
		cancel()
		if err != nil {
			return 0, fmt.Errorf("consumer %s: %w", c.name, err)
		}
		sum += info.NumPending + uint64(info.NumAckPending)
	}
	return sum, nil
}

// owned returns the partitions each instance owns (-1: no answer).
func (e *soEnv) owned(ctx context.Context, insts []*instance) []int {
	out := make([]int, len(insts))
	for i, in := range insts {
		s, err := scrape(ctx, in.addr)
		if err != nil {
			out[i] = -1
			continue
		}
		out[i] = int(s.sum("dedupe_partitions_owned"))
	}
	return out
}

// spread returns the partitions each instance owns once they own every
// partition between them and none owns more than its fair share; nil
// before.
func (e *soEnv) spread(ctx context.Context, insts []*instance, cfg config.Config) []int {
	if !cfg.ScaleOut.Enabled {
		return nil
	}
	owned := e.owned(ctx, insts)
	sum, most := 0, 0
	for _, n := range owned {
		if n < 0 {
			return nil
		}
		sum += n
		most = max(most, n)
	}
	parts := cfg.State.Partitions
	if sum != parts || most > (parts+len(insts)-1)/len(insts) {
		return nil
	}
	return owned
}

// internals summarises the instances' metrics over a drain.
func internals(s series, drain time.Duration) ScaleOutInternal {
	var si ScaleOutInternal
	if c, sum, _ := s.histogram("dedupe_batch_messages", 0); c > 0 {
		si.Batches, si.MeanBatchSize = c, sum/c
		si.NewPerBatch = s.sum("dedupe_messages_total", `outcome="new"`) / c
	}
	if c, sum, p99 := s.histogram("dedupe_publish_seconds", 0.99); c > 0 {
		si.PublishMeanMs, si.PublishP99Ms = 1000*sum/c, 1000*p99
	}
	if c, sum, p99 := s.histogram("dedupe_commit_seconds", 0.99); c > 0 {
		si.CommitMeanMs, si.CommitP99Ms = 1000*sum/c, 1000*p99
	}
	si.RoutedPerSec = s.sum("dedupe_route_messages_total", `outcome="routed"`) / drain.Seconds()
	if c, sum, _ := s.histogram("dedupe_route_copies_per_message", 0); c > 0 {
		si.CopiesPerRouted = sum / c
	}
	si.Takeovers = s.sum("dedupe_partition_takeovers_total")
	si.FenceRefuse = s.sum("dedupe_fence_refusals_total")
	return si
}

// verify reads the row's output and dead-letter streams: every key of the
// warm-up (from warmFrom) and of the backlog once, fence messages and
// key-state records (handover.ControlSubjects, the latter with a
// handover.HeaderOp) apart, every bad input dead-lettered once.
func (e *soEnv) verify(ctx context.Context, n soNames, warmFrom int, res *ScaleOutRow) error {
	kf, err := keys.NewKeyFunc(keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "id"}})
	if err != nil {
		return err
	}
	var (
		thr     []uint16
		warm    map[int]int
		foreign int
	)
	control := strings.TrimSuffix(handover.ControlSubjects(n.outPrefix), ">")
	c := &res.Correct
	*c = ScaleOutCorrect{}
	if c.Output, err = readStreamAgain(ctx, e.js, n.output, func() {
		thr, warm, foreign, c.Fences, c.KeyState = make([]uint16, e.thr.Keys), map[int]int{}, 0, 0, 0
	}, func(m jetstream.Msg) {
		if strings.HasPrefix(m.Subject(), control) {
			if m.Headers().Get(handover.HeaderOp) != "" {
				c.KeyState++
			} else {
				c.Fences++
			}
			return
		}
		k, err := kf.Key(m.Subject(), m.Headers(), m.Data())
		if err != nil {
			foreign++
			return
		}
		prefix, i, ok := ParseKey(string(k))
		switch {
		case ok && prefix == e.thr.Prefix && i < len(thr):
			thr[i]++
		case ok && prefix == "wup" && i >= warmFrom && i < e.warmKeys:
			warm[i]++
		default:
			foreign++
		}
	}); err != nil {
		return err
	}
	c.Output -= c.Fences + c.KeyState
	c.Expected = len(thr) + e.warmKeys - warmFrom
	c.Lost, c.Duplicated = exact(thr, func(int) int { return 1 })
	for i := warmFrom; i < e.warmKeys; i++ {
		switch w := warm[i]; {
		case w == 0:
			c.Lost++
		case w > 1:
			c.Duplicated += w - 1
		}
	}
	if foreign > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d output messages carry no key of the workload", foreign))
		c.Duplicated += foreign
	}
	// Key-state records change no forward; a row that writes them
	// without refresh, or none with refresh in a group, did not run what
	// it says.
	switch repeats := len(e.thr.Main) - e.thr.Keys; {
	case !res.Refresh && c.KeyState > 0:
		res.Notes = append(res.Notes, fmt.Sprintf("%d key-state records in the output of a row without window.refresh_on_repeat", c.KeyState))
	case res.Refresh && res.Mode != soOff && repeats > 0 && c.KeyState == 0:
		res.Notes = append(res.Notes, fmt.Sprintf("no key-state record in the output of a group with window.refresh_on_repeat (%d repeats)", repeats))
	}

	if err := e.verifyDeadLetters(ctx, n, c); err != nil {
		return err
	}
	c.OK = c.Lost == 0 && c.Duplicated == 0 && c.DeadLetterLost == 0 && c.DeadLetterExtra == 0
	return nil
}

// verifyDeadLetters reads the dead-letter stream into c: each bad input
// dead-lettered once, nothing else, fence messages counted apart.
func (e *soEnv) verifyDeadLetters(ctx context.Context, n soNames, c *ScaleOutCorrect) error {
	var bad []int
	var err error
	c.DeadLetterWant = e.bad
	dlFence, dlFences := strings.TrimSuffix(handover.ControlSubjects(n.dlqSubj), ">"), 0
	if c.DeadLettered, err = readStreamAgain(ctx, e.js, n.dlq, func() {
		bad, c.DeadLetterExtra, dlFences = make([]int, e.bad), 0, 0
	}, func(m jetstream.Msg) {
		if strings.HasPrefix(m.Subject(), dlFence) {
			dlFences++
			return
		}
		j, err := strconv.Atoi(m.Headers().Get(headerBad))
		if err != nil || j < 0 || j >= len(bad) {
			c.DeadLetterExtra++
			return
		}
		bad[j]++
	}); err != nil {
		return err
	}
	c.DeadLettered -= dlFences
	for _, b := range bad {
		if b == 0 {
			c.DeadLetterLost++
		} else {
			c.DeadLetterExtra += b - 1
		}
	}
	return nil
}

// readStreamAgain is natstest.Read, read again from the start (after reset)
// up to five times while it fails: on a cluster a new consumer can answer
// "no responders" until its leader is elected.
func readStreamAgain(ctx context.Context, js jetstream.JetStream, stream string, reset func(), fn func(jetstream.Msg)) (int, error) {
	var err error
	for attempt := 1; ; attempt++ {
		reset()
		var n int
		if n, err = natstest.Read(ctx, js, stream, fn); err == nil {
			return n, nil
		}
		if attempt == 5 || ctx.Err() != nil {
			return 0, fmt.Errorf("read %s (%d attempts): %w", stream, attempt, err)
		}
		fmt.Fprintf(logOut, "warning: reading %s again: %v\n", stream, err)
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// publishAll publishes count messages, msg(i) for i in order, as fast as
// the server acknowledges them (4096 in flight) unless msg paces them, and
// fails unless every one was stored. It is the bench's one publisher.
func publishAll(ctx context.Context, js jetstream.JetStream, count int, msg func(i int) *nats.Msg, prog *progress) (time.Duration, error) {
	var errs atomic.Uint64
	start := time.Now()
	futures := make(chan jetstream.PubAckFuture, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for f := range futures {
			select {
			case <-f.Ok():
			case <-f.Err():
				errs.Add(1)
			}
		}
	}()
	var err error
	for i := range count {
		if err = ctx.Err(); err != nil {
			break
		}
		var f jetstream.PubAckFuture
		if f, err = js.PublishMsgAsync(msg(i), jetstream.WithStallWait(30*time.Second)); err != nil {
			err = fmt.Errorf("publish %d: %w", i, err)
			break
		}
		futures <- f
		prog.done.Store(uint64(i + 1))
	}
	close(futures)
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		return 0, errors.New("publishes not acknowledged within 2m")
	}
	if err != nil {
		return 0, err
	}
	if n := errs.Load(); n > 0 {
		return 0, fmt.Errorf("%d of %d publishes failed", n, count)
	}
	return time.Since(start), nil
}

// cpuOf returns the CPU time of each pid (0 where it cannot be read).
func cpuOf(pids []int) []time.Duration {
	out := make([]time.Duration, len(pids))
	for i, p := range pids {
		out[i], _ = procCPU(p)
	}
	return out
}

// scrapeReady asks addr's /readyz and fails unless it answers 200.
func scrapeReady(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}
