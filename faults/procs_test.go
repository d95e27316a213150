package faults

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/gobuild"
	"github.com/dedupe-stage/dedupe-stage/internal/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/natstest"
)

// The binaries under test, built once by TestMain.
var (
	stageBin string // cmd/dedupe-stage
	natsBin  string // github.com/nats-io/nats-server/v2
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(preloadMain())
	}
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "dedupe-faults-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	stageBin = filepath.Join(dir, "dedupe-stage")
	natsBin = filepath.Join(dir, "nats-server")
	for _, b := range []struct{ out, pkg string }{
		{stageBin, "github.com/dedupe-stage/dedupe-stage/cmd/dedupe-stage"},
		{natsBin, "github.com/nats-io/nats-server/v2"},
	} {
		if err := gobuild.Binary(context.Background(), b.out, b.pkg); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// portsGiven are the ports freePort handed out, guarded by portsMu.
var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// freePort returns a loopback port free at the time of the call, for a
// process started later. It picks from below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range, 32768-60999 by default): a port the
// kernel hands out (port 0, an in-process server's -1, any client socket)
// could otherwise be taken between this call and the process's bind, as
// a nats-server of a cluster test once failed with "address already in
// use" beside the other test lane. Ports are drawn at random from 20000 up
// and each is checked by a listen; none is handed out twice in one test
// binary.
func freePort(tb testing.TB) int {
	tb.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
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
		return port
	}
	tb.Fatal("no free loopback port between 20000 and 32000 in 200 tries")
	return 0
}

// process is a child process whose output goes to a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	exited  chan struct{} // closed once the process has exited
	err     error         // its exit status, valid once exited is closed
	logPath string
	started time.Time
}

func startProcess(tb testing.TB, name, logPath, bin string, args ...string) *process {
	tb.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		tb.Fatalf("start %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, exited: make(chan struct{}), logPath: logPath, started: time.Now()}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	return p
}

// running reports whether the process has not exited.
func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// signal sends sig and waits up to timeout for the process to exit.
func (p *process) signal(tb testing.TB, sig syscall.Signal, timeout time.Duration) {
	tb.Helper()
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		tb.Fatalf("%s still running %v after %v; killed", p.name, timeout, sig)
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *process) kill(tb testing.TB) {
	tb.Helper()
	p.signal(tb, syscall.SIGKILL, 10*time.Second)
}

// waitLog waits until the process's log contains substr and reports
// whether it did; false when the process exited or timeout passed first.
func (p *process) waitLog(substr string, timeout time.Duration) bool {
	natstest.Until(timeout, 2*time.Millisecond, func() bool {
		return strings.Contains(p.log(), substr) || !p.running()
	})
	return strings.Contains(p.log(), substr)
}

// log returns what the process wrote so far.
func (p *process) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// crashReport is the part of a log that says why a Go process died (the
// fatal error or panic and the first goroutine's stack), or the log's tail.
func crashReport(log string) string {
	for _, mark := range []string{"fatal error:", "panic:", "unexpected fault address"} {
		if i := strings.Index(log, mark); i >= 0 {
			return tail(log[:i], 1000) + log[i:min(len(log), i+3000)]
		}
	}
	return tail(log, 3000)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// natsServer is a nats-server process with JetStream, restartable on the
// same port and store directory. Every write is synced before it is
// acknowledged (sync_interval: always), so a SIGKILL of the server loses
// nothing it acknowledged.
type natsServer struct {
	tb       testing.TB
	port     int
	storeDir string
	conf     string
	proc     *process
	starts   int
}

// startNATS starts a nats-server on a free loopback port; it is stopped when
// the test ends.
func startNATS(tb testing.TB) *natsServer {
	tb.Helper()
	dir := tb.TempDir()
	n := &natsServer{tb: tb, port: freePort(tb), storeDir: filepath.Join(dir, "js"), conf: filepath.Join(dir, "nats.conf")}
	conf := fmt.Sprintf("listen: 127.0.0.1:%d\njetstream {\n  store_dir: %q\n  sync_interval: always\n}\n", n.port, n.storeDir)
	if err := os.WriteFile(n.conf, []byte(conf), 0o644); err != nil {
		tb.Fatal(err)
	}
	n.start()
	tb.Cleanup(func() {
		if n.proc.running() {
			n.proc.signal(tb, syscall.SIGTERM, 20*time.Second)
		}
	})
	return n
}

// URL is the server's client URL.
func (n *natsServer) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// start runs the server and waits until it accepts clients and JetStream
// answers.
func (n *natsServer) start() {
	n.tb.Helper()
	n.launch()
	n.waitUp()
}

// launch runs the server without waiting for it.
func (n *natsServer) launch() {
	n.tb.Helper()
	n.starts++
	n.proc = startProcess(n.tb, "nats-server", filepath.Join(filepath.Dir(n.conf), fmt.Sprintf("nats-%d.log", n.starts)), natsBin, "-c", n.conf)
}

// waitUp waits until the launched server accepts clients and JetStream
// answers.
func (n *natsServer) waitUp() {
	n.tb.Helper()
	natstest.WaitFor(n.tb, 30*time.Second, "nats-server to accept clients", func() bool {
		if !n.proc.running() {
			n.tb.Fatalf("nats-server exited: %v\n%s", n.proc.err, tail(n.proc.log(), 3000))
		}
		nc, err := nats.Connect(n.URL(), nats.Timeout(time.Second))
		if err != nil {
			return false
		}
		defer nc.Close()
		_, err = nc.Request("$JS.API.INFO", nil, 2*time.Second)
		return err == nil
	})
}

// stop stops the server with sig (SIGTERM: a clean shutdown; SIGKILL) and
// waits for it to exit.
func (n *natsServer) stop(sig syscall.Signal) {
	n.tb.Helper()
	n.proc.signal(n.tb, sig, 30*time.Second)
}

// stageConfig is what a test varies in the stage's YAML configuration. Keys
// come from the Event-Id header (the input stream dedupes Nats-Msg-Id
// itself, and the tests use that to make their own publishes idempotent).
type stageConfig struct {
	NATSURL          string
	DataDir          string
	HTTPAddr         string
	Partitions       int
	AckWait          time.Duration
	DuplicateWindow  time.Duration // of the output stream, when the stage creates it
	RestartMargin    time.Duration
	SnapshotInterval time.Duration
	ExpectedKeys     int
	MemoryBudget     string
	MaxMessageBytes  int
	BatchSize        int
	Publish          string // output.publish; "" keeps the default (auto)
	Extra            string // YAML appended as is: sections the fields above do not cover
}

// defaultStageConfig is the configuration the fault tests start from: a 1s
// AckWait so that what a killed stage held comes back quickly, a 30s output
// duplicate window (covering AckWait plus a 20s restart margin), so that
// late copies published after it are caught by the stage's own store only.
func defaultStageConfig(tb testing.TB, natsURL string) stageConfig {
	return stageConfig{
		NATSURL:          natsURL,
		DataDir:          tb.TempDir(),
		HTTPAddr:         fmt.Sprintf("127.0.0.1:%d", freePort(tb)),
		Partitions:       4,
		AckWait:          time.Second,
		DuplicateWindow:  30 * time.Second,
		RestartMargin:    20 * time.Second,
		SnapshotInterval: time.Minute,
		ExpectedKeys:     200_000,
		MemoryBudget:     "32MiB",
		MaxMessageBytes:  4096,
		BatchSize:        256,
	}
}

func (c stageConfig) yaml() string {
	return fmt.Sprintf(`nats:
  url: %s
  create_streams: true
key:
  source: header
  header: Event-Id
input:
  ack_wait: %s
output:
  duplicate_window: %s
  restart_margin: %s
  publish: %s
state:
  data_dir: %s
  partitions: %d
  memory_budget: %s
  snapshot_interval: %s
filter:
  expected_keys: %d
pipeline:
  batch_size: %d
  max_message_bytes: %d
http:
  addr: %s
log:
  format: json
%s`, c.NATSURL, c.AckWait, c.DuplicateWindow, c.RestartMargin, c.Publish, c.DataDir, c.Partitions, c.MemoryBudget,
		c.SnapshotInterval, c.ExpectedKeys, c.BatchSize, c.MaxMessageBytes, c.HTTPAddr, c.Extra)
}

// stage runs the dedupe-stage binary, run after run, on one configuration
// and data directory.
type stage struct {
	tb      testing.TB
	cfg     stageConfig
	cfgPath string
	logDir  string
	runs    []*process
}

// newStage writes cfg and returns a stage that is not started. When the test
// ends, a running stage is killed, and on failure the tail of its last log
// is printed.
func newStage(tb testing.TB, cfg stageConfig) *stage {
	tb.Helper()
	dir := tb.TempDir()
	s := &stage{tb: tb, cfg: cfg, cfgPath: filepath.Join(dir, "stage.yaml"), logDir: dir}
	if err := os.WriteFile(s.cfgPath, []byte(cfg.yaml()), 0o644); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if p := s.last(); p != nil {
			if p.running() {
				_ = p.cmd.Process.Kill()
				<-p.exited
			}
			if tb.Failed() {
				tb.Logf("log of stage run %d:\n%s", len(s.runs), crashReport(p.log()))
				s.keepLogs()
			}
		}
	})
	return s
}

// keepLogs copies the log of every run into $DEDUPE_FAULTS_LOG_DIR, when
// set, as <test>-<config file's dir>-run<N>.log: a failure's whole story,
// where the test's output holds only the last run's tail.
func (s *stage) keepLogs() {
	dir := os.Getenv("DEDUPE_FAULTS_LOG_DIR")
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.tb.Logf("keep logs: %v", err)
		return
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(s.tb.Name()) + "-" + filepath.Base(s.logDir)
	for i, p := range s.runs {
		dst := filepath.Join(dir, fmt.Sprintf("%s-run%d.log", name, i+1))
		if err := os.WriteFile(dst, []byte(p.log()), 0o644); err != nil {
			s.tb.Logf("keep logs: %v", err)
			continue
		}
		s.tb.Logf("log of stage run %d kept in %s", i+1, dst)
	}
}

// last returns the latest run, or nil.
func (s *stage) last() *process {
	if len(s.runs) == 0 {
		return nil
	}
	return s.runs[len(s.runs)-1]
}

// start runs the stage without waiting for it to be ready.
func (s *stage) start() *process {
	s.tb.Helper()
	if p := s.last(); p != nil && p.running() {
		s.tb.Fatal("stage started while the previous run is still running")
	}
	p := startProcess(s.tb, "dedupe-stage", filepath.Join(s.logDir, fmt.Sprintf("stage-%d.log", len(s.runs)+1)),
		stageBin, "run", "--config", s.cfgPath)
	s.runs = append(s.runs, p)
	return p
}

// startReady starts the stage and waits until /readyz answers 200.
func (s *stage) startReady() *process {
	s.tb.Helper()
	p := s.start()
	s.waitReady(p, 60*time.Second)
	return p
}

// waitReady waits until /readyz answers 200; it fails if p exits first.
func (s *stage) waitReady(p *process, timeout time.Duration) {
	s.tb.Helper()
	natstest.WaitFor(s.tb, timeout, "the stage to be ready", func() bool {
		if !p.running() {
			s.tb.Fatalf("stage exited before it was ready: %v\n%s", p.err, crashReport(p.log()))
		}
		code, _ := s.get("/readyz")
		return code == http.StatusOK
	})
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// get fetches path from the stage's HTTP server; code 0 means no answer.
func (s *stage) get(path string) (code int, body string) {
	resp, err := httpClient.Get("http://" + s.cfg.HTTPAddr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// metric sums the samples of the metric name whose labels include every
// pair of labels, given as name, value, name, value... It fails the test
// when /metrics does not answer.
func (s *stage) metric(name string, labels ...string) float64 {
	s.tb.Helper()
	code, body := s.get("/metrics")
	if code != http.StatusOK {
		s.tb.Fatalf("/metrics: %d %s", code, body)
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	return metrictest.Text(s.tb, body, name, want)
}
