package faults

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// healthView is every health signal of a running stage, read at once.
type healthView struct {
	healthz, readyz                   int
	healthzBody                       string
	healthy, connected, natsComponent float64
	reconnects                        float64
}

func (v healthView) String() string {
	return fmt.Sprintf("/healthz %d /readyz %d dedupe_healthy %v dedupe_nats_connected %v dedupe_component_healthy{nats} %v dedupe_nats_reconnects_total %v: %s",
		v.healthz, v.readyz, v.healthy, v.connected, v.natsComponent, v.reconnects, strings.TrimSpace(v.healthzBody))
}

// health reads s's health signals.
func (s *stage) health() healthView {
	s.tb.Helper()
	var v healthView
	v.healthz, v.healthzBody = s.get("/healthz")
	v.readyz, _ = s.get("/readyz")
	v.healthy = s.metric("dedupe_healthy")
	v.connected = s.metric("dedupe_nats_connected")
	v.natsComponent = s.metric("dedupe_component_healthy", "component", "nats")
	v.reconnects = s.metric("dedupe_nats_reconnects_total")
	return v
}

// TestHealthWhileNATSIsDown kills the stage's external nats-server
// (SIGKILL) and restarts it on the same port and store: after a grace of a
// few seconds (never before 3s), /healthz answers 503 naming nats,
// /readyz 503, dedupe_healthy and dedupe_component_healthy{nats} 0, and
// dedupe_nats_connected 0; at the reconnect all recover, the reconnect is
// counted, and the stage goes on forwarding.
func TestHealthWhileNATSIsDown(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	cfg := defaultStageConfig(t, srv.URL())
	s := newStage(t, cfg)
	p := s.startReady()
	js := publisherJS(t, srv.URL())
	publishOne := func(id string) {
		t.Helper()
		m := nats.NewMsg("events.health")
		m.Header.Set("Event-Id", id)
		m.Data = []byte(id)
		natstest.PublishAll(t, js, []*nats.Msg{m})
	}
	publishOne("before")
	natstest.WaitFor(t, 30*time.Second, "the first event forwarded", func() bool { return streamMsgs(js, outputStream) == 1 })
	if v := s.health(); v.healthz != http.StatusOK || v.readyz != http.StatusOK || v.healthy != 1 || v.connected != 1 || v.natsComponent != 1 || v.reconnects != 0 {
		t.Fatalf("before the kill: %v", v)
	}

	killed := time.Now()
	srv.stop(syscall.SIGKILL)
	var v healthView
	natstest.Poll(t, 20*time.Second, 50*time.Millisecond, "every signal to say nats is lost", func() (bool, error) {
		v = s.health()
		return v.healthz == http.StatusServiceUnavailable && strings.Contains(v.healthzBody, "nats: disconnected for") &&
			v.readyz == http.StatusServiceUnavailable && v.healthy == 0 && v.connected == 0 && v.natsComponent == 0, fmt.Errorf("%v", v)
	})
	took := time.Since(killed)
	t.Logf("unhealthy %v after the kill: %v", took.Round(10*time.Millisecond), v)
	if took < 3*time.Second {
		t.Errorf("unhealthy %v after the kill, before the 3s grace", took)
	}
	if !p.Running() {
		t.Fatalf("the stage exited while the server was down: %v\n%s", p.Err(), crashReport(p.Log()))
	}

	srv.start()
	natstest.Poll(t, 30*time.Second, 50*time.Millisecond, "every signal to recover", func() (bool, error) {
		v = s.health()
		return v.healthz == http.StatusOK && v.readyz == http.StatusOK && v.healthy == 1 && v.connected == 1 && v.natsComponent == 1 && v.reconnects == 1,
			fmt.Errorf("%v", v)
	})
	publishOne("after")
	natstest.WaitFor(t, 30*time.Second, "the event after the restart forwarded", func() bool { return streamMsgs(js, outputStream) == 2 })
}

// statusWaitRE reads how long status says a single instance's input has
// waited.
var statusWaitRE = regexp.MustCompile(`CRITICAL: the input of consumer dedupe-stage on EVENTS has waited ([\d.]+)s with no consumer activity, longer than the hand-over time 3s`)

// TestStatusOfASingleInstance runs `status` on one instance's
// configuration through its life: OK while it runs (idle, and after it
// drained its input), OK stopped with nothing waiting, CRITICAL once input
// has waited longer than the hand-over time (input.ack_wait 1s plus
// output.restart_margin 2s) with no consumer activity, saying how long,
// and OK again once it runs and has drained it.
func TestStatusOfASingleInstance(t *testing.T) {
	t.Parallel()
	srv := startNATSUnsynced(t)
	cfg := defaultStageConfig(t, srv.URL())
	cfg.RestartMargin = 2 * time.Second
	s := newStage(t, cfg)
	p := s.startReady()
	js := publisherJS(t, srv.URL())
	publish := func(prefix string, n int) {
		t.Helper()
		msgs := make([]*nats.Msg, n)
		for i := range msgs {
			msgs[i] = nats.NewMsg("events.status")
			msgs[i].Header.Set("Event-Id", prefix+strconv.Itoa(i))
			msgs[i].Data = []byte("x")
		}
		natstest.PublishAll(t, js, msgs)
	}
	// status waits until `status` exits want saying says: a running
	// stage's pull request waits on the consumer between its pulls, which
	// status can read in the instant between two.
	status := func(step string, want int, says string) {
		t.Helper()
		var out string
		var code int
		if !natstest.Until(30*time.Second, 100*time.Millisecond, func() bool {
			var errOut string
			out, errOut, code = runStatus(t, s.cfgPath, false)
			out += errOut
			return code == want && strings.Contains(out, says)
		}) {
			t.Errorf("%s: status exited %d, want %d saying %q:\n%s", step, code, want, says, out)
		}
	}
	status("running, idle", 0, "; running (pulling from its consumer)")
	publish("a-", 100)
	waitDrained(t, js, 30*time.Second)
	status("running, drained", 0, "0 pending, 0 ack pending; running")

	p.signal(t, syscall.SIGTERM, 30*time.Second)
	status("stopped, drained", 0, "not pulling now, nothing waits")
	publish("b-", 3)
	var out string
	natstest.WaitFor(t, 30*time.Second, "status to say the input waits with no consumer activity", func() bool {
		var errOut string
		var code int
		out, errOut, code = runStatus(t, s.cfgPath, false)
		out += errOut
		return code == 2
	})
	t.Logf("stopped, input waiting:\n%s", out)
	m := statusWaitRE.FindStringSubmatch(out)
	if m == nil || strings.Count(out, "\n") != 2 {
		t.Fatalf("status does not say in a line how long the input has waited:\n%s", out)
	}
	if waited, _ := strconv.ParseFloat(m[1], 64); waited <= 3 {
		t.Errorf("critical after the input waited %vs, within the 3s hand-over time", waited)
	}

	s.startReady()
	waitDrained(t, js, 30*time.Second)
	status("restarted, drained", 0, "; running")
}
