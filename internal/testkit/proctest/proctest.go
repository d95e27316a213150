// Package proctest runs real binaries for tests and the bench: free
// loopback ports, a child process whose output goes to a log file, and the
// tail of that log.
package proctest

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// portsMu guards portsGiven, the ports Ports handed out in this process.
var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// Ports returns n distinct loopback ports free at the time of the call, for
// a server started later. It draws them below the kernel's ephemeral range
// (32768-60999 by default), so that no socket the kernel numbers itself can
// take one before the server binds it, and never hands out a port twice in
// one process.
func Ports(n int) ([]int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 200*n {
			return nil, fmt.Errorf("no %d free loopback ports between 20000 and 32000 in %d tries", n, tries)
		}
		port := 20000 + rand.IntN(12000)
		if portsGiven[port] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		ln.Close()
		portsGiven[port] = true
		ports = append(ports, port)
	}
	return ports, nil
}

// Port returns one free loopback port, failing the test when there is none.
func Port(tb testing.TB) int {
	tb.Helper()
	ps, err := Ports(1)
	if err != nil {
		tb.Fatal(err)
	}
	return ps[0]
}

// Addr returns "127.0.0.1:<port>" for a free loopback port.
func Addr(tb testing.TB) string {
	tb.Helper()
	return fmt.Sprintf("127.0.0.1:%d", Port(tb))
}

// Spec is what Start runs.
type Spec struct {
	Name    string   // names the process in errors
	Bin     string   // the executable
	Args    []string // its arguments
	Env     []string // added to this process's environment
	LogPath string   // where stdout and stderr are appended

	// KillWithParent has the kernel send SIGKILL to the process when this
	// one dies without stopping it.
	KillWithParent bool
}

// Process is a running child whose output goes to a log file.
type Process struct {
	Name    string
	Cmd     *exec.Cmd
	LogPath string
	Started time.Time

	exited chan struct{} // closed once the process has exited
	err    error         // its exit status, valid once exited is closed
}

// Start runs s.Bin with its output appended to s.LogPath.
func Start(s Spec) (*Process, error) {
	logf, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	cmd := exec.Command(s.Bin, s.Args...)
	if len(s.Env) > 0 {
		cmd.Env = append(os.Environ(), s.Env...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if s.KillWithParent {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	p := &Process{Name: s.Name, Cmd: cmd, LogPath: s.LogPath, Started: time.Now(), exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	return p, nil
}

// Exited is closed once the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err is the exit status: nil for a clean exit or while the process runs.
func (p *Process) Err() error {
	select {
	case <-p.exited:
		return p.err
	default:
		return nil
	}
}

// Running reports whether the process has not exited.
func (p *Process) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Signal sends sig; a process that has exited is left alone.
func (p *Process) Signal(sig os.Signal) {
	if p.Running() {
		_ = p.Cmd.Process.Signal(sig)
	}
}

// Wait waits up to timeout for the exit and reports whether it came.
func (p *Process) Wait(timeout time.Duration) bool {
	select {
	case <-p.exited:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Kill sends SIGKILL and waits for the exit.
func (p *Process) Kill() {
	if p.Running() {
		_ = p.Cmd.Process.Kill()
	}
	<-p.exited
}

// Stop sends sig, waits up to grace for the exit, then kills the process.
// It reports whether sig sufficed.
func (p *Process) Stop(sig os.Signal, grace time.Duration) bool {
	if !p.Running() {
		return true
	}
	p.Signal(sig)
	if p.Wait(grace) {
		return true
	}
	p.Kill()
	return false
}

// Log returns what the process wrote so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// LogTail returns the last n bytes of the log, as Tail does.
func (p *Process) LogTail(n int) string {
	f, err := os.Open(p.LogPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	// One byte more than n tells Tail that there was more before.
	if st, err := f.Stat(); err == nil && st.Size() > int64(n)+1 {
		_, _ = f.Seek(st.Size()-int64(n)-1, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return Tail(string(b), n)
}

// Tail returns the last n bytes of s, after "..." when it cut something.
func Tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times (100 on Linux).
const clockTicks = 100

// CPUTime returns the user + system CPU time of every thread of process
// pid, from /proc/<pid>/stat.
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: fields count from the
	// last ')'. utime and stime are fields 14 and 15.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// Status returns the kB fields of /proc/<pid>/status (VmRSS, RssAnon,
// VmHWM, ...) in bytes, and the other numeric fields (Threads, ...) as
// they are.
func Status(pid int) (map[string]int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, val, _ := strings.Cut(sc.Text(), ":")
		val = strings.TrimSpace(val)
		kb := strings.HasSuffix(val, " kB")
		if n, err := strconv.ParseInt(strings.TrimSuffix(val, " kB"), 10, 64); err == nil {
			if kb {
				n <<= 10
			}
			out[name] = n
		}
	}
	return out, sc.Err()
}

// OpenFiles returns how many file descriptors process pid has open.
func OpenFiles(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents), err
}
