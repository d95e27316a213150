package main

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// testScaleOutEnv is a scale-out environment with a workload and no
// processes, for the parts of a row that need none.
func testScaleOutEnv(t *testing.T, events int, badRatio float64) *soEnv {
	t.Helper()
	f, err := parseFlags([]string{"scaleout", "--events", strconv.Itoa(events), "--bad-ratio", strconv.FormatFloat(badRatio, 'g', -1, 64)})
	if err != nil {
		t.Fatal(err)
	}
	bad := int(math.Round(float64(events) * badRatio))
	keyed := events - bad
	w := 70 * time.Minute
	thr, err := Generate(Spec{Prefix: "thr", Seed: 1, Events: keyed, Keys: int(float64(keyed) * 0.7), Mix: f.mix, BurstSize: 3, PayloadSize: 256, W: w, Span: w * 9 / 10})
	if err != nil {
		t.Fatal(err)
	}
	cl := &natstest.Procs{Nodes: []*natstest.ProcNode{{Port: 4222}, {Port: 4223}, {Port: 4224}}}
	return &soEnv{procEnv: &procEnv{f: f, dir: t.TempDir(), cl: cl}, thr: thr, bad: bad}
}

// instanceConfig is the valid configuration of an instance of a row of
// mode on e, with refresh_on_repeat as refresh.
func instanceConfig(t *testing.T, e *soEnv, mode string, refresh bool) config.Config {
	t.Helper()
	cfg := e.instanceConfig(mode, refresh, namesForRow(0), "i0", filepath.Join(e.dir, "data"), "127.0.0.1:1", 0, nil)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("%s (refresh %v): the instance's configuration is invalid: %v", mode, refresh, err)
	}
	return cfg
}

// TestScaleOutBacklog checks the backlog each mode publishes against the
// instances' own key configuration: every keyed event once, in the
// workload's order, under its key; every bad input refused by the key
// function (so the stage must dead-letter it), spread over the backlog.
func TestScaleOutBacklog(t *testing.T) {
	for _, mode := range []string{soOff, soHeader, soSubject} {
		t.Run(mode, func(t *testing.T) {
			e := testScaleOutEnv(t, 10_000, 0.01)
			n := namesForRow(0)
			kf, err := keys.NewKeyFunc(instanceConfig(t, e, mode, false).Key)
			if err != nil {
				t.Fatal(err)
			}
			total := len(e.thr.Main) + e.bad
			msg := e.backlogMsg(mode, n)
			var badAt []int
			k := 0
			for i := range total {
				m := msg(i)
				key, err := kf.Key(m.Subject, m.Header, m.Data)
				if m.Header.Get(headerBad) != "" {
					var ke *keys.Error
					if !errors.As(err, &ke) {
						t.Fatalf("bad input %d on %s: key %q, err %v; want a key error", len(badAt), m.Subject, key, err)
					}
					badAt = append(badAt, i)
					continue
				}
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				if want := e.thr.Key(int(e.thr.Main[k].Key)); string(key) != want {
					t.Fatalf("event %d: key %q, want %q (the workload's event %d)", i, key, want, k)
				}
				k++
			}
			if k != len(e.thr.Main) || len(badAt) != e.bad {
				t.Fatalf("backlog: %d keyed events and %d bad inputs, want %d and %d", k, len(badAt), len(e.thr.Main), e.bad)
			}
			gap := total / e.bad
			for i := 1; i < len(badAt); i++ {
				if d := badAt[i] - badAt[i-1]; d < gap-1 || d > gap+1 {
					t.Fatalf("bad inputs %d and %d are %d events apart, want about %d", i-1, i, d, gap)
				}
			}
		})
	}
}

// TestScaleOutVerify feeds the ground-truth check of a row an output with
// a key missing, a key twice, a message of no workload key and a fence
// message, and a dead-letter stream with one bad input missing, one twice
// and a good input: it must count each, keep the fence apart, and fail
// the row.
func TestScaleOutVerify(t *testing.T) {
	e := testScaleOutEnv(t, 1000, 0.01)
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	e.js = js
	n := namesForRow(0)
	ctx := context.Background()
	for _, sc := range []jetstream.StreamConfig{
		{Name: n.output, Subjects: []string{n.outPrefix + ".>", changelog.ControlSubjects(n.outPrefix)}},
		{Name: n.dlq, Subjects: []string{n.dlqSubj}},
	} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	e.warmKeys = 5 // warm-up keys 0..4 of this row
	out := func(key string, i int) *nats.Msg {
		return &nats.Msg{Subject: n.outPrefix + ".1.in", Data: Payload(key, i, 64)}
	}
	var msgs []*nats.Msg
	for i := range e.thr.Keys {
		switch i {
		case 7: // lost
		case 9: // doubled
			msgs = append(msgs, out(e.thr.Key(i), i), out(e.thr.Key(i), i))
		default:
			msgs = append(msgs, out(e.thr.Key(i), i))
		}
	}
	for i := range 5 {
		msgs = append(msgs, out(KeyString("wup", e.f.seed, i), i))
	}
	msgs = append(msgs, &nats.Msg{Subject: changelog.FenceSubject(n.outPrefix, 1), Data: []byte("fence")}, out(KeyString("zzz", 1, 3), 3))
	// Two key-state records, as a group with window.refresh_on_repeat
	// writes them: counted apart, not forwards.
	for _, i := range []int{2, 3} {
		msgs = append(msgs, changelog.RefreshMsg(changelog.KeyStateSubject(n.outPrefix, 1),
			changelog.Record{Key: []byte(e.thr.Key(i)), FirstSeen: time.Now()}, time.Now()))
	}
	for j := range e.bad {
		dl := &nats.Msg{Subject: n.dlqSubj, Header: nats.Header{headerBad: []string{strconv.Itoa(j)}}}
		switch j {
		case 0: // not dead-lettered
		case 1: // twice
			msgs = append(msgs, dl, dl)
		default:
			msgs = append(msgs, dl)
		}
	}
	msgs = append(msgs, &nats.Msg{Subject: n.dlqSubj, Data: []byte("a good input")})
	natstest.PublishAll(t, js, msgs)

	res := &ScaleOutRow{}
	if err := e.verify(ctx, n, 0, res); err != nil {
		t.Fatal(err)
	}
	want := ScaleOutCorrect{Expected: e.thr.Keys + 5, Output: e.thr.Keys + 5 + 1, Fences: 1, KeyState: 2, Lost: 1, Duplicated: 2,
		DeadLetterWant: e.bad, DeadLettered: e.bad + 1, DeadLetterLost: 1, DeadLetterExtra: 2}
	if res.Correct != want {
		t.Errorf("correctness\n got %+v\nwant %+v", res.Correct, want)
	}
	if len(res.Notes) != 2 || !strings.Contains(res.Notes[1], "2 key-state records in the output of a row without window.refresh_on_repeat") {
		t.Errorf("notes %q; want the foreign message and the key-state records of a row without refresh", res.Notes)
	}
}

// TestScaleOutRow runs the mode end to end on one small row, capped:
// the real binaries, a 3-node cluster, a cgroup. The row matches the
// ground truth, the cap was applied (or the reason it could not be is
// recorded), and nothing is left behind: no process of the run and no
// cgroup.
func TestScaleOutRow(t *testing.T) {
	if testing.Short() {
		t.Skip("builds dedupe-stage and nats-server and starts a 3-node cluster (about 30s); not with -short")
	}
	dir := t.TempDir()
	so := runModeTest(t, dir, "scaleout", "--events", "2000", "--rows", "subject", "--instances", "2", "--cpu-cap", "0.5", "--ack-wait", "2s").ScaleOut
	if len(so.Rows) != 1 {
		t.Fatalf("%d rows, want 1", len(so.Rows))
	}
	r := so.Rows[0]
	if !r.Correct.OK || r.Correct.Expected < 1400 || r.Correct.DeadLetterWant != 20 {
		t.Errorf("row %s: %+v; want every key once and the 20 bad inputs dead-lettered once", r.Row, r.Correct)
	}
	if !r.Capped && so.CgroupError == "" {
		t.Errorf("row %s not capped and no reason recorded", r.Row)
	}
	if so.CgroupError != "" {
		t.Logf("CPU caps not applied here: %s", so.CgroupError)
	}
	if r.EventsPerSec <= 0 || r.StageCPUMicrosPerEvent <= 0 || r.Stage.Batches <= 0 || len(r.PerInst) != 2 {
		t.Errorf("row %s: events/s %v, CPU µs/event %v, batches %v, %d instances measured; want all measured",
			r.Row, r.EventsPerSec, r.StageCPUMicrosPerEvent, r.Stage.Batches, len(r.PerInst))
	}
	if left, _ := filepath.Glob(filepath.Join(cgroupRoot, "dedupe-bench-"+strconv.Itoa(os.Getpid())+"-*")); len(left) > 0 {
		t.Errorf("cgroups left behind: %v", left)
	}
	noneLeft(t, dir)
}

// testWriter writes the harness's progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// TestScaleOutRounds checks that --rounds runs every row in each round,
// the order rotated, and reports each round's ratios, from that round's rows alone, and their
// medians.
func TestScaleOutRounds(t *testing.T) {
	f, err := parseFlags([]string{"scaleout", "--rows", "header", "--cpu-cap", "0.1", "--rounds", "3"})
	if err != nil {
		t.Fatal(err)
	}
	rows := planRows(f.soModes, f.soInstances, f.cpuCaps, f.rounds)
	if len(rows) != 9 || rows[0] != (soRow{mode: soHeader, instances: 1, cap: 0.1, round: 1}) ||
		rows[3] != (soRow{mode: soHeader, instances: 2, cap: 0.1, round: 2}) || rows[5].instances != 1 ||
		rows[6].instances != 3 || rows[8].round != 3 || rows[8].String() != "header x2 cap 0.1 round 3" {
		t.Fatalf("rows: %v; want header x1..3 in each of rounds 1..3, round k starting with the k-th", rows)
	}
	// events/s of x1, x2, x3 in each round: 2/1 ratios 1.5, 2.0, 1.6 and
	// 3/1 ratios 2.0, 3.0, 2.5.
	eps := [][3]float64{{100, 150, 200}, {50, 100, 150}, {200, 320, 500}}
	var res []*ScaleOutRow
	for _, r := range rows {
		res = append(res, &ScaleOutRow{Mode: r.mode, Instances: r.instances, CPUCap: r.cap, Round: r.round, EventsPerSec: eps[r.round-1][r.instances-1]})
	}
	got := scaleOutRatios(res, f.cpuCaps, f.rounds)
	if len(got) != 4 {
		t.Fatalf("%d ratios, want one per round and the medians: %+v", len(got), got)
	}
	for i, want := range [][2]float64{{1.5, 2}, {2, 3}, {1.6, 2.5}} {
		if r := got[i]; r.Round != i+1 || math.Abs(r.Ratios["header 2/1"]-want[0]) > 1e-9 || math.Abs(r.Ratios["header 3/1"]-want[1]) > 1e-9 {
			t.Errorf("round %d: %+v, want 2/1 %v and 3/1 %v", i+1, r, want[0], want[1])
		}
	}
	if m := got[3]; m.MedianOf != 3 || m.Round != 0 || math.Abs(m.Ratios["header 2/1"]-1.6) > 1e-9 || math.Abs(m.Ratios["header 3/1"]-2.5) > 1e-9 || len(m.Ratios) != 2 {
		t.Errorf("medians: %+v, want of 3 rounds, 2/1 1.6, 3/1 2.5, no off row", m)
	}
	var out strings.Builder
	printScaleOut(&out, &ScaleOutRun{Rows: res, Ratios: got})
	if !strings.Contains(out.String(), "ratios (cap 0.1 core, MEDIANS of 3 rounds): header 2/1 1.60; header 3/1 2.50;") {
		t.Errorf("the report does not give the medians:\n%s", out.String())
	}
}

// TestScaleOutRefreshRows checks the refresh rows: --rows takes
// a mode followed by -refresh, plans it right after the same row without
// refresh, configures the instances with window.refresh_on_repeat (W
// left as it was), leaves it out of the ratios of the rows without, and
// reports each refresh row against the same row without in the same
// round, and the medians over the rounds.
func TestScaleOutRefreshRows(t *testing.T) {
	f, err := parseFlags([]string{"scaleout", "--rows", "subject,subject-refresh,header-refresh,off-refresh", "--instances", "1,2",
		"--cpu-cap", "0", "--rounds", "3"})
	if err != nil {
		t.Fatal(err)
	}
	one := planRows(f.soModes, f.soInstances, f.cpuCaps, 1)
	var names []string
	for _, r := range one {
		names = append(names, r.String())
	}
	if got, want := strings.Join(names, ", "), "subject x1, subject-refresh x1, subject x2, subject-refresh x2, header-refresh x1, header-refresh x2, off-refresh x1"; got != want {
		t.Fatalf("rows: %s\nwant %s", got, want)
	}

	e := testScaleOutEnv(t, 1000, 0.01)
	for _, row := range []soRow{{mode: soSubject, instances: 2}, {mode: soSubject, refresh: true, instances: 2}} {
		cfg := instanceConfig(t, e, row.mode, row.refresh)
		if cfg.Window.RefreshOnRepeat != row.refresh || !cfg.ScaleOut.Enabled {
			t.Errorf("%s: refresh_on_repeat %v, scale_out %v; want %v, true", row, cfg.Window.RefreshOnRepeat, cfg.ScaleOut.Enabled, row.refresh)
		}
		if def := config.Default().Window; !slices.Equal(cfg.Window.Paths, def.Paths) || cfg.Window.Margin != def.Margin {
			t.Errorf("%s: window %+v; want the default paths and margin", row, cfg.Window)
		}
	}

	// Three rounds of subject x2 and subject-refresh x2, 1000 repeats:
	// events/s ratios 0.9, 0.8, 0.95; stage CPU µs/event 10 and 11 over
	// 2000 drained events: +2 µs per repeat; key-state records 600, 700,
	// 650.
	rows := []*ScaleOutRow{
		{Mode: soSubject, Instances: 2, Round: 1, EventsPerSec: 1000, StageCPUMicrosPerEvent: 10, ServerCPUMicrosPerEvent: 20, Drained: 2000},
		{Mode: soSubject, Refresh: true, Instances: 2, Round: 1, EventsPerSec: 900, StageCPUMicrosPerEvent: 11, ServerCPUMicrosPerEvent: 22, Drained: 2000, Correct: ScaleOutCorrect{KeyState: 600}},
		{Mode: soSubject, Instances: 2, Round: 2, EventsPerSec: 1000, StageCPUMicrosPerEvent: 10, ServerCPUMicrosPerEvent: 20, Drained: 2000},
		{Mode: soSubject, Refresh: true, Instances: 2, Round: 2, EventsPerSec: 800, StageCPUMicrosPerEvent: 11, ServerCPUMicrosPerEvent: 21, Drained: 2000, Correct: ScaleOutCorrect{KeyState: 700}},
		{Mode: soSubject, Refresh: true, Instances: 2, Round: 3, EventsPerSec: 950, StageCPUMicrosPerEvent: 12, ServerCPUMicrosPerEvent: 20, Drained: 2000, Correct: ScaleOutCorrect{KeyState: 650}},
		{Mode: soSubject, Instances: 2, Round: 3, EventsPerSec: 1000, StageCPUMicrosPerEvent: 10, ServerCPUMicrosPerEvent: 20, Drained: 2000},
		// A refresh row whose row without did not run: no figure.
		{Mode: soHeader, Refresh: true, Instances: 1, Round: 1, EventsPerSec: 500},
	}
	got := refreshCosts(rows, 1000, 3)
	if len(got) != 4 {
		t.Fatalf("%d entries, want one per round and the medians: %+v", len(got), got)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	for i, want := range []ScaleOutRefresh{
		{Round: 1, EventsVsWithout: 0.9, StageCPUPerRepeat: 2, ServerCPUPerRepeat: 4, KeyStatePerRepeat: 0.6},
		{Round: 2, EventsVsWithout: 0.8, StageCPUPerRepeat: 2, ServerCPUPerRepeat: 2, KeyStatePerRepeat: 0.7},
		{Round: 3, EventsVsWithout: 0.95, StageCPUPerRepeat: 4, ServerCPUPerRepeat: 0, KeyStatePerRepeat: 0.65},
		{MedianOf: 3, EventsVsWithout: 0.9, StageCPUPerRepeat: 2, ServerCPUPerRepeat: 2, KeyStatePerRepeat: 0.65},
	} {
		g := got[i]
		if g.Mode != soSubject || g.Instances != 2 || g.Round != want.Round || g.MedianOf != want.MedianOf || !near(g.EventsVsWithout, want.EventsVsWithout) ||
			!near(g.StageCPUPerRepeat, want.StageCPUPerRepeat) || !near(g.ServerCPUPerRepeat, want.ServerCPUPerRepeat) || !near(g.KeyStatePerRepeat, want.KeyStatePerRepeat) {
			t.Errorf("entry %d: %+v\nwant %+v", i, g, want)
		}
	}
	// With a subject-refresh x1 but no subject x1 in each round, there is
	// no subject 2/1 ratio: a refresh row stands for no row without.
	with1 := slices.Clone(rows)
	for round := 1; round <= 3; round++ {
		with1 = append(with1, &ScaleOutRow{Mode: soSubject, Refresh: true, Instances: 1, Round: round, EventsPerSec: 500})
	}
	if ratios := scaleOutRatios(with1, []float64{0}, 3); len(ratios) != 0 {
		t.Errorf("ratios %+v; want none: the refresh rows are left out of them", ratios)
	}

	var out strings.Builder
	printScaleOut(&out, &ScaleOutRun{Rows: rows, Refresh: got})
	for _, want := range []string{
		"refresh_on_repeat (uncapped, MEDIANS of 3 rounds): subject x2 with over without: events/s 0.90; +2.0 stage CPU µs and +2.0 server CPU µs per repeat; 0.65 key-state records per repeat",
		"subject-refresh  ",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
}
