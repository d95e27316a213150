package faults

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// logRecord is one JSON log line of the stage.
type logRecord map[string]any

// logRecords returns the JSON log lines of log whose msg is msg.
func logRecords(log, msg string) []logRecord {
	var out []logRecord
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		var r logRecord
		if json.Unmarshal([]byte(line), &r) == nil && r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// partitionRecord returns the record of partition p among rs, or nil.
func partitionRecord(rs []logRecord, p int) logRecord {
	for _, r := range rs {
		if n, ok := r["partition"].(float64); ok && int(n) == p {
			return r
		}
	}
	return nil
}

// stopClean stops the stage with SIGTERM and fails unless it exits 0 after
// saying it stopped cleanly (having written its filter snapshots).
func stopClean(tb testing.TB, p *process) {
	tb.Helper()
	p.signal(tb, syscall.SIGTERM, 30*time.Second)
	if p.Err() != nil || !strings.Contains(p.Log(), `"msg":"stopped cleanly"`) {
		tb.Fatalf("stage did not stop cleanly: %v\n%s", p.Err(), crashReport(p.Log()))
	}
}

// TestFilterSnapshotCorruptOrMissing damages every partition's filter
// snapshot between two runs, one way per subtest (removed, a byte flipped,
// truncated, emptied, garbage, another partition's intact snapshot, a
// stale one of this partition), and checks that the stage
// says in its log that it rebuilds the filter from the store (or, for a
// stale snapshot, tops it up), and that republishing every good input then
// forwards nothing: each is judged a repeat by the stage itself, not
// dropped by the output stream's duplicate window.
func TestFilterSnapshotCorruptOrMissing(t *testing.T) {
	t.Parallel()
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 5))
	srv := startNATSUnsynced(t)
	cfg := defaultStageConfig(t, srv.URL())
	// Every run ends with a clean stop, so nothing waits on a redelivery;
	// a 10s AckWait keeps a slow ack on a loaded machine from being
	// redelivered and judged twice, which the count of repeats would see.
	cfg.AckWait = 10 * time.Second
	js := publisherJS(t, srv.URL())
	s := newStage(t, cfg)
	w := newWorkload(seed, "snap", cfg.MaxMessageBytes)

	// Two runs, so that the snapshots of the first are stale after the second.
	p := s.startReady()
	events := w.mix(3000, 0.2, 0.02, 0)
	mustPublish(t, js, events, "first")
	waitDrained(t, js, 60*time.Second)
	stopClean(t, p)
	stale := make([][]byte, cfg.Partitions)
	for i := range stale {
		b, err := os.ReadFile(snapshotPath(cfg, i))
		if err != nil {
			t.Fatalf("no snapshot after a clean stop: %v", err)
		}
		stale[i] = b
	}
	p = s.startReady()
	more := w.mix(1000, 0.2, 0.02, 0)
	mustPublish(t, js, more, "second")
	waitDrained(t, js, 60*time.Second)
	stopClean(t, p)
	events = append(events, more...)
	var good []event
	for _, e := range events {
		if e.bad == "" {
			good = append(good, e)
		}
	}
	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)
	forwarded := streamMsgs(js, outputStream)
	current := make([][]byte, cfg.Partitions)

	rewrite := func(f func(b []byte) []byte) func(t *testing.T, path string, _ int) {
		return func(t *testing.T, path string, _ int) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, f(b), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, c := range []struct {
		name    string
		damage  func(t *testing.T, path string, partition int)
		source  string   // how the filter must be built
		wantErr []string // one of them in the log's reason for the rebuild
	}{
		{"removed", func(t *testing.T, path string, _ int) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, "rebuild", []string{"no such file or directory"}},
		{"one byte flipped", rewrite(func(b []byte) []byte { b[len(b)/2] ^= 0x10; return b }), "rebuild", []string{"checksum"}},
		{"truncated", rewrite(func(b []byte) []byte { return b[:len(b)/2] }), "rebuild", []string{"truncated"}},
		{"empty", rewrite(func([]byte) []byte { return nil }), "rebuild", []string{"truncated"}},
		{"garbage", rewrite(func(b []byte) []byte {
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			return b
		}), "rebuild", []string{"not a filter snapshot"}},
		{"another partition's", func(t *testing.T, path string, p int) {
			// Intact, so its checksum passes; covering a version the store
			// has reached or, for some partitions, one it has not.
			if p == 0 {
				for q := range cfg.Partitions {
					b, err := os.ReadFile(snapshotPath(cfg, q))
					if err != nil {
						t.Fatal(err)
					}
					current[q] = b
				}
			}
			if err := os.WriteFile(path, current[(p+1)%cfg.Partitions], 0o644); err != nil {
				t.Fatal(err)
			}
		}, "rebuild", []string{"not this partition's", "but the store ends at version"}},
		{"stale", func(t *testing.T, path string, p int) {
			if err := os.WriteFile(path, stale[p], 0o644); err != nil {
				t.Fatal(err)
			}
		}, "snapshot+topup", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			for part := range cfg.Partitions {
				c.damage(t, snapshotPath(cfg, part), part)
			}
			p := s.startReady()
			log := p.Log()
			rebuilding := logRecords(log, "state: filter snapshot unusable, rebuilding the filter from the store")
			ready := logRecords(log, "state: filter ready")
			for part := range cfg.Partitions {
				r := partitionRecord(ready, part)
				if r == nil {
					t.Errorf("partition %d: no %q line", part, "state: filter ready")
					continue
				}
				if r["source"] != c.source {
					t.Errorf("partition %d: filter built from %v, want %s", part, r["source"], c.source)
				}
				if n, _ := r["scanned"].(float64); n == 0 {
					t.Errorf("partition %d: the filter build scanned no records", part)
				}
				rb := partitionRecord(rebuilding, part)
				switch {
				case c.source != "rebuild" && rb != nil:
					t.Errorf("partition %d: rebuilt the filter (%v), want the snapshot topped up", part, rb["err"])
				case c.source == "rebuild" && rb == nil:
					t.Errorf("partition %d: the log does not say the filter is rebuilt from the store", part)
				case c.source == "rebuild":
					e, _ := rb["err"].(string)
					ok := false
					for _, w := range c.wantErr {
						ok = ok || strings.Contains(e, w)
					}
					if !ok || rb["path"] != snapshotPath(cfg, part) {
						t.Errorf("partition %d: rebuild reason %q for %v, want one of %q for %s", part, e, rb["path"], c.wantErr, snapshotPath(cfg, part))
					}
				}
			}

			mustPublish(t, js, good, fmt.Sprintf("again-%d", i))
			waitDrained(t, js, 60*time.Second)
			if n := s.metric("dedupe_messages_total", "outcome", "new"); n != 0 {
				t.Errorf("%v republished inputs judged new, want 0", n)
			}
			if n := s.metric("dedupe_messages_total", "outcome", "repeat"); int(n) != len(good) {
				t.Errorf("%v republished inputs judged repeats, want %d", n, len(good))
			}
			if n := s.metric("dedupe_republish_duplicates_total"); n != 0 {
				t.Errorf("%v forwards dropped by the output's duplicate window, want 0", n)
			}
			if n := streamMsgs(js, outputStream); n != forwarded {
				t.Errorf("output holds %d messages, want still %d", n, forwarded)
			}
			stopClean(t, p)
		})
	}
	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)
}
