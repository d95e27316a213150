package state

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// lineBuffer collects log lines; safe for the concurrent partitions.
type lineBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lineBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lineBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestNewDataDirLogsOnceAtInfo(t *testing.T) {
	dir := t.TempDir()
	var logs lineBuffer
	opts := testOptions(t, dir, 4)
	opts.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if strings.Contains(out, "level=WARN") {
		t.Errorf("a new data dir logs a warning:\n%s", out)
	}
	if n := strings.Count(out, "new partitions start with empty filters"); n != 1 || !strings.Contains(out, "new=4 partitions=4") {
		t.Errorf("want one INFO line saying the 4 new partitions start empty, got %d:\n%s", n, out)
	}
	if strings.Contains(out, `msg="state: filter ready"`) {
		t.Errorf("a new partition's empty filter is logged per partition at INFO:\n%s", out)
	}

	// Reopened, the filters come from their snapshots: one line each, no
	// "new" line.
	logs = lineBuffer{}
	s2 := openStore(t, opts)
	_ = s2
	out = logs.String()
	if strings.Contains(out, "new partitions") || strings.Count(out, `msg="state: filter ready"`) != 4 {
		t.Errorf("reopening logs:\n%s", out)
	}
}
