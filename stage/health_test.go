package stage_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
	"github.com/dedupe-stage/dedupe-stage/stage"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// TestHealthOnePath drives a Health through failures and recoveries
// and checks that /healthz, /readyz, dedupe_healthy and
// dedupe_component_healthy say the same at every step, and that a
// component recovers only when its own operation succeeds.
func TestHealthOnePath(t *testing.T) {
	st := &stage.Health{}
	reg := prometheus.NewRegistry()
	stage.NewMetrics(reg, 60, st)
	h := stage.NewHandler(reg, st)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	component := func(name string) float64 {
		if v, ok := metrictest.Lookup(t, reg, "dedupe_component_healthy", map[string]string{"component": name}); ok {
			return v
		}
		return -1
	}
	check := func(step string, healthy bool, failing ...string) {
		t.Helper()
		code, body := get("/healthz")
		if (code == http.StatusOK) != healthy {
			t.Errorf("%s: /healthz %d %q, want healthy %v", step, code, body, healthy)
		}
		for _, f := range failing {
			if !strings.Contains(body, f) {
				t.Errorf("%s: /healthz %q does not name %s", step, body, f)
			}
		}
		if code, _ := get("/readyz"); (code == http.StatusOK) != healthy {
			t.Errorf("%s: /readyz %d, want ready %v", step, code, healthy)
		}
		want := 0.0
		if healthy {
			want = 1
		}
		if v := gauge(t, reg, "dedupe_healthy"); v != want {
			t.Errorf("%s: dedupe_healthy %v, want %v", step, v, want)
		}
		for _, c := range []string{stage.CompPublish, stage.CompDeadLetter} {
			want := 1.0
			for _, f := range failing {
				if strings.HasPrefix(f, c) {
					want = 0
				}
			}
			if v := component(c); v != want && v != -1 {
				t.Errorf("%s: dedupe_component_healthy{component=%s} %v, want %v", step, c, v, want)
			}
		}
	}

	if code, _ := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz of a starting stage: %d, want 503", code)
	}
	if v := gauge(t, reg, "dedupe_ready"); v != 0 {
		t.Errorf("dedupe_ready of a starting stage: %v", v)
	}
	stage.SetReady(st, true)
	check("start", true)

	dlErr := errors.New("dead-letter stream unavailable")
	st.Failed(stage.CompDeadLetter, dlErr)
	st.Failed(stage.CompDeadLetter, dlErr)
	check("two dead-letter failures", true)
	st.Failed(stage.CompDeadLetter, dlErr)
	check("three dead-letter failures", false, "dead_letter: dead-letter stream unavailable")

	st.Succeeded(stage.CompPublish, true)
	st.Succeeded(stage.CompPublish+"/2", true)
	check("a publish success", false, "dead_letter")

	for range 3 {
		st.Failed(stage.CompPublish+"/1", errors.New("timeout"))
	}
	check("partition 1 publishes failing", false, "dead_letter", "publish/1: timeout")
	st.Succeeded(stage.CompPublish+"/0", true)
	check("partition 0 publishes", false, "dead_letter", "publish/1")

	st.Succeeded(stage.CompDeadLetter, true)
	check("a dead-letter success", false, "publish/1")
	st.Succeeded(stage.CompPublish+"/1", true)
	check("partition 1 publishes again", true)
}

// TestHealthFollowsTheNATSConnection loses a real connection (its server
// shut down) and brings it back (a server on the same port): while it is
// down dedupe_nats_connected is 0 at once, and /healthz, /readyz,
// dedupe_healthy and dedupe_component_healthy{component="nats"} turn
// unhealthy, naming nats, once the grace has passed on the health's clock,
// and not before; at the reconnect all recover and the reconnect is
// counted.
func TestHealthFollowsTheNATSConnection(t *testing.T) {
	port := proctest.Port(t)
	dir := t.TempDir()
	srv := natstest.RunServerOn(t, dir, port)
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	clock := window.NewManualClock(time.Unix(1_700_000_000, 0))
	st := &stage.Health{}
	stage.WatchConn(st, nc, clock.Now)
	stage.SetReady(st, true)
	reg := prometheus.NewRegistry()
	stage.NewMetrics(reg, 60, st)
	h := stage.NewHandler(reg, st)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	// state says how every signal stands, in one line.
	state := func() string {
		hz, body := get("/healthz")
		rz, _ := get("/readyz")
		nats, _ := metrictest.Lookup(t, reg, "dedupe_component_healthy", map[string]string{"component": "nats"})
		return fmt.Sprintf("healthz %d readyz %d healthy %v nats %v connected %v reconnects %v: %s", hz, rz,
			gauge(t, reg, "dedupe_healthy"), nats, gauge(t, reg, "dedupe_nats_connected"), counter(t, reg, "dedupe_nats_reconnects_total", nil), strings.TrimSpace(body))
	}
	const up = "healthz 200 readyz 200 healthy 1 nats 1 connected 1"
	if s := state(); !strings.HasPrefix(s, up+" reconnects 0") {
		t.Fatalf("connected: %s", s)
	}

	srv.Shutdown()
	natstest.Poll(t, 10*time.Second, 10*time.Millisecond, "the connection to be lost", func() (bool, error) {
		s := state()
		return strings.HasPrefix(s, "healthz 200 readyz 200 healthy 1 nats 1 connected 0"), fmt.Errorf("%s", s)
	})
	clock.Advance(stage.DefaultNATSGrace * 3 / 4) // the client's reconnect wait here is 50ms: its grace is 1s
	if s := state(); !strings.HasPrefix(s, "healthz 503 readyz 503 healthy 0 nats 0 connected 0") || !strings.Contains(s, "nats: disconnected for") {
		t.Errorf("down for longer than the grace: %s", s)
	}

	srv = natstest.RunServerOn(t, dir, port)
	natstest.Poll(t, 30*time.Second, 10*time.Millisecond, "the connection to come back", func() (bool, error) {
		s := state()
		return strings.HasPrefix(s, up+" reconnects 1"), fmt.Errorf("%s", s)
	})
	_ = srv
}

// TestHealthNATSGrace checks the grace on the health's clock alone: the
// nats component holds for the grace of the connection's reconnect wait
// (1.5 times it, at least a second) and fails after it.
func TestHealthNATSGrace(t *testing.T) {
	srv := natstest.RunServer(t, "")
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1)) // the default reconnect wait, 2s
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	clock := window.NewManualClock(time.Unix(1_700_000_000, 0))
	st := &stage.Health{}
	stage.WatchConn(st, nc, clock.Now)
	srv.Shutdown()
	natstest.WaitFor(t, 10*time.Second, "the connection to be lost", func() bool { return !st.NATSConnected() })
	if stage.DefaultNATSGrace != 3*time.Second {
		t.Errorf("DefaultNATSGrace %v, want 3s: after the client's first two tries (at once, after 2s), before its third", stage.DefaultNATSGrace)
	}
	clock.Advance(stage.DefaultNATSGrace - time.Millisecond)
	if err := st.Healthy(); err != nil {
		t.Errorf("within the grace: %v", err)
	}
	clock.Advance(time.Millisecond)
	if err := st.Healthy(); err == nil || !strings.Contains(err.Error(), "nats: disconnected for 3s") {
		t.Errorf("at the grace: %v, want the nats component failing", err)
	}
	nc.Close()
	natstest.WaitFor(t, 10*time.Second, "the close to be seen", func() bool {
		err := st.Healthy()
		return err != nil && strings.Contains(err.Error(), "does not reconnect")
	})
}
