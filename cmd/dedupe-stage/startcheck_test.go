package main

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/boot"
	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// runRefused runs `dedupe-stage run` with args and returns its exit code
// and output; a run that does not stop by itself within a minute is
// killed and fails the test: it was to refuse to start.
func runRefused(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, append([]string{"run"}, args...)...)
	cmd.Env = append(os.Environ(), "NATS_URL=", "DEDUPE_CONFIG=")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("run did not refuse to start within a minute:\n%s", proctest.Tail(string(out), 3000))
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	case err != nil:
		t.Fatal(err)
	}
	t.Fatalf("run exited 0; it was to refuse to start:\n%s", proctest.Tail(string(out), 3000))
	return 0, ""
}

// loadedState returns the configuration at path as run loads it.
func loadedState(t *testing.T, path string) loaded {
	t.Helper()
	l, err := loadConfig("run", []string{"--config", path}, nil, false, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// makeStore opens and closes the store of the configuration at path with
// partitions partitions, as a run of that configuration leaves it.
func makeStore(t *testing.T, path string, partitions int) {
	t.Helper()
	cfg := loadedState(t, path).cfg
	cfg.State.Partitions = partitions
	w, err := cfg.Window.Derive()
	if err != nil {
		t.Fatal(err)
	}
	so := cfg.StateOptions(w)
	if err := state.CheckRouting(so.Dir, so.Partitions, cfg.Routing()); err != nil {
		t.Fatal(err)
	}
	st, err := state.Open(context.Background(), so)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCheckConfigFindsWhatStopsRun makes, one at a time, every refusal
// run makes at start, has run refuse, and then has check-config --connect
// report it first: a finding of the check that names it, an error (a
// warning for a data dir another process holds, as a running stage does:
// run starts once it stops), saying what run said.
func TestCheckConfigFindsWhatStopsRun(t *testing.T) {
	const totals = "totals: {enabled: true, group: {source: header, header: Tenant}, sinks: {kv: {bucket: TOTALS%s}}}\n"
	for _, tc := range []struct {
		name  string
		extra string // YAML besides checkYAML's
		// setup makes the refusal on the server js and the files of the
		// configuration at path; create edits the streams created as run
		// would create them (nil: create none).
		setup    func(t *testing.T, js jetstream.JetStream, path string)
		create   func(*jetstream.StreamConfig)
		check    string           // the finding's check
		severity finding.Severity // the finding's severity
		says     string           // in run's refusal and in the finding
	}{
		{name: "a stream is missing", check: "stream", severity: finding.Error, says: "does not exist"},
		{name: "the output's duplicate window is short", check: "duplicate_window", severity: finding.Error, says: "output stream duplicate window too short",
			create: func(sc *jetstream.StreamConfig) {
				if sc.Name == "EVENTS_DEDUPED" {
					sc.Duplicates = 10 * time.Second
				}
			}},
		{name: "atomic output on a stream that does not allow it", extra: "output: {publish: atomic}\n", check: "atomic_publish", severity: finding.Error,
			says: "AllowAtomicPublish off", create: func(sc *jetstream.StreamConfig) { sc.AllowAtomicPublish = false }},
		{name: "a work queue another consumer takes", check: "consumer", severity: finding.Error, says: "workqueue",
			create: func(sc *jetstream.StreamConfig) {
				if sc.Name == "EVENTS" {
					sc.Retention = jetstream.WorkQueuePolicy
				}
			},
			setup: func(t *testing.T, js jetstream.JetStream, _ string) {
				if _, err := js.CreateConsumer(context.Background(), "EVENTS", jetstream.ConsumerConfig{Durable: "other", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "the output stream has no key-state subjects", check: "output_subjects", severity: finding.Error, says: "no subjects for the partitions' key-state records",
			create: func(sc *jetstream.StreamConfig) {
				if sc.Name == "EVENTS_DEDUPED" {
					sc.Subjects = sc.Subjects[:1]
				}
			}},
		{name: "the data dir has another partition count", check: "data_dir", severity: finding.Error, says: "the data dir was made with 8 partitions",
			create: func(*jetstream.StreamConfig) {},
			setup:  func(t *testing.T, _ jetstream.JetStream, path string) { makeStore(t, path, 8) }},
		{name: "the data dir has another partition key", extra: strings.Replace(totals, "%s", ", create: true", 1),
			check: "data_dir", severity: finding.Error, says: "is partitioned by key, this configuration by totals.group", create: func(*jetstream.StreamConfig) {},
			setup: func(t *testing.T, _ jetstream.JetStream, path string) {
				cfg := loadedState(t, path).cfg
				if err := state.CheckRouting(cfg.State.Dir(), cfg.State.Partitions, state.RoutingKey); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "the data dir is a file", check: "data_dir", severity: finding.Error, says: "state.data_dir not usable",
			create: func(*jetstream.StreamConfig) {},
			setup: func(t *testing.T, _ jetstream.JetStream, path string) {
				dir := loadedState(t, path).cfg.State.DataDir
				if err := os.Remove(dir); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(dir, []byte("not a dir"), 0o644); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "another process holds the data dir", check: "data_dir", severity: finding.Warning, says: "is in use by another process",
			create: func(*jetstream.StreamConfig) {},
			setup: func(t *testing.T, _ jetstream.JetStream, path string) {
				lock, err := boot.LockDataDir(loadedState(t, path).cfg.State.DataDir)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = lock.Release() })
			}},
		{name: "the HTTP address is taken", check: "http_addr", severity: finding.Error, says: "address already in use",
			create: func(*jetstream.StreamConfig) {},
			setup: func(t *testing.T, _ jetstream.JetStream, path string) {
				ln, err := net.Listen("tcp", loadedState(t, path).cfg.HTTP.Addr)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = ln.Close() })
			}},
		{name: "the totals bucket is missing", extra: strings.Replace(totals, "%s", "", 1), check: "totals_sink", severity: finding.Error,
			says: "bucket not found (create it, or set totals.sinks.kv.create)", create: func(*jetstream.StreamConfig) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := natstest.RunServer(t, "")
			_, js := natstest.Connect(t, srv.ClientURL())
			path := checkYAML(t, srv.ClientURL(), tc.extra+"http: {addr: "+proctest.Addr(t)+"}\n")
			if tc.create != nil {
				createStreams(t, js, path, tc.create)
			}
			if tc.setup != nil {
				tc.setup(t, js, path)
			}
			code, fs, out := checkJSON(t, "--config", path)
			want := 1
			if tc.severity != finding.Error {
				want = 0
			}
			f := findingOf(t, fs, tc.check)
			if code != want || f.Severity != tc.severity || !strings.Contains(f.Message, tc.says) {
				t.Errorf("check-config --connect: exit %d, want %d with a %s %s finding saying %q:\n%s", code, want, tc.severity, tc.check, tc.says, out)
			}
			code, out = runRefused(t, "--config", path)
			if code != 1 || !strings.Contains(out, tc.says) {
				t.Errorf("run: exit %d, want 1 saying %q:\n%s", code, tc.says, proctest.Tail(out, 3000))
			}
		})
	}
}

// TestCheckConfigWarnsAsRunDoes keeps an input stream in memory and on
// other subjects than input.subjects: check-config --connect warns of both
// (exit 0), and run starts and logs the same warnings. A consumer to be
// created with a filter that matches none of the stream's subjects is
// warned of too: it would receive nothing.
func TestCheckConfigWarnsAsRunDoes(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	httpAddr := proctest.Addr(t)
	path := checkYAML(t, srv.ClientURL(), "http: {addr: "+httpAddr+"}\n")
	createStreams(t, js, path, func(sc *jetstream.StreamConfig) {
		if sc.Name == "EVENTS" {
			sc.Storage, sc.Subjects = jetstream.MemoryStorage, []string{"orders.>"}
		}
	})
	code, fs, out := checkJSON(t, "--config", path)
	if code != 0 {
		t.Fatalf("exit %d, want 0 (warnings only):\n%s", code, out)
	}
	storage, subjects := findingOf(t, fs, "storage"), findingOf(t, fs, "input_subjects")
	for _, f := range []finding.Finding{storage, subjects} {
		if f.Severity != finding.Warning || f.Fix == "" {
			t.Errorf("finding %+v, want a warning with its fix", f)
		}
	}
	if !strings.Contains(storage.Message, "input stream EVENTS (input.stream) is kept in memory") {
		t.Errorf("storage finding: %s", storage.Message)
	}
	if !strings.Contains(subjects.Message, "do not cover input.subjects [events.>]") || !strings.Contains(subjects.Fix, "--subjects 'orders.>,events.>'") {
		t.Errorf("subjects finding: %+v", subjects)
	}
	filtered := checkYAML(t, srv.ClientURL(), "http: {addr: "+httpAddr+"}\ninput: {ack_wait: 2s, filter_subject: events.>}\n")
	code, fs, out = checkJSON(t, "--config", filtered)
	if f := findingOf(t, fs, "consumer"); code != 0 || f.Severity != finding.Warning || !strings.Contains(f.Message, "it would receive nothing") {
		t.Errorf("a consumer filter outside the stream: exit %d, %+v:\n%s", code, f, out)
	}

	p := startBinary(t, httpAddr, nil, "--config", path)
	for _, f := range []finding.Finding{storage, subjects} {
		line := strings.SplitN(f.Message, ":", 2)[0]
		natstest.WaitFor(t, 10*time.Second, "run to log "+line, func() bool { return strings.Contains(p.Log(), line) })
	}
}
