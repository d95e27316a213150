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
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%v: accepted, want refused", args)
		}
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
	f, err := parseFlags([]string{"--handover", "--handover-keys", "2000", "--handover-copies", "500",
		"--handover-ack-wait", "2s", "--handover-snapshot-interval", "2s", "--progress", "0", "--dir", dir})
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
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), dir) {
			t.Errorf("process left behind: %s", strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}
