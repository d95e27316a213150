package lograte_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/lograte"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
)

// clock is a settable clock for tests.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines returns the JSON lines written, decoded.
func (s *syncBuffer) lines(t testing.TB) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, ln := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if ln == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(ln), &m); err != nil {
			t.Fatalf("log line %q: %v", ln, err)
		}
		out = append(out, m)
	}
	return out
}

// newLimiter returns a limiter of 3 lines per 10 s on a test clock, the
// log it writes and its registry.
func newLimiter(t testing.TB) (*lograte.Limiter, *clock, *syncBuffer, *prometheus.Registry) {
	t.Helper()
	buf := &syncBuffer{}
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	reg := prometheus.NewRegistry()
	l := lograte.New(slog.New(slog.NewJSONHandler(buf, nil)), lograte.Options{Lines: 3, Interval: 10 * time.Second, Now: c.now}, reg)
	return l, c, buf, reg
}

func TestLimiterWritesLinesPerIntervalThenTheCount(t *testing.T) {
	l, c, buf, reg := newLimiter(t)
	for i := range 100 {
		l.Warn("mismatch", "fingerprint mismatch", "i", i)
	}
	if got := len(buf.lines(t)); got != 3 {
		t.Fatalf("lines after 100 calls in one interval = %d, want 3", got)
	}
	// Within the interval nothing more is written, even by Flush.
	c.advance(9 * time.Second)
	l.Warn("mismatch", "fingerprint mismatch", "i", 100)
	l.Flush(false)
	if got := len(buf.lines(t)); got != 3 {
		t.Fatalf("lines before the interval passed = %d, want 3", got)
	}
	// The next line after the interval carries the count.
	c.advance(time.Second)
	l.Warn("mismatch", "fingerprint mismatch", "i", 101)
	lines := buf.lines(t)
	if len(lines) != 4 {
		t.Fatalf("lines after the interval = %d, want 4", len(lines))
	}
	last := lines[3]
	if last["suppressed"] != float64(98) || last["i"] != float64(101) || last["level"] != "WARN" {
		t.Fatalf("line after the interval = %v, want i=101 suppressed=98 at WARN", last)
	}
	if got := metrictest.Sum(t, reg, "dedupe_log_events_total", map[string]string{"reason": "mismatch"}); got != 102 {
		t.Fatalf("dedupe_log_events_total = %v, want 102", got)
	}
	if got := metrictest.Sum(t, reg, "dedupe_log_lines_suppressed_total", map[string]string{"reason": "mismatch"}); got != 98 {
		t.Fatalf("dedupe_log_lines_suppressed_total = %v, want 98", got)
	}
}

func TestLimiterFlushWritesTheCountWhenNoLineComes(t *testing.T) {
	l, c, buf, _ := newLimiter(t)
	for range 10 {
		l.Error("refused", "dead letter refused")
	}
	c.advance(10 * time.Second)
	l.Flush(false)
	lines := buf.lines(t)
	if len(lines) != 4 {
		t.Fatalf("lines = %d, want 3 and the count", len(lines))
	}
	if got := lines[3]; got["suppressed"] != float64(7) || got["reason"] != "refused" || got["msg"] != "dead letter refused" || got["level"] != "ERROR" {
		t.Fatalf("count line = %v, want the message at ERROR with reason=refused suppressed=7", got)
	}
	// Reported once: the next line starts a fresh interval, no count.
	l.Flush(false)
	l.Error("refused", "dead letter refused")
	lines = buf.lines(t)
	if len(lines) != 5 || lines[4]["suppressed"] != nil {
		t.Fatalf("lines = %v, want one more line without a count", lines)
	}
}

func TestLimiterFlushAllAtShutdown(t *testing.T) {
	l, _, buf, _ := newLimiter(t)
	for range 5 {
		l.Info("a", "event a")
	}
	l.Info("b", "event b")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	cancel()
	<-done
	lines := buf.lines(t)
	if len(lines) != 5 {
		t.Fatalf("lines = %d, want 3 of a, 1 of b and a's count", len(lines))
	}
	if got := lines[4]; got["reason"] != "a" || got["suppressed"] != float64(2) {
		t.Fatalf("count line = %v, want reason=a suppressed=2", got)
	}
}

func TestLimiterReasonsAreIndependent(t *testing.T) {
	l, _, buf, _ := newLimiter(t)
	for range 10 {
		l.Warn("a", "event a")
		l.Warn("b", "event b")
	}
	if got := len(buf.lines(t)); got != 6 {
		t.Fatalf("lines = %d, want 3 per reason", got)
	}
}

func TestLimiterConcurrentCallsCountEveryEvent(t *testing.T) {
	l, c, buf, reg := newLimiter(t)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				l.Warn("x", "event x")
			}
		}()
	}
	wg.Wait()
	c.advance(10 * time.Second)
	l.Flush(false)
	lines := buf.lines(t)
	if len(lines) != 4 || lines[3]["suppressed"] != float64(8000-3) {
		t.Fatalf("lines = %v, want 3 and a count of 7997", lines)
	}
	if got := metrictest.Sum(t, reg, "dedupe_log_events_total", map[string]string{"reason": "x"}); got != 8000 {
		t.Fatalf("dedupe_log_events_total = %v, want 8000", got)
	}
}

func TestLimiterDisabledLevelOnlyCounts(t *testing.T) {
	buf := &syncBuffer{}
	reg := prometheus.NewRegistry()
	l := lograte.New(slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelWarn})), lograte.Options{}, reg)
	l.Info("quiet", "not written")
	if n := len(buf.lines(t)); n != 0 {
		t.Fatalf("lines = %d, want 0", n)
	}
	if got := metrictest.Sum(t, reg, "dedupe_log_events_total", map[string]string{"reason": "quiet"}); got != 1 {
		t.Fatalf("dedupe_log_events_total = %v, want 1", got)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    lograte.Options
		want string
	}{
		{"lines", lograte.Options{Lines: -1, Interval: time.Second}, "Options.Lines is -1"},
		{"interval", lograte.Options{Lines: 1, Interval: -time.Second}, "Options.Interval is -1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
	if err := lograte.DefaultOptions().Validate(); err != nil {
		t.Fatalf("DefaultOptions().Validate() = %v", err)
	}
}

func TestLimiterWithSharesTheLimit(t *testing.T) {
	l, c, buf, _ := newLimiter(t)
	r := l.With("component", "route")
	for range 5 {
		l.Warn("x", "event x")
		r.Warn("x", "event x")
	}
	lines := buf.lines(t)
	if len(lines) != 3 {
		t.Fatalf("lines = %d, want 3 for the shared reason", len(lines))
	}
	c.advance(10 * time.Second)
	l.Flush(false)
	lines = buf.lines(t)
	if got := lines[len(lines)-1]; got["component"] != "route" || got["suppressed"] != float64(7) {
		t.Fatalf("count line = %v, want component=route (the last suppressed line's logger) suppressed=7", got)
	}
}
