package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// signalSetup is a stage to signal: on an external in-process server, or
// on its embedded server.
type signalSetup struct {
	cfgPath  string
	httpAddr string
	natsURL  string // where the test reaches the stage's server
}

// newSignalSetup writes a config at the log level info (JSON), with the
// embedded server when embedded is true.
func newSignalSetup(t *testing.T, embedded bool) signalSetup {
	t.Helper()
	s := signalSetup{cfgPath: filepath.Join(t.TempDir(), "stage.yaml"), httpAddr: proctest.Addr(t)}
	url := ""
	if !embedded {
		s.natsURL = natstest.RunServer(t, "").ClientURL()
		url = s.natsURL
	}
	cfg := stageConfig(url, t.TempDir(), s.httpAddr) + "  level: info\n"
	if embedded {
		port := proctest.Port(t)
		s.natsURL = fmt.Sprintf("nats://127.0.0.1:%d", port)
		cfg = strings.Replace(cfg, "  url: \n", fmt.Sprintf("  embedded: {port: %d}\n", port), 1)
	}
	s.write(t, cfg)
	return s
}

func (s signalSetup) write(t *testing.T, cfg string) {
	t.Helper()
	if err := os.WriteFile(s.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
}

// edit rewrites the config, replacing old with new.
func (s signalSetup) edit(t *testing.T, old, new string) {
	t.Helper()
	cfg := readFile(t, s.cfgPath)
	if !strings.Contains(cfg, old) {
		t.Fatalf("config lacks %q:\n%s", old, cfg)
	}
	s.write(t, strings.Replace(cfg, old, new, 1))
}

// signal sends sig to p.
func (p *proc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// waitLog waits until the log has a line containing sub, and returns it.
func (p *proc) waitLog(t *testing.T, sub string) string {
	t.Helper()
	var line string
	natstest.WaitFor(t, 30*time.Second, "a log line with "+sub, func() bool {
		line = grepLines(p.Log(), sub)
		return line != ""
	})
	return line
}

// assertRunning fails the test when p has exited.
func (p *proc) assertRunning(t *testing.T) {
	t.Helper()
	select {
	case <-p.Exited():
		t.Fatalf("the stage exited: %v\n%s", p.Err(), proctest.Tail(p.Log(), 3000))
	default:
	}
}

// waitExit waits up to limit for p to exit and returns its exit code.
func (p *proc) waitExit(t *testing.T, limit time.Duration) int {
	t.Helper()
	select {
	case <-p.Exited():
		return p.Cmd.ProcessState.ExitCode()
	case <-time.After(limit):
		t.Fatalf("still running %v after the signal", limit)
		return 0
	}
}

const debugLevel = `"level":"DEBUG"`

func TestSIGHUPReloads(t *testing.T) {
	for _, embedded := range []bool{false, true} {
		t.Run(map[bool]string{false: "external server", true: "embedded server"}[embedded], func(t *testing.T) {
			s := newSignalSetup(t, embedded)
			p := startBinary(t, s.httpAddr, nil, "--config", s.cfgPath)
			if strings.Contains(p.Log(), debugLevel) {
				t.Fatalf("a debug line at level info:\n%s", grepLines(p.Log(), debugLevel))
			}

			// The level applies at once; input.ack_wait needs a restart.
			s.edit(t, "  level: info\n", "  level: debug\n")
			s.edit(t, "ack_wait: 2s", "ack_wait: 3s")
			p.signal(t, syscall.SIGHUP)
			line := p.waitLog(t, "configuration reloaded on SIGHUP")
			for _, want := range []string{`"applied":"log.level info -> debug"`, `"needs_restart":"input.ack_wait"`} {
				if !strings.Contains(line, want) {
					t.Errorf("the reload line lacks %s: %s", want, line)
				}
			}
			p.assertRunning(t)
			reloadedAt := len(p.Log())

			// An invalid file: logged, and the stage runs on.
			s.edit(t, "partitions: 4", "partitions: 0")
			p.signal(t, syscall.SIGHUP)
			if line := p.waitLog(t, "reload on SIGHUP failed"); !strings.Contains(line, "state.partitions") {
				t.Errorf("the failed reload does not name the field: %s", line)
			}
			time.Sleep(500 * time.Millisecond) // a process killed by the signal would be gone by now
			p.assertRunning(t)
			if code, _ := get(t, "http://"+s.httpAddr+"/readyz"); code != 200 {
				t.Errorf("/readyz %d after a failed reload, want 200", code)
			}

			// A clean stop, whose debug lines now show.
			p.signal(t, syscall.SIGTERM)
			if code := p.waitExit(t, 30*time.Second); code != 0 {
				t.Fatalf("exit %d after SIGTERM, want 0:\n%s", code, proctest.Tail(p.Log(), 3000))
			}
			after := p.Log()[reloadedAt:]
			if !strings.Contains(after, "stopped cleanly") {
				t.Errorf("no clean stop:\n%s", proctest.Tail(after, 3000))
			}
			if !strings.Contains(after, debugLevel) {
				t.Errorf("no debug line after the level was raised to debug:\n%s", proctest.Tail(after, 3000))
			}
		})
	}
}

func TestSecondSIGTERMExitsAtOnce(t *testing.T) {
	for _, embedded := range []bool{false, true} {
		t.Run(map[bool]string{false: "external server", true: "embedded server"}[embedded], func(t *testing.T) {
			s := newSignalSetup(t, embedded)
			p := startBinary(t, s.httpAddr, nil, "--config", s.cfgPath)
			nc, err := nats.Connect(s.natsURL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			// Without its output stream the stage cannot finish a batch: a
			// clean stop waits for it (up to the 30s shutdown timeout).
			if err := js.DeleteStream(context.Background(), "EVENTS_DEDUPED"); err != nil {
				t.Fatal(err)
			}
			publishWithRepeats(t, js, "second", 50)
			natstest.WaitFor(t, 30*time.Second, "a batch in flight", func() bool {
				return consumerInfo(t, js).NumAckPending > 0
			})

			p.signal(t, syscall.SIGTERM)
			p.waitLog(t, "stopping: finishing the batch in flight")
			p.assertRunning(t)
			p.signal(t, syscall.SIGTERM)
			if code := p.waitExit(t, 10*time.Second); code != exitSecondSignal {
				t.Fatalf("exit %d after the second SIGTERM, want %d:\n%s", code, exitSecondSignal, proctest.Tail(p.Log(), 3000))
			}
			log := p.Log()
			if !strings.Contains(log, "second signal: exiting at once") || strings.Contains(log, "stopped cleanly") {
				t.Errorf("the log does not show an exit at once:\n%s", proctest.Tail(log, 3000))
			}
		})
	}
}

// TestChangedFieldsNamesYAMLPaths: a reload names each changed field by
// its path in the file, inline sections included, and never a value.
func TestChangedFieldsNamesYAMLPaths(t *testing.T) {
	a := config.Default()
	b := a
	b.Input.Limits.MaxAge = config.Duration(time.Hour) // an inline section
	b.NATS.Password = "s3cret"
	b.Log.Level = "debug"
	got := strings.Join(changedFields(a, b), " ")
	if want := "nats.password input.max_age log.level"; got != want {
		t.Errorf("changed fields %q, want %q", got, want)
	}
	if len(changedFields(a, a)) != 0 {
		t.Errorf("a config differs from itself: %v", changedFields(a, a))
	}
}
