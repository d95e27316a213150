package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// checkYAML is a config for check-config --connect against url: keys from
// the Event-Id header, streams not created by run unless extra says so.
func checkYAML(t *testing.T, url, extra string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stage.yaml")
	if !strings.Contains(extra, "input:") {
		extra += "input: {ack_wait: 2s}\n"
	}
	if !strings.Contains(extra, "http:") {
		extra += "http: {addr: \"127.0.0.1:0\"}\n" // a port that is never taken: check-config checks that run can listen
	}
	yml := "nats: {url: " + url + "}\nkey: {source: header, header: Event-Id}\n" +
		"state: {partitions: 4, data_dir: " + t.TempDir() + "}\n" + extra
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// createStreams creates the streams of the config at path as run would,
// changing each with edit first (when not nil).
func createStreams(t *testing.T, js jetstream.JetStream, path string, edit func(*jetstream.StreamConfig)) {
	t.Helper()
	l, err := loadConfig("check-config", []string{"--config", path}, nil, true, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	wanted, err := stage.StreamsToCreate(l.cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range wanted {
		sc := w.Config
		if edit != nil {
			edit(&sc)
		}
		if _, err := js.CreateStream(context.Background(), sc); err != nil {
			t.Fatalf("create stream %s: %v", sc.Name, err)
		}
	}
}

// checkJSON runs check-config --connect --json and returns its exit code
// and findings.
func checkJSON(t *testing.T, args ...string) (int, []finding.Finding, string) {
	t.Helper()
	var out, errb strings.Builder
	code := realMain(append([]string{"check-config", "--connect", "--json"}, args...), &out, &errb)
	var fs []finding.Finding
	if code == 0 || code == exitFindings {
		if err := json.Unmarshal([]byte(out.String()), &fs); err != nil {
			t.Fatalf("check-config --json printed no JSON list (%v):\n%s\nstderr: %s", err, out.String(), errb.String())
		}
	}
	return code, fs, out.String() + errb.String()
}

// findingOf returns the first finding of check, failing the test when
// there is none.
func findingOf(t *testing.T, fs []finding.Finding, check string) finding.Finding {
	t.Helper()
	for _, f := range fs {
		if f.Check == check {
			return f
		}
	}
	t.Fatalf("no %s finding in %+v", check, fs)
	return finding.Finding{}
}

// serverInventory lists the streams and consumers on the server, to see
// that a check changed nothing.
func serverInventory(t *testing.T, js jetstream.JetStream) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	for info := range js.ListStreams(ctx).Info() {
		b.WriteString(info.Config.Name + ":")
		st, err := js.Stream(ctx, info.Config.Name)
		if err != nil {
			t.Fatal(err)
		}
		for name := range st.ConsumerNames(ctx).Name() {
			b.WriteString(" " + name)
		}
		b.WriteString(";")
	}
	return b.String()
}

func TestCheckConnectWellConfigured(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())

	// Nothing on the server, and run creates what is missing: only
	// information, exit 0, and nothing created.
	path := checkYAML(t, srv.ClientURL(), "")
	code, fs, out := checkJSON(t, "--config", path, "--create-streams")
	if code != 0 || finding.Stops(fs) {
		t.Fatalf("exit %d, want 0:\n%s", code, out)
	}
	if f := findingOf(t, fs, "stream"); f.Severity != finding.Info || !strings.Contains(f.Message, "run creates it") {
		t.Errorf("a stream run creates: %+v", f)
	}
	if inv := serverInventory(t, js); inv != "" {
		t.Errorf("check-config --connect created %s", inv)
	}

	// The streams as run creates them: exit 0, the consumer is what run
	// would create, and the server is as it was.
	createStreams(t, js, path, nil)
	before := serverInventory(t, js)
	code, fs, out = checkJSON(t, "--config", path)
	if code != 0 {
		t.Fatalf("exit %d, want 0:\n%s", code, out)
	}
	for _, f := range fs {
		if f.Severity != finding.Info {
			t.Errorf("a well-configured setup has a finding: %+v", f)
		}
	}
	findingOf(t, fs, "consumer")
	if after := serverInventory(t, js); after != before {
		t.Errorf("check-config --connect changed the server: %s, then %s", before, after)
	}

	// The text form says the same.
	var stdout, stderr strings.Builder
	if code := realMain([]string{"check-config", "--connect", "--config", path}, &stdout, &stderr); code != 0 {
		t.Fatalf("text form: exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "0 would stop run") || !strings.Contains(stdout.String(), "consumer") {
		t.Errorf("text form:\n%s", stdout.String())
	}
}

func TestCheckConnectFindings(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())

	t.Run("duplicate window too short", func(t *testing.T) {
		path := checkYAML(t, srv.ClientURL(), "input: {stream: DUP_IN, ack_wait: 2s}\noutput: {stream: DUP_OUT, subject_prefix: dup}\ndead_letter: {stream: DUP_DL, subject: dupdl}\n")
		createStreams(t, js, path, func(sc *jetstream.StreamConfig) {
			if sc.Name == "DUP_OUT" {
				sc.Duplicates = time.Second
			}
		})
		code, fs, out := checkJSON(t, "--config", path)
		if code != exitFindings {
			t.Fatalf("exit %d, want %d:\n%s", code, exitFindings, out)
		}
		f := findingOf(t, fs, "duplicate_window")
		if f.Severity != finding.Error || !strings.HasPrefix(f.Fix, "nats stream edit DUP_OUT --dupe-window ") {
			t.Errorf("finding %+v, want an error fixed by nats stream edit DUP_OUT --dupe-window", f)
		}
		// Allowed short: run starts, and warns.
		allowed := filepath.Join(t.TempDir(), "allowed.yaml")
		os.WriteFile(allowed, []byte(strings.Replace(readFile(t, path), "subject_prefix: dup}", "subject_prefix: dup, allow_short_duplicate_window: true}", 1)), 0o600)
		code, fs, out = checkJSON(t, "--config", allowed)
		if f := findingOf(t, fs, "duplicate_window"); code != 0 || f.Severity != finding.Warning {
			t.Errorf("with --allow-short-duplicate-window: exit %d, finding %+v, want 0 and a warning:\n%s", code, f, out)
		}
		applyFix(t, srv.ClientURL(), f.Fix)
		if code, _, out := checkJSON(t, "--config", path); code != 0 {
			t.Errorf("after %s: exit %d:\n%s", f.Fix, code, out)
		}
	})

	t.Run("stream missing", func(t *testing.T) {
		path := checkYAML(t, srv.ClientURL(), "input: {stream: MISS_IN, subjects: [miss.>], ack_wait: 2s}\noutput: {stream: MISS_OUT, subject_prefix: missout}\ndead_letter: {stream: MISS_DL, subject: missdl}\n")
		createStreams(t, js, path, nil)
		if err := js.DeleteStream(context.Background(), "MISS_IN"); err != nil {
			t.Fatal(err)
		}
		code, fs, out := checkJSON(t, "--config", path)
		if code != exitFindings {
			t.Fatalf("exit %d, want %d:\n%s", code, exitFindings, out)
		}
		f := findingOf(t, fs, "stream")
		if f.Severity != finding.Error || !strings.Contains(f.Message, "MISS_IN") || !strings.HasPrefix(f.Fix, "nats stream add MISS_IN ") {
			t.Errorf("finding %+v, want an error fixed by nats stream add MISS_IN", f)
		}
		applyFix(t, srv.ClientURL(), f.Fix)
		if code, _, out := checkJSON(t, "--config", path); code != 0 {
			t.Errorf("after %s: exit %d:\n%s", f.Fix, code, out)
		}
	})

	t.Run("group without the partition transform", func(t *testing.T) {
		path := checkYAML(t, srv.ClientURL(), "input: {stream: GRP_IN, subjects: [grp.*], ack_wait: 2s}\n"+
			"output: {stream: GRP_OUT, subject_prefix: grpout}\ndead_letter: {stream: GRP_DL, subject: grpdl}\n"+
			"scale_out: {enabled: true, instance: a, replicas: 1, route: never}\n")
		// The key is the subject's second token, which the transform partitions by.
		os.WriteFile(path, []byte(strings.Replace(readFile(t, path), "key: {source: header, header: Event-Id}", "key: {source: subject, subject_token: 2}", 1)), 0o600)
		createStreams(t, js, path, func(sc *jetstream.StreamConfig) {
			if sc.Name == "GRP_IN" {
				sc.SubjectTransform = nil
			}
		})
		// Messages stored before the transform.
		for _, s := range []string{"grp.a", "grp.b", "grp.c"} {
			if _, err := js.Publish(context.Background(), s, []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		code, fs, out := checkJSON(t, "--config", path)
		if code != exitFindings {
			t.Fatalf("exit %d, want %d:\n%s", code, exitFindings, out)
		}
		f := findingOf(t, fs, "partition_transform")
		if f.Severity != finding.Error || !strings.HasPrefix(f.Fix, "nats stream edit GRP_IN --transform-source 'grp.*' --transform-destination ") {
			t.Errorf("finding %+v, want an error fixed by nats stream edit GRP_IN --transform-source", f)
		}
		u := findingOf(t, fs, "untokened_backlog")
		if u.Severity != finding.Error || !strings.Contains(u.Message, "holds 3 messages without a partition token") {
			t.Errorf("finding %+v, want the 3 messages stored before the transform", u)
		}
		findingOf(t, fs, "consumer_group") // run creates it
		applyFix(t, srv.ClientURL(), f.Fix)
		applyFix(t, srv.ClientURL(), u.Fix)
		if code, fs, out := checkJSON(t, "--config", path); code != 0 {
			t.Errorf("after %s and %s: exit %d, %+v:\n%s", f.Fix, u.Fix, code, fs, out)
		}
	})
}

// applyFix runs a finding's fix with the nats CLI against url. Without the
// CLI the fix is not run, and the test says so.
func applyFix(t *testing.T, url, fix string) {
	t.Helper()
	cli, err := exec.LookPath("nats")
	if err != nil {
		home, _ := os.UserHomeDir()
		if cli = filepath.Join(home, "go", "bin", "nats"); !fileExists(cli) {
			t.Logf("not running the fix %q: no nats CLI on PATH or in ~/go/bin (go install github.com/nats-io/natscli/nats@v0.5.0)", fix)
			t.SkipNow()
		}
	}
	for _, cmd := range strings.Split(fix, "; ") {
		c := exec.Command("sh", "-c", strings.Replace(cmd, "nats ", "\"$NATS_CLI\" --no-context -s "+url+" ", 1))
		c.Env = append(os.Environ(), "NATS_CLI="+cli)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("the fix %q failed: %v\n%s", cmd, err, out)
		}
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestCheckConnectExitCodes(t *testing.T) {
	path := checkYAML(t, "nats://127.0.0.1:1", "")
	var out, errb strings.Builder
	if code := realMain([]string{"check-config", "--connect", "--config", path}, &out, &errb); code != exitConnect {
		t.Errorf("unreachable server: exit %d, want %d: %s", code, exitConnect, errb.String())
	}
	for _, args := range [][]string{
		{"check-config", "--connect", "--no-such-flag"},
		{"check-config", "--json", "--config", path},
		{"check-config", "--connect", "--data-dir", t.TempDir()}, // the embedded server: nothing to connect to
	} {
		errb.Reset()
		if code := realMain(args, &out, &errb); code != exitUsage {
			t.Errorf("%q: exit %d, want %d: %s", args, code, exitUsage, errb.String())
		}
	}
}
