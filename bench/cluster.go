package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/gobuild"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// The modes that run processes (scaleout, handover, partitions) share a
// procEnv: the binaries built once, a 3-node cluster of nats-server
// processes (natstest.Procs) and the stage's instances as processes of the
// real binary, each optionally in a CPU cgroup. Every process is killed
// and every cgroup removed on every way out (a failed phase, ctrl-C), and
// the kernel kills the children if the harness dies (Pdeathsig).

// procEnv is a cluster and the instances running on it.
type procEnv struct {
	f        *flags
	dir      string
	stageBin string
	cl       *natstest.Procs
	nc       *nats.Conn
	js       jetstream.JetStream
	capErr   error // why CPU caps cannot be applied; nil when they can

	mu    sync.Mutex
	insts []*instance // running
}

// instance is one dedupe-stage process.
type instance struct {
	name, cfgPath string
	addr          string // HTTP (metrics) address
	proc          *proctest.Process
	cgroup        string // its CPU cgroup; "" when none
}

// startProcEnv builds the binaries into dir/bin and starts the cluster in
// dir/cluster, with caps probed when capped.
func startProcEnv(ctx context.Context, f *flags, dir string, capped bool) (*procEnv, error) {
	e := &procEnv{f: f, dir: dir, stageBin: filepath.Join(dir, "bin", "dedupe-stage")}
	natsBin := filepath.Join(dir, "bin", "nats-server")
	fmt.Fprintf(logOut, "building dedupe-stage and nats-server into %s\n", filepath.Dir(natsBin))
	bctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	for _, b := range [][2]string{{e.stageBin, "github.com/dedupe-stage/dedupe-stage/cmd/dedupe-stage"}, {natsBin, "github.com/nats-io/nats-server/v2"}} {
		if err := gobuild.Binary(bctx, b[0], b[1]); err != nil {
			return nil, err
		}
	}
	if capped {
		if e.capErr = probeCgroup(); e.capErr != nil {
			fmt.Fprintf(logOut, "warning: CPU caps cannot be applied, every instance runs uncapped: %v\n", e.capErr)
		}
	}
	fmt.Fprintf(logOut, "starting 3 nats-server processes (sync_always=%v) in %s\n", f.syncAlways, filepath.Join(dir, "cluster"))
	var err error
	e.cl, err = natstest.StartProcs(ctx, natstest.ProcsSpec{Bin: natsBin, Dir: filepath.Join(dir, "cluster"), Nodes: 3, SyncAlways: f.syncAlways, KillWithParent: true, Monitor: true})
	if err != nil {
		return nil, err
	}
	if e.nc, err = nats.Connect(e.cl.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond)); err == nil {
		e.js, err = jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(4096))
	}
	if err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// describe names the cluster and the stage's settings for the results.
func (e *procEnv) describe() string {
	sync := "no fsync per message (sync_interval default)"
	if e.f.syncAlways {
		sync = "fsync per message (sync_interval: always)"
	}
	return fmt.Sprintf("3 nats-server processes (%s) on loopback, %s; R%d file streams; stage: state.sync_writes=%v, input.ack_wait %v",
		e.nc.ConnectedServerVersion(), sync, e.f.replicas, e.f.syncWrites, e.f.ackWait)
}

// close kills every instance, removes their cgroups and stops the
// cluster. It is safe to call more than once.
func (e *procEnv) close() {
	e.mu.Lock()
	insts := e.insts
	e.insts = nil
	e.mu.Unlock()
	for _, in := range insts {
		in.proc.Kill()
		removeCgroup(in.cgroup)
	}
	if e.nc != nil {
		e.nc.Close()
	}
	if e.cl != nil {
		e.cl.Stop(20 * time.Second)
	}
}

// configureGroup writes the configurations of the instances names of a
// group of mode into dir (instanceConfig, with edit), checks them and
// creates the group's streams; it returns the instances, not started, and
// the last one's configuration (they differ by name, data dir and address
// only).
func (e *procEnv) configureGroup(ctx context.Context, dir string, n streamNames, names []string, mode string, refresh bool, expectedKeys int, edit func(*config.Config)) ([]*instance, config.Config, error) {
	var cfg config.Config
	ports, err := proctest.Ports(len(names))
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return nil, cfg, err
	}
	insts := make([]*instance, len(names))
	for k, name := range names {
		in := &instance{name: name, cfgPath: filepath.Join(dir, name+".yaml"), addr: fmt.Sprintf("127.0.0.1:%d", ports[k])}
		cfg = e.instanceConfig(mode, refresh, n, name, filepath.Join(dir, name+"-data"), in.addr, expectedKeys, edit)
		y, err := yaml.Marshal(cfg)
		if err == nil {
			err = cfg.Validate()
		}
		if err == nil {
			err = os.WriteFile(in.cfgPath, y, 0o644)
		}
		if err != nil {
			return nil, cfg, fmt.Errorf("%s: %w", in.cfgPath, err)
		}
		insts[k] = in
	}
	return insts, cfg, e.createStreams(ctx, cfg)
}

// release stops insts and, unless --keep, deletes the group's streams and
// buckets (those of n under cfg).
func (e *procEnv) release(n streamNames, cfg config.Config, insts []*instance) {
	for _, in := range insts {
		e.stop(in)
	}
	if !e.f.keep && cfg.ScaleOut.Group != "" {
		deleteStreams(e.js, n.streams(cfg)...)
	}
}

// startAll starts insts, each in a CPU cgroup prefix+name capped at cores
// (> 0), and waits up to timeout until each is ready; it reports whether
// every cap was applied.
func (e *procEnv) startAll(ctx context.Context, insts []*instance, prefix string, cores float64, timeout time.Duration) (bool, error) {
	all := cores > 0
	for _, in := range insts {
		capped, err := e.start(ctx, in, prefix+in.name, cores)
		if err != nil {
			return false, err
		}
		all = all && capped
	}
	return all, waitReady(ctx, timeout, insts...)
}

// start starts in, its log next to its configuration, in a CPU cgroup
// named cgroup with cores > 0; it reports whether the cap was applied.
func (e *procEnv) start(ctx context.Context, in *instance, cgroup string, cores float64) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var env []string
	if e.f.stageEnv != "" {
		env = strings.Split(e.f.stageEnv, ",")
	}
	p, err := proctest.Start(proctest.Spec{Name: "dedupe-stage " + in.name, Bin: e.stageBin, Args: []string{"run", "--config", in.cfgPath},
		Env: env, LogPath: strings.TrimSuffix(in.cfgPath, ".yaml") + ".log", KillWithParent: true})
	if err != nil {
		return false, err
	}
	in.proc = p
	e.mu.Lock()
	e.insts = append(e.insts, in)
	e.mu.Unlock()
	if cores <= 0 || e.capErr != nil {
		return false, nil
	}
	if in.cgroup, err = newCgroup(fmt.Sprintf("dedupe-bench-%d-%s", os.Getpid(), cgroup), cores, p.Pid()); err != nil {
		fmt.Fprintf(logOut, "warning: %s runs uncapped: %v\n", in.name, err)
		return false, nil
	}
	return true, nil
}

// stop stops in (SIGTERM, SIGKILL after 30s) and removes its cgroup. It
// reports whether SIGTERM sufficed.
func (e *procEnv) stop(in *instance) bool {
	if in == nil || in.proc == nil {
		return true
	}
	clean := in.proc.Stop(syscall.SIGTERM, 30*time.Second)
	removeCgroup(in.cgroup)
	e.mu.Lock()
	e.insts = slices.DeleteFunc(e.insts, func(r *instance) bool { return r == in })
	e.mu.Unlock()
	in.proc = nil
	return clean
}

// waitReady waits until every instance's /readyz answers 200.
func waitReady(ctx context.Context, timeout time.Duration, insts ...*instance) error {
	for _, in := range insts {
		if err := waitUntil(ctx, timeout, 100*time.Millisecond, in.name+" ready", []*instance{in}, func() (bool, string) {
			err := ready(ctx, in)
			return err == nil, fmt.Sprint(err)
		}); err != nil {
			if in.proc.Running() && ctx.Err() == nil {
				err = fmt.Errorf("%w; log %s:\n%s", err, in.proc.LogPath, in.proc.LogTail(3000))
			}
			return err
		}
	}
	return nil
}

// ready asks in's /readyz.
func ready(ctx context.Context, in *instance) error {
	return get(ctx, "http://"+in.addr+"/readyz", nil)
}

// get reads url within 5 seconds and hands its body to read (nil: none);
// an answer other than 200 is an error.
func get(ctx context.Context, url string, read func(io.Reader) error) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode != http.StatusOK:
		return errors.New(resp.Status)
	case read != nil:
		return read(io.LimitReader(resp.Body, 1<<20))
	}
	return nil
}

// createStreams creates the streams of cfg as the stage would
// (stage.StreamsToCreate) with --replicas each.
func (e *procEnv) createStreams(ctx context.Context, cfg config.Config) error {
	streams, err := stage.StreamsToCreate(cfg)
	if err != nil {
		return err
	}
	for _, s := range streams {
		sc := s.Config
		sc.Replicas = e.f.replicas
		if err := waitUntil(ctx, time.Minute, 200*time.Millisecond, fmt.Sprintf("create stream %s (%s)", sc.Name, s.Field), nil, func() (bool, string) {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err := e.js.CreateStream(rctx, sc)
			return err == nil || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse), fmt.Sprint(err)
		}); err != nil {
			return err
		}
	}
	return nil
}

// consumerRef names a consumer of a group (or the stage's, with scale_out
// off).
type consumerRef struct{ stream, name string }

// consumersOf lists the consumers of streams.
func (e *procEnv) consumersOf(ctx context.Context, streams ...string) ([]consumerRef, error) {
	var cons []consumerRef
	for _, s := range streams {
		st, err := e.js.Stream(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", s, err)
		}
		names := st.ConsumerNames(ctx)
		for name := range names.Name() {
			cons = append(cons, consumerRef{stream: s, name: name})
		}
		if err := names.Err(); err != nil {
			return nil, err
		}
	}
	return cons, nil
}

// infos returns the info of each consumer of cons.
func (e *procEnv) infos(ctx context.Context, cons []consumerRef) ([]*jetstream.ConsumerInfo, error) {
	out := make([]*jetstream.ConsumerInfo, len(cons))
	for i, c := range cons {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ci, err := e.js.Consumer(rctx, c.stream, c.name)
		if err == nil {
			out[i], err = ci.Info(rctx)
		}
		cancel()
		if err != nil {
			return nil, fmt.Errorf("consumer %s: %w", c.name, err)
		}
	}
	return out, nil
}

// waitDrained polls the consumers of cons until none has messages pending
// or unacknowledged, calling onPoll after each poll; it fails after
// timeout or when an instance of insts exits.
func (e *procEnv) waitDrained(ctx context.Context, cons []consumerRef, insts []*instance, timeout time.Duration, onPoll func()) error {
	return waitUntil(ctx, timeout, 20*time.Millisecond, "the group acknowledging everything", insts, func() (bool, string) {
		if onPoll != nil {
			onPoll()
		}
		infos, err := e.infos(ctx, cons)
		if err != nil {
			return false, err.Error()
		}
		for i, ci := range infos {
			if ci.NumPending > 0 || ci.NumAckPending > 0 {
				return false, fmt.Sprintf("%s: %d pending, %d unacknowledged", cons[i].name, ci.NumPending, ci.NumAckPending)
			}
		}
		return true, ""
	})
}

// owned returns the partitions each instance owns (-1: no answer).
func owned(ctx context.Context, insts []*instance) []int {
	out := make([]int, len(insts))
	for i, in := range insts {
		out[i] = -1
		if fs, err := metrictest.Scrape(ctx, in.addr); err == nil {
			out[i] = int(fs.Sum("dedupe_partitions_owned", nil))
		}
	}
	return out
}

// The cgroup v1 cpu controller caps an instance's CPU: cpu.cfs_quota_us
// = cores x cpu.cfs_period_us.
const (
	cgroupRoot   = "/sys/fs/cgroup/cpu"
	cgroupPeriod = 100_000 // µs
)

// probeCgroup checks that the cpu controller takes a new group with a
// quota.
func probeCgroup() error {
	dir, err := newCgroup(fmt.Sprintf("dedupe-bench-%d-probe", os.Getpid()), 1, 0)
	if err == nil {
		err = os.Remove(dir)
	}
	return err
}

// newCgroup creates cgroup name capped at cores CPUs and moves process pid
// into it (none when 0).
func newCgroup(name string, cores float64, pid int) (string, error) {
	dir := filepath.Join(cgroupRoot, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("cgroup v1 cpu controller: %w", err)
	}
	writes := [][2]string{{"cpu.cfs_period_us", strconv.Itoa(cgroupPeriod)}, {"cpu.cfs_quota_us", strconv.Itoa(int(cores * cgroupPeriod))}}
	if pid > 0 {
		writes = append(writes, [2]string{"cgroup.procs", strconv.Itoa(pid)})
	}
	for _, w := range writes {
		if err := os.WriteFile(filepath.Join(dir, w[0]), []byte(w[1]), 0); err != nil {
			_ = os.Remove(dir)
			return "", fmt.Errorf("cgroup %s: write %s: %w", dir, w[0], err)
		}
	}
	return dir, nil
}

// removeCgroup removes a cgroup whose processes have exited; the kernel
// can take a moment to empty it, so it tries for up to a second.
func removeCgroup(dir string) {
	if dir == "" {
		return
	}
	var err error
	if !natstest.Until(time.Second, 50*time.Millisecond, func() bool {
		err = os.Remove(dir)
		return err == nil || errors.Is(err, os.ErrNotExist)
	}) {
		fmt.Fprintf(logOut, "warning: remove cgroup %s: %v\n", dir, err)
	}
}

// cpuTimes are the CPU times of instances and of the servers at one
// moment (0 where one cannot be read).
type cpuTimes struct{ stage, server []time.Duration }

// cpuNow reads the CPU time of each of insts and of each server.
func (e *procEnv) cpuNow(insts []*instance) cpuTimes {
	var c cpuTimes
	for _, in := range insts {
		d, _ := proctest.CPUTime(in.proc.Pid())
		c.stage = append(c.stage, d)
	}
	for _, pid := range e.cl.Pids() {
		d, _ := proctest.CPUTime(pid)
		c.server = append(c.server, d)
	}
	return c
}

// since returns the CPU seconds each instance of insts used since c, their
// sum, and those of the servers, summed.
func (c cpuTimes) since(e *procEnv, insts []*instance) (stage []float64, stageSum, server float64) {
	now := e.cpuNow(insts)
	stage = make([]float64, len(now.stage))
	for i := range now.stage {
		stage[i] = (now.stage[i] - c.stage[i]).Seconds()
		stageSum += stage[i]
	}
	for i := range min(len(now.server), len(c.server)) {
		server += (now.server[i] - c.server[i]).Seconds()
	}
	return stage, stageSum, server
}

// memPeaks is what watchMem saw, in bytes.
type memPeaks struct {
	AnonFirst, AnonMax, HeapMax, PeakRSS int64
}

// watchMem samples process pid's anonymous RSS (/proc/PID/status RssAnon)
// and its Go heap in use (its /metrics at addr,
// go_memstats_heap_inuse_bytes) every interval, keeping the first and the
// largest; a peak shorter than the interval can be missed, which the
// process's VmHWM (file-backed pages included) never misses. The func it
// returns stops the sampling and returns what it saw, with that VmHWM.
func watchMem(ctx context.Context, pid int, addr string, interval time.Duration) func() memPeaks {
	ctx, cancel := context.WithCancel(ctx)
	var m memPeaks
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := 0; ctx.Err() == nil; n++ {
			if st, err := proctest.Status(pid); err == nil {
				if n == 0 {
					m.AnonFirst = st["RssAnon"]
				}
				m.AnonMax = max(m.AnonMax, st["RssAnon"])
			}
			if fs, err := metrictest.Scrape(ctx, addr); err == nil {
				m.HeapMax = max(m.HeapMax, int64(fs.Sum("go_memstats_heap_inuse_bytes", nil)))
			}
			select {
			case <-ctx.Done():
			case <-time.After(interval):
			}
		}
	}()
	return func() memPeaks {
		cancel()
		<-done
		st, _ := proctest.Status(pid)
		m.PeakRSS = st["VmHWM"]
		return m
	}
}
