package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// cliRun runs the command line in process and returns its exit status,
// stdout and stderr.
func cliRun(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb strings.Builder
	code := realMain(args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestExitCodes checks the one table of exit codes (README, "Exit codes")
// command by command: 0 OK, 1 failure or findings, 2 usage, 3 cannot
// connect; status's 3 UNKNOWN for what it cannot tell. Where a code needs
// a running stage, the test named in the case's comment covers it.
func TestExitCodes(t *testing.T) {
	for _, v := range []string{"NATS_URL", "NATS_CONTEXT", "DEDUPE_NATS_URL", "DEDUPE_CONFIG", "DEDUPE_HTTP_ADDR", "DEDUPE_PARTITIONS"} {
		t.Setenv(v, "")
	}
	srv := natstest.RunServer(t, "")
	up := srv.ClientURL()
	const down = "nats://127.0.0.1:1"
	_, js := natstest.Connect(t, up)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "DEDUPE_DLQ", Subjects: []string{"dedupe.dlq.>"}}); err != nil {
		t.Fatal(err)
	}
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }))
	defer healthy.Close()
	sick := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "unhealthy: publish", http.StatusServiceUnavailable)
	}))
	defer sick.Close()
	addr := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	noHTTP := []string{"--http-addr", ""}
	data := []string{"--data-dir", t.TempDir()}

	cases := []struct {
		name string
		args []string
		code int
	}{
		// run: 0 after SIGTERM is TestSIGTERMExitsCleanly's.
		{"run invalid configuration", append([]string{"run", "--partitions", "0"}, noHTTP...), exitFindings},
		{"run unknown flag", []string{"run", "--bogus"}, exitUsage},
		{"run argument", []string{"run", "extra"}, exitUsage},
		{"run no server", append(append([]string{"run", "-s", down}, noHTTP...), data...), exitConnect},

		{"check-config valid", []string{"check-config"}, exitOK},
		{"check-config invalid", []string{"check-config", "--partitions", "0"}, exitFindings},
		{"check-config bad value", []string{"check-config", "--partitions", "many"}, exitUsage},
		{"check-config two files", []string{"check-config", "a.yaml", "b.yaml"}, exitUsage},
		{"check-config --connect no server", []string{"check-config", "--connect", "-s", down}, exitConnect},

		// status: 0 and 2 are TestStatusOwnersThenPinsExpired's.
		{"status unknown flag", []string{"status", "--bogus"}, statusUnknown},
		{"status no server", []string{"status", "-s", down}, statusUnknown},

		// inspect and forget: 0 is TestInspectOverNATS's and TestForget*'s.
		{"inspect no stage answers", []string{"inspect", "-s", up, "--timeout", "300ms", "k"}, exitFindings},
		{"inspect no KEY", []string{"inspect", "-s", up}, exitUsage},
		{"inspect no server", []string{"inspect", "-s", down, "k"}, exitConnect},
		{"forget no stage answers", []string{"forget", "-s", up, "--timeout", "300ms", "k"}, exitFindings},
		{"forget unknown flag", []string{"forget", "--partitions", "3", "k"}, exitUsage},
		{"forget no server", []string{"forget", "-s", down, "k"}, exitConnect},

		// redrive: 1 with refusals is TestRedriveExitCodes'.
		{"redrive nothing to do", []string{"redrive", "-s", up}, exitOK},
		{"redrive bad reason", []string{"redrive", "-s", up, "--reason", "nope"}, exitUsage},
		{"redrive no server", []string{"redrive", "-s", down}, exitConnect},

		{"healthcheck healthy", []string{"healthcheck", "--http-addr", addr(healthy)}, exitOK},
		{"healthcheck unhealthy", []string{"healthcheck", "--http-addr", addr(sick)}, exitFindings},
		{"healthcheck unknown flag", []string{"healthcheck", "-s", up}, exitUsage},
		{"healthcheck nothing listening", []string{"healthcheck", "--http-addr", "127.0.0.1:1"}, exitConnect},

		{"version", []string{"version"}, exitOK},
		{"version argument", []string{"version", "extra"}, exitUsage},
		{"completion", []string{"completion", "fish"}, exitOK},
		{"completion unknown shell", []string{"completion", "tcsh"}, exitUsage},
		{"help", []string{"--help"}, exitOK},
		{"no command", nil, exitUsage},
		{"unknown command", []string{"runn"}, exitUsage},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errs := cliRun(t, c.args...)
			if code != c.code {
				t.Fatalf("%q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", c.args, code, c.code, out, errs)
			}
			if code == exitUsage && len(c.args) > 0 && c.args[0] != "--help" {
				if n := strings.Count(strings.TrimSpace(errs), "\n") + 1; n > 2 {
					t.Errorf("%q: a usage error of %d lines, want at most 2:\n%s", c.args, n, errs)
				}
			}
		})
	}
}

// TestSuggestions: a mistyped command or flag is told in two lines, with
// the closest name.
func TestSuggestions(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"runn"}, `unknown command "runn"; did you mean "run"?`},
		{[]string{"chek-config"}, `did you mean "check-config"?`},
		{[]string{"run", "--partitons", "3"}, "unknown flag --partitons; did you mean --partitions?"},
		{[]string{"redrive", "--dryrun"}, "did you mean --dry-run?"},
		{[]string{"status", "--jsn"}, "UNKNOWN: unknown flag --jsn; did you mean --json?"},
		{[]string{"inspect", "--contxt", "prod", "k"}, "did you mean --context?"},
	} {
		code, _, errs := cliRun(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%q: exit %d, stderr %q; want it to say %q", c.args, code, errs, c.want)
		}
	}
}

// TestHelpOfEveryCommand: each command's help has its summary, a
// description, examples, its flags in groups (its own, then the
// connection's, then the embedded server's) and its exit codes; a flag's
// help never takes a backticked word as its argument's name.
func TestHelpOfEveryCommand(t *testing.T) {
	root := (&cli{stdout: &strings.Builder{}, stderr: &strings.Builder{}}).newRootCmd()
	for _, cmd := range root.Commands() {
		t.Run(cmd.Name(), func(t *testing.T) {
			if cmd.Short == "" || cmd.Long == "" || cmd.Example == "" {
				t.Errorf("summary %q, description %q, examples %q: want all three", cmd.Short, cmd.Long, cmd.Example)
			}
			code, help, _ := cliRun(t, cmd.Name(), "--help")
			if code != 0 {
				t.Fatalf("--help: exit %d", code)
			}
			for _, want := range []string{cmd.Long, "Examples:", "Exit codes: "} {
				if !strings.Contains(help, want) {
					t.Errorf("help lacks %q:\n%s", want, help)
				}
			}
			last := -1
			for _, g := range []string{groupOwn, groupConn, groupEmbedded} {
				i := strings.Index(help, "\n"+groupTitles[g]+":\n")
				if i < 0 {
					continue
				}
				if i < last {
					t.Errorf("the group %q comes before the one above it:\n%s", groupTitles[g], help)
				}
				last = i
			}
			cmd.Flags().VisitAll(func(f *pflag.Flag) {
				if strings.Contains(f.Usage, "`") {
					t.Errorf("--%s's help %q has a backticked word, which help shows as the argument's name", f.Name, f.Usage)
				}
				if name, _ := pflag.UnquoteUsage(f); strings.Contains(name, " ") {
					t.Errorf("--%s's argument is named %q", f.Name, name)
				}
			})
		})
	}
	_, help, _ := cliRun(t, "run", "--help")
	own, conn, emb := strings.Index(help, "\nFlags:"), strings.Index(help, "\nConnection flags"), strings.Index(help, "\nEmbedded server flags")
	if own < 0 || conn < own || emb < conn {
		t.Errorf("run --help: want its own flags, then the connection's, then the embedded server's:\n%s", help)
	}
	if !strings.Contains(help, "--embedded-system-account  ") {
		t.Errorf("run --help: --embedded-system-account shows an argument:\n%s", help)
	}
	// Shown only where they apply: redrive's help lists no embedded server
	// flag, and status's none of run's state flags.
	for cmd, not := range map[string][]string{"redrive": {"--embedded-port", "--data-dir", "--partitions"}, "status": {"--embedded-port", "--data-dir", "--sync-writes"}} {
		_, help, _ := cliRun(t, cmd, "--help")
		for _, n := range not {
			if strings.Contains(help, n) {
				t.Errorf("%s --help lists %s, which does not apply:\n%s", cmd, n, help)
			}
		}
	}
}

// TestFlagsAsBefore: the flags keep their forms: long flags with one dash
// or two, -s, --nats-url and --tls-first; hidden flags are still taken.
func TestFlagsAsBefore(t *testing.T) {
	t.Setenv("DEDUPE_CONFIG", "")
	t.Setenv("NATS_URL", "")
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(path, []byte("state: {partitions: 3}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"check-config", "-config", path, "-partitions", "5"}, "partitions:  5"},
		{[]string{"check-config", "-config=" + path}, "partitions:  3"},
		{[]string{"check-config", "-s", "nats://h1:4222"}, "nats://h1:4222"},
		{[]string{"check-config", "--nats-url", "nats://h2:4222"}, "nats://h2:4222"},
		{[]string{"check-config", "--server=nats://h3:4222", "--tls-first"}, "nats://h3:4222"},
		{[]string{"check-config", "--key-header", "-Odd-"}, `header "-Odd-"`}, // a value that starts with a dash
	} {
		code, out, errs := cliRun(t, c.args...)
		if code != 0 || !strings.Contains(out, c.want) {
			t.Errorf("%q: exit %d, want 0 with %q:\n%s%s", c.args, code, c.want, out, errs)
		}
	}
	// redrive takes run's flags as before, though its help shows only the
	// ones it uses.
	if code, _, errs := cliRun(t, "redrive", "--data-dir", dir, "--partitions", "4"); code != exitUsage || !strings.Contains(errs, "give -s/--server") {
		t.Errorf("redrive with run's flags and no server: exit %d, %q; want the usage error for no server", code, errs)
	}
}

// TestCompletion: the scripts for bash, zsh and fish name the binary and
// its commands complete.
func TestCompletion(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish"} {
		code, out, errs := cliRun(t, "completion", sh)
		if code != 0 || !strings.Contains(out, "dedupe-stage") {
			t.Errorf("completion %s: exit %d, %d bytes: %s", sh, code, len(out), errs)
		}
	}
	code, out, _ := cliRun(t, cobra.ShellCompRequestCmd, "re")
	if code != 0 || !strings.Contains(out, "redrive") {
		t.Errorf("completing \"re\": exit %d:\n%s", code, out)
	}
	_, out, _ = cliRun(t, cobra.ShellCompRequestCmd, "redrive", "--reason", "")
	if !strings.Contains(out, "output_rejected") {
		t.Errorf("completing redrive --reason:\n%s", out)
	}
}

// TestReadmeExitCodes: the README's table of exit codes is the one the
// commands use.
func TestReadmeExitCodes(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\| (\d) \| ([^|]+) \| ([^|]+) \|$`).FindAllStringSubmatch(string(b), -1) {
		rows[m[1]] = strings.TrimSpace(m[2]) + " / " + strings.TrimSpace(m[3])
	}
	var table []string
	for _, e := range strings.Split(exitTable, ", ") {
		code, meaning, _ := strings.Cut(e, " ")
		table = append(table, code)
		if !strings.HasPrefix(rows[code], meaning+" /") {
			t.Errorf("README's exit code %s is %q, want %q (cli.go's exitTable)", code, rows[code], meaning)
		}
	}
	status := (&cli{stdout: &strings.Builder{}, stderr: &strings.Builder{}}).newStatusCmd().Annotations[exitCodesKey]
	for _, code := range []string{"0 OK", "2 CRITICAL", "3 UNKNOWN"} {
		c, word, _ := strings.Cut(code, " ")
		if !strings.Contains(status, code) || !strings.HasPrefix(strings.SplitN(rows[c], " / ", 2)[1], word) {
			t.Errorf("status's exit code %s: README %q, help %q", code, rows[c], status)
		}
	}
	if !slices.Equal(table, []string{"0", "1", "2", "3"}) {
		t.Errorf("exitTable %q", exitTable)
	}
}

// TestNormalizeArgs: long flags written with one dash get two; values and
// what follows "--" stay as they are.
func TestNormalizeArgs(t *testing.T) {
	run := (&cli{stdout: &strings.Builder{}, stderr: &strings.Builder{}}).newRunCmd()
	got := normalizeArgs(run, []string{"-config", "c.yaml", "-s", "-x", "--key-header", "-h", "-partitions=3", "-h", "--", "-config"})
	want := []string{"--config", "c.yaml", "-s", "-x", "--key-header", "-h", "--partitions=3", "-h", "--", "-config"}
	if !slices.Equal(got, want) {
		t.Errorf("normalizeArgs = %q, want %q", got, want)
	}
}
