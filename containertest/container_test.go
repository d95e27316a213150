package containertest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/natstest"
)

// The stage's config in the container. The key is the Event-Id header, not
// Nats-Msg-Id: the input stream would drop copies with a repeated
// Nats-Msg-Id itself, and the test must show that the stage does the work.
const stageConfig = `# containertest: the stage against the nats container
key:
  source: header
  header: Event-Id
input:
  stream: EVENTS
  subjects: ["events.>"]
  consumer: dedupe-stage
output:
  stream: EVENTS_DEDUPED
  subject_prefix: deduped
state:
  partitions: 4
  memory_budget: 64MiB
filter:
  expected_keys: 100000
log:
  format: json
`

const (
	inputStream  = "EVENTS"
	outputStream = "EVENTS_DEDUPED"
	consumerName = "dedupe-stage"
	subject      = "events.orders"
	copies       = 3
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
	volume     string
	configDir  string
	js         jetstream.JetStream
}

func newEnv(t *testing.T) *env {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(b)
	e := &env{
		t:          t,
		id:         id,
		stageImage: "dedupe-stage-containertest:" + id,
		natsImage:  "dedupe-stage-nats-containertest:" + id,
		network:    "dedupe-containertest-" + id,
		volume:     "dedupe-containertest-data-" + id,
	}
	// Cleanups run last-registered first: containers (registered as they
	// start), then the volume, the network and the images.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = docker(ctx, "rmi", "-f", e.stageImage, e.natsImage)
	})
	return e
}

// build runs deploy/build-images.sh into a temporary build directory.
func (e *env) build() {
	t := e.t
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "deploy", "build-images.sh"))
	cmd.Env = append(os.Environ(),
		"TAG="+e.id,
		"STAGE_IMAGE=dedupe-stage-containertest",
		"NATS_IMAGE=dedupe-stage-nats-containertest",
		"BUILD_DIR="+t.TempDir(),
		"VERSION=containertest-"+e.id,
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("deploy/build-images.sh: %v\n%s", err, out)
	}
	t.Logf("built %s and %s in %s", e.stageImage, e.natsImage, time.Since(start).Round(100*time.Millisecond))
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
	t := e.t
	name := "dedupe-containertest-nats-" + e.id
	e.runContainer(name, "--network-alias", "nats", "-p", "127.0.0.1::4222", "-e", "NATS_TOKEN="+e.token(), e.natsImage)
	// The image's server requires the token; the URL carries it.
	url := "nats://" + e.token() + "@" + hostPort(t, name, "4222/tcp")
	natstest.Poll(t, 30*time.Second, 200*time.Millisecond, "nats-server container accepting clients", func() (bool, error) {
		nc, err := nats.Connect(url, nats.Timeout(2*time.Second))
		if err != nil {
			return false, err
		}
		nc.Close()
		return true, nil
	})
	if nc, err := nats.Connect("nats://"+hostPort(t, name, "4222/tcp"), nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Error("the nats container accepts a client without the token")
	}
	_, e.js = natstest.Connect(t, url)
}

// stage is one stage container and its published HTTP address.
type stage struct {
	name string
	http string
}

// startStage runs a stage container on the shared data volume and waits
// until it is ready. Each of env is one more NAME=VALUE for the container.
func (e *env) startStage(name string, env ...string) stage {
	t := e.t
	args := []string{
		"-p", "127.0.0.1::9500",
		"-v", e.volume + ":/data",
		"-v", e.configDir + ":/config:ro",
		"-e", "DEDUPE_NATS_URL=nats://nats:4222",
		"-e", "DEDUPE_NATS_TOKEN=" + e.token(),
		// Not the image's 9464: the HEALTHCHECK must follow it.
		"-e", "DEDUPE_HTTP_ADDR=0.0.0.0:9500",
		// Health checks every second instead of every 10s, for the test.
		"--health-interval", "1s", "--health-retries", "3",
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

// sumMetric adds up the samples of name whose labels include every
// label="value" pair in want, in Prometheus text format.
func sumMetric(t testing.TB, body, name string, want ...string) float64 {
	t.Helper()
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		metric, labels, _ := strings.Cut(series, "{")
		if metric != name {
			continue
		}
		match := true
		for _, w := range want {
			if !strings.Contains(labels, w) {
				match = false
			}
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
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

// drained waits until the stage acknowledged everything on the input.
func (e *env) drained(what string) {
	t := e.t
	natstest.Poll(t, 60*time.Second, 100*time.Millisecond, what, func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := e.js.Consumer(ctx, inputStream, consumerName)
		if err != nil {
			return false, err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return false, err
		}
		return info.NumPending == 0 && info.NumAckPending == 0, nil
	})
}

// outputCounts returns how often each Nats-Msg-Id occurs in the output
// stream, checking the subject and payload of each message.
func (e *env) outputCounts() map[string]int {
	t := e.t
	counts := map[string]int{}
	for _, m := range natstest.ReadAll(t, e.js, outputStream) {
		k := m.Header.Get("Nats-Msg-Id")
		counts[k]++
		if m.Subject != "deduped."+subject {
			t.Errorf("output %s on subject %q, want deduped.%s", k, m.Subject, subject)
		}
		if want := `{"order":"` + k + `"}`; string(m.Data) != want {
			t.Errorf("output %s payload %q, want %q", k, m.Data, want)
		}
	}
	return counts
}

// checkOnce fails unless the output holds each of keys exactly once and
// nothing else.
func (e *env) checkOnce(keys []string) {
	t := e.t
	t.Helper()
	counts := e.outputCounts()
	if len(counts) != len(keys) {
		t.Errorf("output holds %d distinct keys, want %d", len(counts), len(keys))
	}
	for _, k := range keys {
		if counts[k] != 1 {
			t.Errorf("output holds key %s %d times, want once", k, counts[k])
		}
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

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func keysFor(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return keys
}

func TestContainer(t *testing.T) {
	needDocker(t)
	began := time.Now()
	e := newEnv(t)
	e.build()

	mustDocker(t, "network", "create", e.network)
	cleanupDocker(t, "network", "rm", e.network)
	mustDocker(t, "volume", "create", e.volume)
	cleanupDocker(t, "volume", "rm", "-f", e.volume)
	e.configDir = t.TempDir()
	// The stage runs as uid 65532: the mounted config must be readable by it.
	if err := os.Chmod(e.configDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.configDir, "stage.yaml"), []byte(stageConfig), 0o644); err != nil {
		t.Fatal(err)
	}

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
	if got := sumMetric(t, body, "dedupe_messages_total", `outcome="new"`); got != float64(len(keys1)) {
		t.Errorf("dedupe_messages_total{outcome=new} = %v, want %d", got, len(keys1))
	}
	if got := sumMetric(t, body, "dedupe_messages_total", `outcome="repeat"`); got != float64(len(keys1)*(copies-1)) {
		t.Errorf("dedupe_messages_total{outcome=repeat} = %v, want %d", got, len(keys1)*(copies-1))
	}
	if got := sumMetric(t, body, "dedupe_dead_letters_total"); got != 0 {
		t.Errorf("dedupe_dead_letters_total = %v, want 0", got)
	}
	if got := sumMetric(t, body, "dedupe_ready"); got != 1 {
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
	if got := sumMetric(t, body, "dedupe_messages_total", `outcome="new"`); got != float64(wantNew) {
		t.Errorf("after the restart dedupe_messages_total{outcome=new} = %v, want %d (the keys not forwarded before SIGTERM)", got, wantNew)
	}
	if got := sumMetric(t, body, "dedupe_messages_total", `outcome="repeat"`); got < float64(len(all)) {
		t.Errorf("after the restart dedupe_messages_total{outcome=repeat} = %v, want at least the %d copies published again", got, len(all))
	}
	if got := sumMetric(t, body, "dedupe_republish_duplicates_total"); got != 0 {
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
