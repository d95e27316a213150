package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestHandOverFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--handover", "--scaleout"},
		{"--handover", "--configs", "raw"},
		{"--handover", "--nats-url", "nats://127.0.0.1:4222"},
		{"--handover", "--rounds", "2"},
		{"--handover", "--handover-keys", "0"},
		{"--handover", "--handover-partitions", "0"},
		{"--handover", "--handover-snapshot-interval", "100ms"},
		{"--handover", "--handover-stop", "pause"},
		{"--handover", "--stage-env", "GOMEMLIMIT"},
		{"--handover", "--stage-env", "=1GiB"},
		{"--stage-env", "GOMEMLIMIT=1GiB"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%v: accepted, want refused", args)
		}
	}
	if _, err := parseFlags([]string{"--handover", "--stage-env", "GOMEMLIMIT=1GiB,GOGC=50"}); err != nil {
		t.Errorf("--stage-env with two pairs: %v", err)
	}
	f, err := parseFlags([]string{"--handover"})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.kinds) != 0 || f.syncAlways || f.hoKeys != 1_000_000 || f.hoPartitions != 1 {
		t.Errorf("defaults: kinds %v, sync-always %v, keys %d, partitions %d; want no configs, no fsync, 1M keys, 1 partition",
			f.kinds, f.syncAlways, f.hoKeys, f.hoPartitions)
	}
}

func TestHandOverRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds dedupe-stage and nats-server and starts a 3-node cluster (about 40s); not with -short")
	}
	dir := t.TempDir()
	r := runHandOverTest(t, dir, "--handover-keys", "2000", "--handover-copies", "500", "--handover-ack-wait", "2s")
	if !r.OK || r.Probes == 0 || r.Copies != 500 {
		t.Errorf("%+v; want every probe and loaded key once, probes published, 500 copies", r)
	}
	if len(r.Takeovers) != 1 || r.Takeovers[0].Path != "snapshot" || r.Takeovers[0].FromSnapshot != 2000 {
		t.Errorf("takeovers %+v; want one, from the snapshot of the 2000 keys", r.Takeovers)
	}
	if r.FirstForwardSeconds <= 0 || r.SnapshotBytesPerKey <= 0 || r.RestoreRecordsPerSec <= 0 {
		t.Errorf("first forward %vs, snapshot %v B/key, restore %v records/s; want all measured",
			r.FirstForwardSeconds, r.SnapshotBytesPerKey, r.RestoreRecordsPerSec)
	}
	if r.BAnonRSSFirstMiB <= 0 || r.BAnonRSSMaxMiB < r.BAnonRSSFirstMiB || r.BHeapInuseMaxMiB <= 0 || r.BPeakRSSMiB < r.BAnonRSSMaxMiB {
		t.Errorf("b's anonymous RSS %.1f -> %.1f MiB, heap in use %.1f MiB, peak RSS %.1f MiB; want each sampled, the peak at least the anonymous maximum",
			r.BAnonRSSFirstMiB, r.BAnonRSSMaxMiB, r.BHeapInuseMaxMiB, r.BPeakRSSMiB)
	}
	noneLeft(t, dir)
}

// TestHandOverPlannedStop runs the hand-over with a clean stop
// (--handover-stop term) and a pin's TTL of 20s: the new owner forwards
// well before the TTL, since the stopping owner unpins its partition, and
// every probe and loaded key comes out once.
func TestHandOverPlannedStop(t *testing.T) {
	if testing.Short() {
		t.Skip("builds dedupe-stage and nats-server and starts a 3-node cluster (about 40s); not with -short")
	}
	dir := t.TempDir()
	r := runHandOverTest(t, dir, "--handover-stop", "term", "--handover-keys", "2000", "--handover-copies", "100", "--handover-ack-wait", "20s")
	if !r.OK || r.Probes == 0 {
		t.Errorf("%+v; want every probe and loaded key once, probes published, stop term", r)
	}
	// After a crash the first forward waits for the pin's TTL, which runs
	// from the owner's last pull: 16.8s after a SIGKILL in this test's
	// setting. Half the TTL tells the two apart.
	if r.FirstForwardSeconds <= 0 || r.FirstForwardSeconds >= r.PinTTLSeconds/2 || r.AExitSeconds <= 0 {
		t.Errorf("stop -> first forward %.2fs, a exited after %.2fs; want a forward within half the pin's TTL of %gs: the stop unpins",
			r.FirstForwardSeconds, r.AExitSeconds, r.PinTTLSeconds)
	}
	t.Logf("stop -> a exited %.2fs, -> first forward %.2fs (pin TTL %gs)", r.AExitSeconds, r.FirstForwardSeconds, r.PinTTLSeconds)
	noneLeft(t, dir)
}

// runHandOverTest runs the hand-over mode in dir with args added to
// --handover, snapshots every 2s and no progress lines, its log into t.
func runHandOverTest(t *testing.T, dir string, args ...string) *HandOverRun {
	t.Helper()
	f, err := parseFlags(append([]string{"--handover", "--handover-snapshot-interval", "2s", "--progress", "0", "--dir", dir}, args...))
	if err != nil {
		t.Fatal(err)
	}
	saved := logOut
	logOut = testWriter{t}
	defer func() { logOut = saved }()
	r, err := runHandOver(context.Background(), f, dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
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
