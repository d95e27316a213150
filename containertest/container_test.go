package containertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// stageConfigFormat is the stage's config in the container, for
// stageConfig. The key is the Event-Id header, not Nats-Msg-Id: the input
// stream would drop copies with a repeated Nats-Msg-Id itself, and the test
// must show that the stage does the work.
const stageConfigFormat = `# containertest: the stage against the nats container
key:
  source: header
  header: Event-Id
input:
  stream: EVENTS
  subjects: ["events.>"]
  consumer: dedupe-stage
%soutput:
  stream: EVENTS_DEDUPED
  subject_prefix: deduped
state:
  partitions: %d
  memory_budget: 64MiB
filter:
  expected_keys: 100000
log:
  format: json
%s`

// stageConfig returns the stage's config in the container: inputExtra is
// YAML lines added to the input section (each indented and ending in a
// newline), sections whole sections appended.
func stageConfig(inputExtra, sections string) string {
	return fmt.Sprintf(stageConfigFormat, inputExtra, partitions, sections)
}

// scaleOutSection turns scale-out on, with streams of three replicas (one
// per node of the cluster). Each container names its instance with
// DEDUPE_INSTANCE.
const scaleOutSection = `scale_out:
  enabled: true
  replicas: 3
`

// scaleOutAckWait is input.ack_wait with scale-out: the shortest it accepts
// (config.MinScaleOutAckWait). It is the pin's TTL and the presence
// bucket's refresh, so balance moves partitions within a few seconds.
const scaleOutAckWait = "  ack_wait: 2s\n"

const (
	inputStream  = "EVENTS"
	outputStream = "EVENTS_DEDUPED"
	consumerName = "dedupe-stage"
	subject      = "events.orders"
	copies       = 3
	// partitions is state.partitions of every stage in the tests.
	partitions = 4
	// The names a scale-out group uses by default (scale_out.group
	// "dedupe"): the route step's consumer on the input, the routed stream
	// and its members' consumers dedupe-p<N>.
	routeConsumer = "dedupe-route"
	routedStream  = "DEDUPE_ROUTED"
)

// docker runs the docker CLI and returns its trimmed combined output.
func docker(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		return s, fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, s)
	}
	return s, nil
}

// mustDocker is docker bounded by one minute; an error fails the test.
func mustDocker(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := docker(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// cleanupDocker registers the removal of a Docker object when the test ends.
func cleanupDocker(t testing.TB, args ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := docker(ctx, args...); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
}

// needDocker skips the test when no Docker engine answers.
func needDocker(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("docker CLI not found: skipping the container test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if out, err := docker(ctx, "version", "--format", "{{.Server.Version}}"); err != nil {
		t.Skipf("no Docker engine answers, skipping the container test: %v", err)
	} else {
		t.Logf("Docker engine %s", out)
	}
}

// hostPort returns the 127.0.0.1 address Docker published for a container
// port.
func hostPort(t testing.TB, container, port string) string {
	t.Helper()
	out := mustDocker(t, "port", container, port)
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "127.0.0.1:") {
			return strings.TrimSpace(line)
		}
	}
	t.Fatalf("docker port %s %s = %q: no 127.0.0.1 binding", container, port, out)
	return ""
}

// env is one run of the container test: its names and the test's own view
// of NATS.
type env struct {
	t          *testing.T
	id         string // unique per run, in every name
	stageImage string
	natsImage  string
	network    string
	volume     string // the stages' shared /data; "" gives each its own
	configDir  string
	natsURL    string // the stages' nats.url, on the network
	js         jetstream.JetStream

	// scaleOut says the stages run as a scale-out group: their output
	// subjects carry the partition, and drained waits for the route step
	// and the group's members.
	scaleOut bool
	// consumers are the stream and consumer names drained waits on, in
	// the order messages pass them.
	consumers [][2]string
}

// newEnv returns a run of the container test with fresh names. The images
// are built once per run of the package and shared by its tests (see
// build); TestMain removes them.
func newEnv(t *testing.T) *env {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(b)
	return &env{
		t:       t,
		id:      id,
		network: "dedupe-containertest-" + id,
		volume:  "dedupe-containertest-data-" + id,
	}
}

// images are the package's images, built once by the first test that
// needs them.
var images struct {
	once  sync.Once
	tag   string // "" until a build was tried
	dir   string // the build directory
	took  time.Duration
	err   error
	stage string
	nats  string
}

// TestMain removes the shared images and their build directory once every
// test has run.
func TestMain(m *testing.M) {
	code := m.Run()
	if images.tag != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, _ = docker(ctx, "rmi", "-f", images.stage, images.nats)
		cancel()
		os.RemoveAll(images.dir)
	}
	os.Exit(code)
}

// build runs deploy/build-images.sh into a temporary build directory, once
// per run of the package, and names the images in e.
func (e *env) build() {
	t := e.t
	images.once.Do(func() {
		start := time.Now()
		b := make([]byte, 4)
		if _, err := rand.Read(b); err != nil {
			images.err = err
			return
		}
		images.tag = hex.EncodeToString(b)
		images.stage = "dedupe-stage-containertest:" + images.tag
		images.nats = "dedupe-stage-nats-containertest:" + images.tag
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		root, err := filepath.Abs(repoRoot)
		if err != nil {
			images.err = err
			return
		}
		if images.dir, err = os.MkdirTemp("", "dedupe-containertest-build"); err != nil {
			images.err = err
			return
		}
		cmd := exec.CommandContext(ctx, filepath.Join(root, "deploy", "build-images.sh"))
		cmd.Env = append(os.Environ(),
			"TAG="+images.tag,
			"STAGE_IMAGE=dedupe-stage-containertest",
			"NATS_IMAGE=dedupe-stage-nats-containertest",
			"BUILD_DIR="+images.dir,
			"VERSION=containertest-"+images.tag,
		)
		if out, err := cmd.CombinedOutput(); err != nil {
			images.err = fmt.Errorf("deploy/build-images.sh: %w\n%s", err, out)
		}
		images.took = time.Since(start)
	})
	if images.err != nil {
		t.Fatal(images.err)
	}
	e.stageImage, e.natsImage = images.stage, images.nats
	t.Logf("images %s and %s (built once for the package in %s)", e.stageImage, e.natsImage, images.took.Round(100*time.Millisecond))
}

// prepare creates the test's Docker network and the config directory with
// config as stage.yaml (mounted read-only on /config). Without scaleOut the
// stages share one named data volume and are drained on the input
// consumer; with it each stage gets an anonymous /data volume of its own
// (removed with its container) and drained waits on the route step and
// every member of the group.
func (e *env) prepare(config string, scaleOut bool) {
	t := e.t
	t.Helper()
	mustDocker(t, "network", "create", e.network)
	cleanupDocker(t, "network", "rm", e.network)
	e.scaleOut = scaleOut
	if scaleOut {
		e.volume = ""
		e.consumers = [][2]string{{inputStream, routeConsumer}}
		for p := range partitions {
			e.consumers = append(e.consumers, [2]string{routedStream, "dedupe-p" + strconv.Itoa(p)})
		}
	} else {
		mustDocker(t, "volume", "create", e.volume)
		cleanupDocker(t, "volume", "rm", "-f", e.volume)
		e.consumers = [][2]string{{inputStream, consumerName}}
	}
	e.configDir = t.TempDir()
	// The stage runs as uid 65532: the mounted config must be readable by it.
	if err := os.Chmod(e.configDir, 0o755); err != nil {
		t.Fatalf("config directory for the stage containers: %v", err)
	}
	if err := os.WriteFile(filepath.Join(e.configDir, "stage.yaml"), []byte(config), 0o644); err != nil {
		t.Fatalf("writing the stage containers' config: %v", err)
	}
}

// runContainer starts a detached container and registers its removal (with
// its anonymous volumes); when the test failed, its log is printed first.
func (e *env) runContainer(name string, args ...string) {
	e.t.Helper()
	t := e.t
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if t.Failed() {
			logs, _ := docker(ctx, "logs", "--tail", "60", name)
			t.Logf("--- last log lines of %s:\n%s", name, logs)
		}
		if _, err := docker(ctx, "rm", "-f", "-v", name); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	mustDocker(t, append([]string{"run", "-d", "--name", name, "--network", e.network}, args...)...)
}

// token is the NATS token of the test's server.
func (e *env) token() string { return "containertest-" + e.id }

// startNATS runs the nats-server container, reachable as nats:4222 on the
// network and from the test on a published loopback port.
func (e *env) startNATS() {
	url := e.runNATS("dedupe-containertest-nats-"+e.id, []string{"--network-alias", "nats"})
	e.natsURL = "nats://nats:4222"
	_, e.js = natstest.Connect(e.t, url)
}

// runNATS runs a nats-server container of the project's image (its config:
// token, JetStream syncing every write) with dockerArgs before the image and
// serverArgs, when given, instead of the image's command. It waits until
// the server accepts a client with the token, checks that it refuses one
// without, and returns the test's URL of it, token included, on a
// published loopback port.
func (e *env) runNATS(name string, dockerArgs []string, serverArgs ...string) string {
	t := e.t
	t.Helper()
	args := append([]string{"-p", "127.0.0.1::4222", "-e", "NATS_TOKEN=" + e.token()}, dockerArgs...)
	e.runContainer(name, append(append(args, e.natsImage), serverArgs...)...)
	addr := hostPort(t, name, "4222/tcp")
	// The image's server requires the token; the URL carries it.
	url := "nats://" + e.token() + "@" + addr
	natstest.Poll(t, 30*time.Second, 200*time.Millisecond, name+" accepting clients", func() (bool, error) {
		nc, err := nats.Connect(url, nats.Timeout(2*time.Second))
		if err != nil {
			return false, err
		}
		nc.Close()
		return true, nil
	})
	if nc, err := nats.Connect("nats://"+addr, nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Errorf("nats container %s accepts a client without the token", name)
	}
	return url
}

// waitR3 waits until the cluster's JetStream can place a stream with three
// replicas: its meta leader is elected and counts every node as a peer.
func (e *env) waitR3() {
	t := e.t
	t.Helper()
	const nodes = 3
	start := time.Now()
	const probe = "CONTAINERTEST_PROBE"
	natstest.Poll(t, 60*time.Second, 250*time.Millisecond, "the cluster's JetStream to place a stream with 3 replicas", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := e.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name: probe, Subjects: []string{"containertest.probe"}, Storage: jetstream.MemoryStorage, Replicas: nodes,
		})
		if err != nil {
			return false, fmt.Errorf("create the R%d stream %s: %w", nodes, probe, err)
		}
		return true, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.js.DeleteStream(ctx, probe); err != nil {
		t.Fatalf("delete the probe stream %s: %v", probe, err)
	}
	t.Logf("%d-node NATS cluster ready for R%d streams in %s", nodes, nodes, time.Since(start).Round(10*time.Millisecond))
}

// stage is one stage container and its published HTTP address.
type stage struct {
	name string
	http string
}

// startStage runs a stage container on the shared data volume (without
// one, on its own anonymous volume) and waits until it is ready. Each of env is one more NAME=VALUE for the container.
func (e *env) startStage(name string, env ...string) stage {
	t := e.t
	args := []string{
		"-p", "127.0.0.1::9500",
		"-v", e.configDir + ":/config:ro",
		"-e", "DEDUPE_NATS_URL=" + e.natsURL,
		"-e", "DEDUPE_NATS_TOKEN=" + e.token(),
		// Not the image's 9464: the HEALTHCHECK must follow it.
		"-e", "DEDUPE_HTTP_ADDR=0.0.0.0:9500",
		// Health checks every second instead of every 10s, for the test.
		"--health-interval", "1s", "--health-retries", "3",
	}
	if e.volume != "" {
		args = append(args, "-v", e.volume+":/data")
	}
	for _, v := range env {
		args = append(args, "-e", v)
	}
	args = append(args, e.stageImage, "run", "--config", "/config/stage.yaml", "--create-streams")
	e.runContainer(name, args...)
	s := stage{name: name, http: "http://" + hostPort(t, name, "9500/tcp")}
	start := time.Now()
	natstest.Poll(t, 60*time.Second, 200*time.Millisecond, name+" ready", func() (bool, error) {
		if st := mustDocker(t, "inspect", "-f", "{{.State.Status}}", name); st != "running" {
			t.Fatalf("%s is %s, not running:\n%s", name, st, mustDocker(t, "logs", "--tail", "40", name))
		}
		code, _, err := httpGet(s.http + "/readyz")
		return code == http.StatusOK, err
	})
	t.Logf("%s ready in %s", name, time.Since(start).Round(10*time.Millisecond))
	return s
}

// httpGet GETs url with a 5s timeout and returns the status code and up to
// 8 MiB of the body.
func httpGet(url string) (int, string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return resp.StatusCode, string(b), err
}

// metrics scrapes the stage's /metrics.
func (s stage) metrics(t testing.TB) string {
	t.Helper()
	code, body, err := httpGet(s.http + "/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET %s/metrics: %d %v", s.http, code, err)
	}
	return body
}

// publish publishes copies of each key, copy by copy across the keys, with
// the key in the Event-Id header and the same payload in every copy; it
// returns when JetStream acknowledged them all.
func (e *env) publish(keys []string, copies int) {
	e.t.Helper()
	e.publishAsync(keys, copies)()
}

// publishAsync is publish that returns once the messages are sent, with a
// function that waits for their PubAcks.
func (e *env) publishAsync(keys []string, copies int) (wait func()) {
	t := e.t
	t.Helper()
	var acks []jetstream.PubAckFuture
	for c := 0; c < copies; c++ {
		for _, k := range keys {
			msg := &nats.Msg{Subject: subject, Header: nats.Header{}, Data: []byte(`{"order":"` + k + `"}`)}
			msg.Header.Set("Event-Id", k)
			// The nats image syncs every write: let the publisher wait
			// for acknowledgements instead of failing when many are out.
			f, err := e.js.PublishMsgAsync(msg, jetstream.WithStallWait(30*time.Second))
			if err != nil {
				t.Fatalf("publish %s: %v", k, err)
			}
			acks = append(acks, f)
		}
	}
	return func() {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatalf("publish: %v", err)
			case <-timeout:
				t.Fatal("publish: no PubAck within 30s")
			}
		}
	}
}

// drained waits until the stages acknowledged everything: every consumer
// of e.consumers, in order, has nothing pending and nothing awaiting an ack.
// In order, so that what the route step acked on the input is already in
// the routed stream when its members are asked.
func (e *env) drained(what string) {
	t := e.t
	t.Helper()
	natstest.Poll(t, 60*time.Second, 100*time.Millisecond, what, func() (bool, error) {
		for _, sc := range e.consumers {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			info, err := consumerInfo(ctx, e.js, sc[0], sc[1])
			cancel()
			if err != nil {
				return false, err
			}
			if info.NumPending != 0 || info.NumAckPending != 0 {
				return false, fmt.Errorf("consumer %s on %s: %d pending, %d awaiting an ack", sc[1], sc[0], info.NumPending, info.NumAckPending)
			}
		}
		return true, nil
	})
}

// consumerInfo returns the info of consumer on stream.
func consumerInfo(ctx context.Context, js jetstream.JetStream, stream, consumer string) (*jetstream.ConsumerInfo, error) {
	c, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: %w", consumer, stream, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: info: %w", consumer, stream, err)
	}
	return info, nil
}

// outputSubjectOK says whether subj is where the stage forwards an event:
// deduped.<input subject>, or with scale-out deduped.<partition>.<input
// subject>.
func (e *env) outputSubjectOK(subj string) bool {
	if !e.scaleOut {
		return subj == "deduped."+subject
	}
	p, ok := strings.CutSuffix(strings.TrimPrefix(subj, "deduped."), "."+subject)
	n, err := strconv.Atoi(p)
	return ok && err == nil && n >= 0 && n < partitions
}

// outputCounts returns how often each Nats-Msg-Id occurs in the output
// stream, checking the subject and payload of each message. Scale-out's
// partition fences (changelog.FenceSubject) are not events and are skipped.
func (e *env) outputCounts() map[string]int {
	t := e.t
	counts := map[string]int{}
	for _, m := range natstest.ReadAll(t, e.js, outputStream) {
		if strings.HasPrefix(m.Subject, strings.TrimSuffix(changelog.ControlSubjects("deduped"), ">")) {
			continue
		}
		k := m.Header.Get("Nats-Msg-Id")
		counts[k]++
		if !e.outputSubjectOK(m.Subject) {
			t.Errorf("output %s on subject %q, want it forwarded to the output prefix deduped", k, m.Subject)
		}
		if want := `{"order":"` + k + `"}`; string(m.Data) != want {
			t.Errorf("output %s payload %q, want %q", k, m.Data, want)
		}
	}
	return counts
}

// checkOnce fails unless the output holds each of keys exactly once and
// nothing else; it names the first ten keys that are not.
func (e *env) checkOnce(keys []string) {
	t := e.t
	t.Helper()
	counts := e.outputCounts()
	if len(counts) != len(keys) {
		t.Errorf("output holds %d distinct keys, want %d", len(counts), len(keys))
	}
	wrong := 0
	for _, k := range keys {
		if counts[k] != 1 {
			if wrong++; wrong <= 10 {
				t.Errorf("output holds key %s %d times, want once", k, counts[k])
			}
		}
	}
	if wrong > 10 {
		t.Errorf("... and %d more keys not forwarded exactly once, of %d", wrong-10, len(keys))
	}
}

// stop sends SIGTERM through docker stop (SIGKILL after 10s) and checks that
// the stage exited by itself with code 0 well before that.
func (e *env) stop(s stage) {
	e.t.Helper()
	took, err := dockerStop(s)
	if err != nil {
		e.t.Fatal(err)
	}
	e.checkStopped(s, took)
}

// dockerStop runs docker stop -t 10 and returns how long it took. It is safe
// to call from any goroutine.
func dockerStop(s stage) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err := docker(ctx, "stop", "-t", "10", s.name)
	return time.Since(start), err
}

// checkStopped checks that a stage stopped by docker stop in took exited by
// itself with code 0 and logged a clean stop.
func (e *env) checkStopped(s stage, took time.Duration) {
	t := e.t
	t.Helper()
	var st struct {
		Status     string
		ExitCode   int
		OOMKilled  bool
		StartedAt  time.Time
		FinishedAt time.Time
	}
	if err := json.Unmarshal([]byte(mustDocker(t, "inspect", "-f", "{{json .State}}", s.name)), &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: docker stop took %s; exit code %d", s.name, took.Round(time.Millisecond), st.ExitCode)
	if st.Status != "exited" || st.ExitCode != 0 || st.OOMKilled {
		t.Fatalf("%s after SIGTERM: status %s, exit code %d, OOM killed %v; want exited with 0",
			s.name, st.Status, st.ExitCode, st.OOMKilled)
	}
	if took >= 10*time.Second {
		t.Fatalf("%s took %s to stop: it did not exit on SIGTERM before docker's 10s kill", s.name, took)
	}
	logs := mustDocker(t, "logs", s.name)
	if !strings.Contains(logs, "stopped cleanly") {
		t.Errorf("%s log has no \"stopped cleanly\" line; last lines:\n%s", s.name, tail(logs, 20))
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// keysFor returns n distinct keys starting with prefix.
func keysFor(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return keys
}

// TestContainer runs one stage container against the nats-server container:
// keys published with copies are forwarded once each, SIGTERM under load
// exits cleanly, and a new container on the same data volume forwards what
// was left and recognises every copy published again.
func TestContainer(t *testing.T) {
	t.Parallel()
	needDocker(t)
	began := time.Now()
	e := newEnv(t)
	e.build()

	e.prepare(stageConfig("", ""), false)
	e.startNATS()
	first := e.startStage("dedupe-containertest-stage-" + e.id)

	t.Run("health", func(t *testing.T) {
		code, body, err := httpGet(first.http + "/healthz")
		if err != nil || code != http.StatusOK {
			t.Fatalf("GET /healthz: %d %q %v", code, body, err)
		}
		// The image's HEALTHCHECK runs the binary's healthcheck command.
		natstest.Poll(t, 30*time.Second, 250*time.Millisecond, "container health status healthy", func() (bool, error) {
			st := mustDocker(t, "inspect", "-f", "{{.State.Health.Status}}", first.name)
			return st == "healthy", fmt.Errorf("health status %s", st)
		})
	})

	t.Run("inspect off in the image", func(t *testing.T) {
		if code, body, err := httpGet(first.http + "/inspect?key=k"); err != nil || code != http.StatusNotFound {
			t.Errorf("GET /inspect on the image's defaults: %d %q %v, want 404", code, body, err)
		}
	})

	// Phase 1: 200 keys, each published three times: forwarded once each.
	keys1 := keysFor("order-a", 200)
	e.publish(keys1, copies)
	e.drained("first stage acked all of phase 1")
	e.checkOnce(keys1)
	body := first.metrics(t)
	if got := metrictest.Text(t, body, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != float64(len(keys1)) {
		t.Errorf("dedupe_messages_total{outcome=new} = %v, want %d", got, len(keys1))
	}
	if got := metrictest.Text(t, body, "dedupe_messages_total", map[string]string{"outcome": "repeat"}); got != float64(len(keys1)*(copies-1)) {
		t.Errorf("dedupe_messages_total{outcome=repeat} = %v, want %d", got, len(keys1)*(copies-1))
	}
	if got := metrictest.Text(t, body, "dedupe_dead_letters_total", nil); got != 0 {
		t.Errorf("dedupe_dead_letters_total = %v, want 0", got)
	}
	if got := metrictest.Text(t, body, "dedupe_ready", nil); got != 1 {
		t.Errorf("dedupe_ready = %v, want 1", got)
	}

	t.Run("promtool check metrics", func(t *testing.T) {
		promtool := needPromtool(t)
		out := run(t, time.Minute, ".", []byte(body), promtool, "check", "metrics")
		if s := strings.TrimSpace(out); s != "" {
			t.Logf("promtool check metrics: %s", s)
		}
	})

	// Phase 2: 20000 more keys, and SIGTERM while the stage is on them: sent
	// once the first 2000 are published, while the rest are being published.
	// The stage finishes the batches in flight and exits 0.
	keys2 := keysFor("order-b", 20000)
	e.publishAsync(keys2[:2000], 1)()
	type stopped struct {
		took time.Duration
		err  error
	}
	stopDone := make(chan stopped, 1)
	go func() {
		took, err := dockerStop(first)
		stopDone <- stopped{took, err}
	}()
	e.publishAsync(keys2[2000:], 1)()
	st := <-stopDone
	if st.err != nil {
		t.Fatal(st.err)
	}
	e.checkStopped(first, st.took)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ostr, err := e.js.Stream(ctx, outputStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := ostr.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	forwardedBefore := int(info.State.Msgs)
	t.Logf("forwarded before SIGTERM: %d of %d keys", forwardedBefore, len(keys1)+len(keys2))

	// A new container on the same volume: what is left of phase 2 is
	// forwarded, every copy of every key published again is a repeat.
	second := e.startStage("dedupe-containertest-stage2-"+e.id, "DEDUPE_HTTP_INSPECT=true")
	all := append(append([]string(nil), keys1...), keys2...)
	e.publish(all, 1)
	e.drained("second stage acked everything")
	e.checkOnce(all)
	body = second.metrics(t)
	wantNew := len(all) - forwardedBefore
	if got := metrictest.Text(t, body, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != float64(wantNew) {
		t.Errorf("after the restart dedupe_messages_total{outcome=new} = %v, want %d (the keys not forwarded before SIGTERM)", got, wantNew)
	}
	if got := metrictest.Text(t, body, "dedupe_messages_total", map[string]string{"outcome": "repeat"}); got < float64(len(all)) {
		t.Errorf("after the restart dedupe_messages_total{outcome=repeat} = %v, want at least the %d copies published again", got, len(all))
	}
	if got := metrictest.Text(t, body, "dedupe_republish_duplicates_total", nil); got != 0 {
		t.Errorf("dedupe_republish_duplicates_total = %v, want 0: a clean stop leaves nothing published and not committed", got)
	}

	t.Run("inspect after restart", func(t *testing.T) {
		code, body, err := httpGet(second.http + "/inspect?key=" + keys1[0])
		if err != nil || code != http.StatusOK {
			t.Fatalf("GET /inspect: %d %q %v", code, body, err)
		}
		var in struct {
			Found        bool `json:"found"`
			InsideWindow bool `json:"inside_window"`
		}
		if err := json.Unmarshal([]byte(body), &in); err != nil {
			t.Fatalf("/inspect body %q: %v", body, err)
		}
		if !in.Found || !in.InsideWindow {
			t.Errorf("/inspect?key=%s = %s, want found and inside the window", keys1[0], body)
		}
	})

	e.stop(second)
	t.Logf("container test took %s", time.Since(began).Round(100*time.Millisecond))
}

// owned returns the partitions each stage owns (dedupe_partitions_owned),
// and an error naming a stage whose metrics cannot be read.
func owned(t testing.TB, stages []stage) ([]int, error) {
	t.Helper()
	out := make([]int, len(stages))
	for i, s := range stages {
		code, body, err := httpGet(s.http + "/metrics")
		if err != nil || code != http.StatusOK {
			return nil, fmt.Errorf("GET %s/metrics of %s: %d %v", s.http, s.name, code, err)
		}
		out[i] = int(metrictest.Text(t, body, "dedupe_partitions_owned", nil))
	}
	return out, nil
}

// fair says whether the stages own every partition between them, none more
// than its share (the group's balance: at most ⌈partitions/stages⌉ each).
func fair(owned []int) bool {
	sum, most := 0, 0
	for _, n := range owned {
		sum += n
		most = max(most, n)
	}
	return sum == partitions && most <= (partitions+len(owned)-1)/len(owned)
}

// sumOver is metrictest.Text added up over the metrics of several stages.
func sumOver(t testing.TB, bodies []string, name string, labels map[string]string) float64 {
	t.Helper()
	var sum float64
	for _, b := range bodies {
		sum += metrictest.Text(t, b, name, labels)
	}
	return sum
}

// balance publishes rounds of a few new keys until the stages share the
// partitions fairly, and returns the keys it published. An instance owns a
// partition once the server delivers it a message of the partition under
// its pin, so the partitions another instance released for balance move
// only with traffic. It gives up after a minute.
func (e *env) balance(stages []stage) []string {
	t := e.t
	t.Helper()
	var keys []string
	var last []int
	start := time.Now()
	round := 0
	// Presence refreshes every input.ack_wait; a release waits for one:
	// a round a second.
	if natstest.Until(time.Minute, time.Second, func() bool {
		o, err := owned(t, stages)
		if err != nil {
			t.Fatalf("reading the partitions each stage owns: %v", err)
		}
		last = o
		if fair(o) {
			t.Logf("partitions owned by stage %v after %d rounds of new keys (%s)", o, round, time.Since(start).Round(10*time.Millisecond))
			return true
		}
		k := keysFor(fmt.Sprintf("order-warm%02d", round), 20)
		e.publish(k, 1)
		keys = append(keys, k...)
		e.drained("the group to ack a round of keys published for balance")
		round++
		return false
	}) {
		return keys
	}
	t.Fatalf("after %d rounds of new keys (%s) the stages own %v of %d partitions: want every partition owned and at most %d each",
		round, time.Since(start).Round(time.Second), last, partitions, (partitions+len(stages)-1)/len(stages))
	return nil
}

// TestContainerScaleOut runs the group as deploy/compose-group.yaml starts
// it (3 NATS nodes, three stage instances), kills one stage and one NATS
// container, then stops a stage cleanly: each batch of keys is forwarded
// once, and the last instance takes every partition.
func TestContainerScaleOut(t *testing.T) {
	t.Parallel()
	needDocker(t)
	tool := composeTool(t)
	if tool == nil {
		t.Skip("neither docker compose nor docker-compose found: skipping the group's container test")
	}
	e := newEnv(t)
	e.build()
	began := time.Now()
	e.scaleOut = true
	e.consumers = [][2]string{{inputStream, routeConsumer}}
	for p := range partitions {
		e.consumers = append(e.consumers, [2]string{routedStream, "dedupe-p" + strconv.Itoa(p)})
	}
	e.configDir = t.TempDir()
	if err := os.Chmod(e.configDir, 0o755); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(e.configDir, "stage.yaml")
	if err := os.WriteFile(config, []byte(stageConfig(scaleOutAckWait, scaleOutSection)), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	natsPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	g := &composeGroup{t: t, tool: tool, project: "dedupe-ct-" + e.id, env: append(os.Environ(),
		"TAG="+images.tag,
		"STAGE_IMAGE=dedupe-stage-containertest",
		"NATS_IMAGE=dedupe-stage-nats-containertest",
		"NATS_TOKEN="+e.token(),
		"STAGE_CONFIG="+config,
		"NATS_PORT="+strconv.Itoa(natsPort),
	)}
	t.Cleanup(g.down)
	g.run(3*time.Minute, "up", "-d")
	url := "nats://" + e.token() + "@127.0.0.1:" + strconv.Itoa(natsPort)
	natstest.Poll(t, 60*time.Second, 200*time.Millisecond, "nats1 accepting clients", func() (bool, error) {
		nc, err := nats.Connect(url, nats.Timeout(2*time.Second))
		if err != nil {
			return false, err
		}
		nc.Close()
		return true, nil
	})
	_, e.js = natstest.Connect(t, url)
	e.waitR3()
	var group []stage
	for _, svc := range []string{"stage1", "stage2", "stage3"} {
		group = append(group, g.stage(svc))
	}

	// Batch 1: 300 keys, each published three times, across the group.
	keys1 := keysFor("order-a", 300)
	e.publish(keys1, copies)
	e.drained("the group to ack all of batch 1")
	forwarded := append(append([]string(nil), keys1...), e.balance(group)...)
	e.checkOnce(forwarded)
	bodies := []string{group[0].metrics(t), group[1].metrics(t), group[2].metrics(t)}
	if got := sumOver(t, bodies, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != float64(len(forwarded)) {
		t.Errorf("dedupe_messages_total{outcome=new} of the group = %v, want %d: one per key", got, len(forwarded))
	}
	if got := sumOver(t, bodies, "dedupe_dead_letters_total", nil); got != 0 {
		t.Errorf("dedupe_dead_letters_total of the group = %v, want 0", got)
	}

	// Batch 2: 300 new keys three times each; while the group works on
	// them, stage2 and nats3 are killed; once the input has a leader on a
	// node left, a copy of every key of batch 1.
	keys2 := keysFor("order-b", 300)
	e.publish(keys2, copies)
	mustDocker(t, "kill", group[1].name)
	g.run(time.Minute, "kill", "nats3")
	natstest.Poll(t, 60*time.Second, 200*time.Millisecond, "the input stream to have a leader after nats3 was killed", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := e.js.Stream(ctx, inputStream)
		if err != nil {
			return false, err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return false, err
		}
		if info.Cluster == nil || info.Cluster.Leader == "" || info.Cluster.Leader == "nats3" {
			return false, fmt.Errorf("input stream leader %+v", info.Cluster)
		}
		return true, nil
	})
	e.publish(keys1, 1)
	e.drained("the group to ack all of batch 2 with stage2 and nats3 killed")
	forwarded = append(forwarded, keys2...)
	e.checkOnce(forwarded)

	// Batch 3 after stage3 stops cleanly: stage1 takes every partition.
	if mustDocker(t, "inspect", "-f", "{{.State.Running}}", group[1].name) == "false" {
		e.stop(group[2])
		keys3 := keysFor("order-c", 300)
		e.publish(keys3, copies)
		e.publish(keys2, 1)
		e.drained("stage1 alone to ack all of batch 3")
		e.checkOnce(append(forwarded, keys3...))
		natstest.Poll(t, 30*time.Second, 250*time.Millisecond, "stage1 to own every partition", func() (bool, error) {
			o, err := owned(t, group[:1])
			if err != nil {
				return false, err
			}
			return o[0] == partitions, fmt.Errorf("stage1 owns %d of %d partitions", o[0], partitions)
		})
	} else {
		t.Log("the Docker engine restarted the killed stage2 (restart: unless-stopped): the clean-stop step is left out")
	}
	t.Logf("group container test took %s after the build", time.Since(began).Round(100*time.Millisecond))
}

// composeTool returns the compose command (docker compose, or
// docker-compose), or nil when there is none.
func composeTool(t testing.TB) []string {
	t.Helper()
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}
	}
	if p, err := exec.LookPath("docker-compose"); err == nil {
		return []string{p}
	}
	return nil
}

// composeGroup is deploy/compose-group.yaml run as one compose project.
type composeGroup struct {
	t       *testing.T
	tool    []string
	project string
	env     []string
}

// run runs the compose tool on the group's file with args, bounded by
// timeout; an error fails the test.
func (g *composeGroup) run(timeout time.Duration, args ...string) string {
	g.t.Helper()
	out, err := g.exec(timeout, args...)
	if err != nil {
		g.t.Fatal(err)
	}
	return out
}

func (g *composeGroup) exec(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		return "", err
	}
	full := append(append(slices.Clone(g.tool[1:]), "-f", filepath.Join(root, "deploy", "compose-group.yaml"), "-p", g.project), args...)
	cmd := exec.CommandContext(ctx, g.tool[0], full...)
	cmd.Env = g.env
	out, err := cmd.CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err != nil {
		return s, fmt.Errorf("%s %s: %w: %s", strings.Join(g.tool, " "), strings.Join(args, " "), err, s)
	}
	return s, nil
}

// down prints the services' last log lines when the test failed, then
// removes the project's containers, network and volumes.
func (g *composeGroup) down() {
	if g.t.Failed() {
		logs, _ := g.exec(time.Minute, "logs", "--no-color", "--tail", "40")
		g.t.Logf("--- last log lines of the group:\n%s", logs)
	}
	if out, err := g.exec(2*time.Minute, "down", "-v", "-t", "5"); err != nil {
		g.t.Logf("cleanup: %v\n%s", err, out)
	}
}

// stage returns service svc's container and its published HTTP address,
// once it is ready.
func (g *composeGroup) stage(svc string) stage {
	t := g.t
	t.Helper()
	id := g.run(time.Minute, "ps", "-q", svc)
	s := stage{name: id, http: "http://" + hostPort(t, id, "9464/tcp")}
	start := time.Now()
	natstest.Poll(t, 60*time.Second, 200*time.Millisecond, svc+" ready", func() (bool, error) {
		code, _, err := httpGet(s.http + "/readyz")
		return code == http.StatusOK, err
	})
	t.Logf("%s ready in %s", svc, time.Since(start).Round(10*time.Millisecond))
	return s
}
