package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestModeFlags checks that each mode refuses what it cannot run and
// keeps its own defaults.
func TestModeFlags(t *testing.T) {
	for _, args := range [][]string{
		{"nomode"},
		{"handover", "--keys", "0"},
		{"handover", "--snapshot-interval", "100ms"},
		{"handover", "--stop", "pause"},
		{"handover", "--rounds", "0"},
		{"handover", "--rounds", "2", "--partitions", "2"},
		{"handover", "--stage-env", "GOMEMLIMIT"},
		{"handover", "--stage-env", "=1GiB"},
		{"handover", "--configs", "raw"},
		{"compare", "--stage-env", "GOMEMLIMIT=1GiB"},
		{"compare", "--configs", "raw,nope"},
		{"compare", "--ages", "first=1"},
		{"compare", "--ages", "burst=-1"},
		{"compare", "--ages", "burst"},
		{"compare", "--ages", "bogus=1"},
		{"compare", "--ages", "burst=0,near=0"},
		{"state", "--keys", "10,x"},
		{"scaleout", "--configs", "raw"},
		{"scaleout", "--ages", "burst=0.5,past=0.5"},
		{"scaleout", "--instances", "9"},
		{"scaleout", "--cpu-cap", "-1"},
		{"scaleout", "--rows", "on"},
		{"scaleout", "--rows", "refresh"},
		{"scaleout", "--rows", "subject-refresh-refresh"},
		{"scaleout", "--ack-wait", "1s"},
		{"scaleout", "--rounds", "21"},
		{"scaleout", "--key", "json"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%v: accepted, want refused", args)
		}
	}
	if _, err := parseFlags([]string{"handover", "--stage-env", "GOMEMLIMIT=1GiB,GOGC=50"}); err != nil {
		t.Errorf("--stage-env with two pairs: %v", err)
	}
	f, err := parseFlags([]string{"handover"})
	if err != nil {
		t.Fatal(err)
	}
	if f.syncAlways || f.hoKeys != 1_000_000 || f.partitions != 1 {
		t.Errorf("handover defaults: sync-always %v, keys %d, partitions %d; want no fsync, 1M keys, 1 partition", f.syncAlways, f.hoKeys, f.partitions)
	}
	if f, err = parseFlags([]string{"scaleout"}); err != nil {
		t.Fatal(err)
	}
	if f.syncAlways || f.repeatRatio != 0.3 || f.mix[ClassNear] != 0 || f.mix[ClassPast] != 0 {
		t.Errorf("scaleout defaults: sync-always %v, repeat-ratio %v, mix %v; want false, 0.3, no near or past copies", f.syncAlways, f.repeatRatio, f.mix)
	}
	rows := planRows(f.soModes, f.soInstances, f.cpuCaps, f.rounds)
	if len(rows) != 14 || rows[0] != (soRow{mode: soOff, instances: 1}) || rows[13] != (soRow{mode: soSubject, instances: 3, cap: 0.25}) {
		t.Errorf("default rows: %v; want off, header x1..3, subject x1..3, uncapped then capped at 0.25", rows)
	}
	if f, err := parseFlags([]string{"scaleout", "--sync-always", "--repeat-ratio", "0.1"}); err != nil || !f.syncAlways || f.repeatRatio != 0.1 {
		t.Errorf("flags given: %v; want them kept", err)
	}
	if f, err := parseFlags([]string{"--events", "100", "--ages", "near=2,past=2"}); err != nil || f.mode.name != "compare" || !f.syncAlways || f.events != 100 ||
		f.mix[ClassNear] != 0.5 || f.mix[ClassPast] != 0.5 {
		t.Errorf("flags without a mode: %+v, %v; want the compare mode with fsync, 100 events, near and past copies half each", f, err)
	}
}

// TestHandOverRun runs the mode end to end, two rounds each (a started
// again on its data dir between them, taking the partition back), after
// crashes (--stop kill, the default pin TTL of 10s) and after planned stops
// (--stop term, a pin's TTL of 20s): every probe and loaded key comes out
// once, each new owner takes the partition from the snapshot or as a warm
// standby, after a crash b forwards before the TTL (its detection), and
// after a planned stop well before it, since the stopping owner unpins its
// partition. In the second round a is stopped right after it
// took the partition back, before b, which just released it, stands by
// for it again: the stop's leave of the presence bucket has b pull on it
// before a unpins it.
func TestHandOverRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds dedupe-stage and nats-server and starts a 3-node cluster (about 40s each); not with -short")
	}
	for _, stop := range []string{"kill", "term"} {
		t.Run(stop, func(t *testing.T) {
			dir := t.TempDir()
			// The default pin TTL after a kill, which detection beats;
			// twice it for a planned stop, which beats both.
			args := []string{"handover", "--snapshot-interval", "2s", "--keys", "2000", "--copies", "500", "--stop", stop, "--rounds", "2", "--ack-wait", "10s"}
			if stop == "term" {
				args[len(args)-1] = "20s"
			}
			r := runModeTest(t, dir, args...).HandOver
			const rounds = 2
			if !r.OK || r.Probes == 0 || r.Copies != 500 || r.Stop != stop || len(r.Rounds) != rounds {
				t.Fatalf("%+v; want every probe and loaded key once, probes published, 500 copies, stop %s, %d rounds", r, stop, rounds)
			}
			for i, o := range r.Rounds {
				t.Logf("round %d: %s -> a exited %.2fs, -> first forward %.2fs (pin TTL %gs); takeovers %+v, standby caught up after %.1fs",
					i+1, stop, o.AExitSeconds, o.FirstForwardSeconds, r.PinTTLSeconds, o.Takeovers, o.StandbyCatchUpSeconds)
				if o.Probes == 0 {
					t.Errorf("round %d: no probe published", i+1)
				}
				if stop == "term" {
					// After a crash the first forward waits for the pin's
					// TTL, which runs from the owner's last pull: half the
					// TTL tells the two apart.
					if o.FirstForwardSeconds <= 0 || o.FirstForwardSeconds >= r.PinTTLSeconds/2 || o.AExitSeconds <= 0 {
						t.Errorf("stop -> first forward %.2fs, a exited after %.2fs; want a forward within half the pin's TTL of %gs: the stop unpins",
							o.FirstForwardSeconds, o.AExitSeconds, r.PinTTLSeconds)
					}
					continue
				}
				// The new owner takes the partition from the snapshot of the
				// 2000 keys, or, as a warm standby that tailed the changelog
				// (scale_out.standbys), from its local store, restoring only
				// the tail (docs/scale-out.md §4.4). Before round 2 b owned
				// every key: it stands by warm.
				tk := o.Takeovers
				warm := len(tk) == 1 && tk[0].Path == "local" && tk[0].FromSnapshot == 0 && tk[0].Restored <= 100
				if len(tk) != 1 || !warm && (i > 0 || tk[0].Path != "snapshot" || tk[0].FromSnapshot != 2000) {
					t.Errorf("round %d: takeovers %+v; want one, from the snapshot of the 2000 keys (round 1 only) or from a warm standby's local store with at most the tail restored", i+1, tk)
				}
				// Detection (docs/scale-out.md §4.3) unpins after 3 s of
				// the owner's silence, well before the TTL: also in round
				// 2, whose kill comes right after a balance move.
				if o.FirstForwardSeconds >= r.PinTTLSeconds {
					t.Errorf("round %d: kill -> first forward %.2fs; want it before the pin's TTL of %gs: the standby detects the owner gone", i+1, o.FirstForwardSeconds, r.PinTTLSeconds)
				}
				if o.FirstForwardSeconds <= 0 || r.SnapshotBytesPerKey <= 0 || !warm && o.RestoreRecordsPerSec <= 0 {
					t.Errorf("round %d: first forward %vs, snapshot %v B/key, restore %v records/s; want all measured",
						i+1, o.FirstForwardSeconds, r.SnapshotBytesPerKey, o.RestoreRecordsPerSec)
				}
				if o.BAnonRSSFirstMiB <= 0 || o.BAnonRSSMaxMiB < o.BAnonRSSFirstMiB || o.BHeapInuseMaxMiB <= 0 || o.BPeakRSSMiB < o.BAnonRSSMaxMiB {
					t.Errorf("round %d: new owner's anonymous RSS %.1f -> %.1f MiB, heap in use %.1f MiB, peak RSS %.1f MiB; want each sampled, the peak at least the anonymous maximum",
						i+1, o.BAnonRSSFirstMiB, o.BAnonRSSMaxMiB, o.BHeapInuseMaxMiB, o.BPeakRSSMiB)
				}
			}
			noneLeft(t, dir)
		})
	}
}

// runModeTest runs the mode of args in dir without progress lines, its
// log into t, and fails t if the mode fails.
func runModeTest(t *testing.T, dir string, args ...string) *Results {
	t.Helper()
	f, err := parseFlags(append(args, "--progress", "0", "--dir", dir))
	if err != nil {
		t.Fatal(err)
	}
	f.workDir = dir
	saved := logOut
	logOut = testWriter{t}
	defer func() { logOut = saved }()
	var res Results
	if err := f.mode.run(context.Background(), f, &res); err != nil {
		t.Fatal(err)
	}
	return &res
}

// noneLeft fails t for every process whose command line names dir.
func noneLeft(t *testing.T, dir string) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), dir) {
			t.Errorf("process left behind: %s", strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}
