package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/gobuild"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// The scale-out mode runs the real binaries as child processes: three
// nats-server nodes and 1..N dedupe-stage instances. Every child is
// tracked by a children set, which kills what still runs and removes the
// CPU cgroups it created on every exit path (a failed phase, ctrl-C, a
// panic unwinding through runScaleOut), and each child gets SIGKILL from
// the kernel if the harness dies without cleaning up (Pdeathsig).

// child is a process whose output goes to a log file.
type child struct {
	*proctest.Process
	cgroup string // the CPU cgroup it was put in; "" when none
}

// children is every child the harness started; it is safe for concurrent
// use.
type children struct {
	mu    sync.Mutex
	procs []*child
}

// start runs bin with args, its output appended to logPath.
func (cs *children) start(name, logPath, bin string, args ...string) (*child, error) {
	return cs.startEnv(name, logPath, nil, bin, args...)
}

// startEnv is start with env added to the harness's environment.
func (cs *children) startEnv(name, logPath string, env []string, bin string, args ...string) (*child, error) {
	p, err := proctest.Start(proctest.Spec{Name: name, Bin: bin, Args: args, Env: env, LogPath: logPath, KillWithParent: true})
	if err != nil {
		return nil, err
	}
	c := &child{Process: p}
	cs.mu.Lock()
	cs.procs = append(cs.procs, c)
	cs.mu.Unlock()
	return c, nil
}

// release stops c (SIGTERM, then SIGKILL after grace), removes its cgroup
// and forgets it. It returns whether SIGTERM sufficed.
func (cs *children) release(c *child, grace time.Duration) bool {
	clean := c.Stop(syscall.SIGTERM, grace)
	removeCgroup(c.cgroup)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for i, p := range cs.procs {
		if p == c {
			cs.procs = append(cs.procs[:i], cs.procs[i+1:]...)
			break
		}
	}
	return clean
}

// closeAll kills every child still running and removes their cgroups. It
// is safe to call more than once.
func (cs *children) closeAll() {
	cs.mu.Lock()
	procs := cs.procs
	cs.procs = nil
	cs.mu.Unlock()
	for _, c := range procs {
		c.Kill()
		removeCgroup(c.cgroup)
	}
}

// cgroupRoot is the cgroup v1 cpu controller's mount.
const cgroupRoot = "/sys/fs/cgroup/cpu"

// cgroupPeriod is the CFS period the caps are expressed in (100 ms).
const cgroupPeriod = 100_000

// capCPU puts c in a new cgroup of the cpu controller, name, limited to
// cores CPUs (cpu.cfs_quota_us = cores x cpu.cfs_period_us). An error
// says why not (typically: the controller is not mounted or not
// writable); the process then runs uncapped.
func capCPU(c *child, name string, cores float64) error {
	dir := filepath.Join(cgroupRoot, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("cgroup %s: %w", dir, err)
	}
	write := func(file, v string) error {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0); err != nil {
			return fmt.Errorf("cgroup %s: write %s: %w", dir, file, err)
		}
		return nil
	}
	err := write("cpu.cfs_period_us", strconv.Itoa(cgroupPeriod))
	if err == nil {
		err = write("cpu.cfs_quota_us", strconv.Itoa(int(cores*cgroupPeriod)))
	}
	if err == nil {
		err = write("cgroup.procs", strconv.Itoa(c.Pid()))
	}
	if err != nil {
		_ = os.Remove(dir)
		return err
	}
	c.cgroup = dir
	return nil
}

// removeCgroup removes a cgroup whose processes have exited. The kernel
// can take a moment to empty it, so it tries for up to a second.
func removeCgroup(dir string) {
	if dir == "" {
		return
	}
	var err error
	for range 20 {
		if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Fprintf(logOut, "warning: remove cgroup %s: %v\n", dir, err)
}

// procCPU returns the user + system CPU time of process pid from
// /proc/<pid>/stat (every thread of the process).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: fields count from the
	// last ')'. utime and stime are fields 14 and 15.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// buildBinary builds package pkg of this module into out.
func buildBinary(ctx context.Context, out, pkg string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	return gobuild.Binary(ctx, out, pkg)
}

// natsCluster is a cluster of nats-server processes on loopback, each with
// JetStream in its own store directory.
type natsCluster struct {
	nodes   []*child
	clients []int
}

// urls returns the nodes' client URLs, comma-separated, as nats.url takes
// them.
func (nc *natsCluster) urls() string {
	u := make([]string, len(nc.clients))
	for i, p := range nc.clients {
		u[i] = fmt.Sprintf("nats://127.0.0.1:%d", p)
	}
	return strings.Join(u, ",")
}

// startCluster starts n nats-server processes (bin) forming one cluster,
// storing in dir/n<i>, and waits until every node answers JetStream
// requests. With syncAlways every stored message is fsynced before it is
// acknowledged (jetstream.sync_interval: always); otherwise the server's
// default (a sync every 2 minutes).
func startCluster(ctx context.Context, cs *children, bin, dir string, n int, syncAlways bool) (*natsCluster, error) {
	ports, err := proctest.Ports(2 * n)
	if err != nil {
		return nil, err
	}
	nc := &natsCluster{clients: ports[:n]}
	routes := ports[n:]
	for i := range n {
		var rs []string
		for j, p := range routes {
			if j != i {
				rs = append(rs, fmt.Sprintf("nats://127.0.0.1:%d", p))
			}
		}
		sync := ""
		if syncAlways {
			sync = "  sync_interval: always\n"
		}
		conf := fmt.Sprintf("server_name: n%d\nlisten: 127.0.0.1:%d\njetstream {\n  store_dir: %q\n%s}\ncluster {\n  name: dedupe-bench\n  listen: 127.0.0.1:%d\n  routes: [%s]\n}\n",
			i, ports[i], filepath.Join(dir, fmt.Sprintf("n%d", i)), sync, routes[i], strings.Join(rs, ", "))
		path := filepath.Join(dir, fmt.Sprintf("n%d.conf", i))
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		c, err := cs.start(fmt.Sprintf("nats-server n%d", i), filepath.Join(dir, fmt.Sprintf("n%d.log", i)), bin, "-c", path)
		if err != nil {
			return nil, err
		}
		nc.nodes = append(nc.nodes, c)
	}
	deadline := time.Now().Add(60 * time.Second)
	for i, p := range nc.clients {
		for {
			if !nc.nodes[i].Running() {
				return nil, fmt.Errorf("nats-server n%d exited: %v\n%s", i, nc.nodes[i].Err(), nc.nodes[i].LogTail(2000))
			}
			if jsAnswers(fmt.Sprintf("nats://127.0.0.1:%d", p)) == nil {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("nats-server n%d: JetStream not ready within 60s", i)
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nc, nil
}

// jsAnswers asks the node at url for the account's JetStream info, which
// needs a meta leader.
func jsAnswers(url string) error {
	c, err := nats.Connect(url, nats.MaxReconnects(0), nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer c.Close()
	m, err := c.Request("$JS.API.INFO", nil, 2*time.Second)
	if err != nil {
		return err
	}
	if strings.Contains(string(m.Data), `"error"`) {
		return fmt.Errorf("$JS.API.INFO: %s", m.Data)
	}
	return nil
}
