package stage_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/lograte"
)

// records is a slog.Handler that keeps every record written, for tests.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }

func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}

func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

// withMessage returns the records whose message is msg.
func (h *records) withMessage(msg string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.recs {
		if r.Message == msg {
			out = append(out, r)
		}
	}
	return out
}

// suppressedOf returns the record's lograte.SuppressedKey attribute, or 0.
func suppressedOf(r slog.Record) int64 {
	var n int64
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == lograte.SuppressedKey {
			n = a.Value.Int64()
			return false
		}
		return true
	})
	return n
}

// A producer that re-serialises on retry sends copies whose bodies differ
// from the first: with on_fingerprint_mismatch: repeat each is a repeat,
// counted, and its log line rate-limited, so 10k copies write a handful of
// lines, one of them with the count of the rest.
func TestFingerprintMismatchLogsAreRateLimited(t *testing.T) {
	const copies = 10_000
	const msg = "fingerprint mismatch treated as a repeat"
	e := newEnv(t)
	e.cfg.Pipeline.OnFingerprintMismatch = config.FingerprintRepeat
	logs := &records{}
	r := e.startWith(slog.New(logs))
	started := time.Now()

	e.publish([]event{{key: "order-1", payload: []byte(`{"id":"order-1","at":0}`)}})
	e.drained(30 * time.Second)
	evs := make([]event, copies)
	for i := range evs {
		evs[i] = event{key: "order-1", payload: fmt.Appendf(nil, `{"id":"order-1","at":%d}`, i+1)}
	}
	e.publish(evs)
	e.drained(2 * time.Minute)
	r.stop(t) // writes the counts still suppressed
	elapsed := time.Since(started)

	if got := counter(t, r.reg, "dedupe_fingerprint_mismatches_total", nil); got != copies {
		t.Errorf("dedupe_fingerprint_mismatches_total = %v, want %d", got, copies)
	}
	if got := counter(t, r.reg, "dedupe_log_events_total", map[string]string{"reason": "fingerprint_mismatch"}); got != copies {
		t.Errorf("dedupe_log_events_total{reason=fingerprint_mismatch} = %v, want %d", got, copies)
	}
	if got := counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "repeat"}); got != copies {
		t.Errorf("dedupe_messages_total{outcome=repeat} = %v, want %d", got, copies)
	}
	lines := logs.withMessage(msg)
	// Per interval: the lines allowed and one with the count; one more
	// interval for the one under way at the stop.
	intervals := int(elapsed/lograte.DefaultInterval) + 1
	limit := intervals * (lograte.DefaultLines + 1)
	var written, suppressed int64
	for _, l := range lines {
		written++
		suppressed += suppressedOf(l)
	}
	t.Logf("%d copies in %s: %d lines, %d suppressed", copies, elapsed.Round(time.Millisecond), written, suppressed)
	if len(lines) > limit {
		t.Errorf("%d lines %q for %d copies in %s, want at most %d", len(lines), msg, copies, elapsed, limit)
	}
	if suppressed == 0 {
		t.Errorf("no line %q carries the count suppressed", msg)
	}
	// Every copy is a line written or a line counted in a later one.
	// The count lines themselves are not copies.
	var countLines int64
	for _, l := range lines {
		if suppressedOf(l) > 0 && !hasAttr(l, "key") {
			countLines++
		}
	}
	if written-countLines+suppressed != copies {
		t.Errorf("lines %d - count lines %d + suppressed %d = %d, want %d copies", written, countLines, suppressed, written-countLines+suppressed, copies)
	}
}

// hasAttr reports whether the record has an attribute named key.
func hasAttr(r slog.Record, key string) bool {
	found := false
	r.Attrs(func(a slog.Attr) bool {
		found = a.Key == key
		return !found
	})
	return found
}
