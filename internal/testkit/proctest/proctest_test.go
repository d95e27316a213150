package proctest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestPortsAreDistinctAndFree(t *testing.T) {
	ps, err := Ports(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if p < 20000 || p >= 32000 {
			t.Errorf("port %d outside 20000-32000", p)
		}
		if seen[p] {
			t.Errorf("port %d handed out twice", p)
		}
		seen[p] = true
	}
	if p := Port(t); seen[p] {
		t.Errorf("port %d handed out again", p)
	}
}

func TestProcessLogAndStop(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh on PATH: ", err)
	}
	log := filepath.Join(t.TempDir(), "p.log")
	p, err := Start(Spec{Name: "sh", Bin: sh, Args: []string{"-c", `echo "$GREETING"; trap 'echo term; exit 3' TERM; while :; do sleep 0.05; done`},
		Env: []string{"GREETING=hello"}, LogPath: log})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.Log(), "hello") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !p.Running() {
		t.Fatalf("exited early: %v", p.Err())
	}
	if !p.Stop(syscall.SIGTERM, 10*time.Second) {
		t.Fatalf("SIGTERM did not stop it:\n%s", p.Log())
	}
	if got := p.Log(); got != "hello\nterm\n" {
		t.Errorf("log %q, want %q", got, "hello\nterm\n")
	}
	if got := p.LogTail(5); got != "...term\n" {
		t.Errorf("LogTail(5) = %q, want %q", got, "...term\n")
	}
	if p.Err() == nil || p.Cmd.ProcessState.ExitCode() != 3 {
		t.Errorf("exit %v, want status 3", p.Err())
	}
}

func TestStopKillsAfterGrace(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh on PATH: ", err)
	}
	p, err := Start(Spec{Name: "sh", Bin: sh, Args: []string{"-c", `trap '' TERM; echo up; while :; do sleep 0.05; done`},
		LogPath: filepath.Join(t.TempDir(), "p.log")})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.Log(), "up") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if p.Stop(syscall.SIGTERM, 200*time.Millisecond) {
		t.Fatal("a process that ignores SIGTERM stopped on it")
	}
	if p.Running() {
		t.Fatal("still running after Stop")
	}
}

func TestStartFailsOnAMissingBinary(t *testing.T) {
	_, err := Start(Spec{Name: "nothing", Bin: filepath.Join(t.TempDir(), "absent"), LogPath: filepath.Join(t.TempDir(), "log")})
	if err == nil || !strings.Contains(err.Error(), "start nothing") {
		t.Fatalf("err %v, want one naming the process", err)
	}
}

// TestProcFigures reads this process's CPU time, memory and open files
// as the bench reads a child's.
func TestProcFigures(t *testing.T) {
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) {
	}
	cpu, err := CPUTime(os.Getpid())
	if err != nil || cpu <= 0 {
		t.Errorf("CPUTime: %v, %v; want above 0 after a busy loop", cpu, err)
	}
	st, err := Status(os.Getpid())
	if err != nil || st["VmRSS"] < 1<<20 || st["Threads"] < 1 {
		t.Errorf("Status: VmRSS %d, Threads %d, %v; want at least 1 MiB and a thread", st["VmRSS"], st["Threads"], err)
	}
	if n, err := OpenFiles(os.Getpid()); err != nil || n < 3 {
		t.Errorf("OpenFiles: %d, %v; want at least stdin, stdout and stderr", n, err)
	}
}
