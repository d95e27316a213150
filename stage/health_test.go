package stage_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/stage"
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
