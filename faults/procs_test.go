package faults

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/gobuild"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// The binaries under test, built once by TestMain.
var (
	stageBin string // cmd/dedupe-stage, or $DEDUPE_FAULTS_STAGE_BIN
	natsBin  string // github.com/nats-io/nats-server/v2
	binDir   string // where TestMain builds them
)

// stageBinEnv names a dedupe-stage binary the tests run instead of
// building cmd/dedupe-stage from this tree: an older build, to show that a
// test fails on it. Its configuration keys must be the ones the tests
// write.
const stageBinEnv = "DEDUPE_FAULTS_STAGE_BIN"

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
	binDir = dir
	stageBin = filepath.Join(dir, "dedupe-stage")
	natsBin = filepath.Join(dir, "nats-server")
	builds := []struct{ out, pkg string }{
		{stageBin, "github.com/dedupe-stage/dedupe-stage/cmd/dedupe-stage"},
		{natsBin, "github.com/nats-io/nats-server/v2"},
	}
	if bin := os.Getenv(stageBinEnv); bin != "" {
		// Another build under test (an older one, to show a test fails
		// there): run it instead of building this tree's.
		abs, err := filepath.Abs(bin)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		stageBin, builds = abs, builds[1:]
		fmt.Fprintf(os.Stderr, "faults: %s=%s: the tests run that binary\n", stageBinEnv, abs)
	}
	for _, b := range builds {
		if err := gobuild.Binary(context.Background(), b.out, b.pkg); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// process is a child process of a test, its output in a log file.
type process struct{ *proctest.Process }

func startProcess(tb testing.TB, name, logPath, bin string, args ...string) *process {
	tb.Helper()
	p, err := proctest.Start(proctest.Spec{Name: name, Bin: bin, Args: args, LogPath: logPath})
	if err != nil {
		tb.Fatal(err)
	}
	return &process{p}
}

// signal sends sig and waits up to timeout for the process to exit; it
// kills the process and fails the test when it does not.
func (p *process) signal(tb testing.TB, sig syscall.Signal, timeout time.Duration) {
	tb.Helper()
	if !p.Stop(sig, timeout) {
		tb.Fatalf("%s still running %v after %v; killed", p.Name, timeout, sig)
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
		return strings.Contains(p.Log(), substr) || !p.Running()
	})
	return strings.Contains(p.Log(), substr)
}

// crashReport is the part of a log that says why a Go process died (the
// fatal error or panic and the first goroutine's stack), or the log's tail.
func crashReport(log string) string {
	for _, mark := range []string{"fatal error:", "panic:", "unexpected fault address"} {
		if i := strings.Index(log, mark); i >= 0 {
			return proctest.Tail(log[:i], 1000) + log[i:min(len(log), i+3000)]
		}
	}
	return proctest.Tail(log, 3000)
}

// natsServer is a nats-server process with JetStream, restartable on the
// same port and store directory.
type natsServer struct {
	tb       testing.TB
	port     int
	storeDir string
	conf     string
	proc     *process
	starts   int
}

// startNATS starts a nats-server on a free loopback port that syncs every
// write before it acknowledges it (sync_interval: always), so that a SIGKILL
// of the server loses nothing it acknowledged; it is stopped when the test
// ends.
func startNATS(tb testing.TB) *natsServer {
	tb.Helper()
	return startNATSWith(tb, true)
}

// startNATSUnsynced is startNATS with nats-server's default sync interval,
// for a test that never kills the server: a server that lives to the end
// loses no write it did not sync, and a sync per write (a millisecond or
// more on a CI disk) was most of such a test's time.
func startNATSUnsynced(tb testing.TB) *natsServer {
	tb.Helper()
	return startNATSWith(tb, false)
}

func startNATSWith(tb testing.TB, syncAlways bool) *natsServer {
	tb.Helper()
	dir := tb.TempDir()
	n := &natsServer{tb: tb, port: proctest.Port(tb), storeDir: filepath.Join(dir, "js"), conf: filepath.Join(dir, "nats.conf")}
	sync := ""
	if syncAlways {
		sync = "  sync_interval: always\n"
	}
	conf := fmt.Sprintf("listen: 127.0.0.1:%d\njetstream {\n  store_dir: %q\n%s}\n", n.port, n.storeDir, sync)
	if err := os.WriteFile(n.conf, []byte(conf), 0o644); err != nil {
		tb.Fatal(err)
	}
	n.start()
	tb.Cleanup(func() {
		if n.proc.Running() {
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
		if !n.proc.Running() {
			n.tb.Fatalf("nats-server exited: %v\n%s", n.proc.Err(), proctest.Tail(n.proc.Log(), 3000))
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
	Publish          string        // output.publish; "" keeps the default (auto)
	KeyVersion       string        // key.version's header (version-wins); "" leaves it off
	PingInterval     time.Duration // nats.ping_interval; 0 keeps the default
	OnDamage         string        // state.on_damage; "" keeps the default (refuse)
	Extra            string        // YAML appended as is: sections the fields above do not cover
}

// defaultStageConfig is the configuration the fault tests start from: a 1s
// AckWait so that what a killed stage held comes back quickly, a 30s output
// duplicate window (covering AckWait plus a 20s restart margin), so that
// late copies published after it are caught by the stage's own store only.
func defaultStageConfig(tb testing.TB, natsURL string) stageConfig {
	return stageConfig{
		NATSURL:          natsURL,
		DataDir:          tb.TempDir(),
		HTTPAddr:         fmt.Sprintf("127.0.0.1:%d", proctest.Port(tb)),
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
	version := ""
	if c.KeyVersion != "" {
		version = fmt.Sprintf("  version: {source: header, header: %s}\n", c.KeyVersion)
	}
	onDamage := ""
	if c.OnDamage != "" {
		onDamage = fmt.Sprintf("  on_damage: %s\n", c.OnDamage)
	}
	ping := ""
	if c.PingInterval > 0 {
		ping = fmt.Sprintf("  ping_interval: %s\n", c.PingInterval)
	}
	return fmt.Sprintf(`nats:
  url: %s
  create_streams: true
%skey:
  source: header
  header: Event-Id
%sinput:
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
%sfilter:
  expected_keys: %d
pipeline:
  batch_size: %d
  max_message_bytes: %d
http:
  addr: %s
log:
  format: json
%s`, c.NATSURL, ping, version, c.AckWait, c.DuplicateWindow, c.RestartMargin, c.Publish, c.DataDir, c.Partitions, c.MemoryBudget,
		c.SnapshotInterval, onDamage, c.ExpectedKeys, c.BatchSize, c.MaxMessageBytes, c.HTTPAddr, c.Extra)
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
			p.Kill()
			if tb.Failed() {
				tb.Logf("log of stage run %d:\n%s", len(s.runs), crashReport(p.Log()))
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
		if err := os.WriteFile(dst, []byte(p.Log()), 0o644); err != nil {
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
	if p := s.last(); p != nil && p.Running() {
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
		if !p.Running() {
			s.tb.Fatalf("stage exited before it was ready: %v\n%s", p.Err(), crashReport(p.Log()))
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
