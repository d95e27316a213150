package state

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer safe for concurrent writes, for logs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestFilterRebuildReportsProgress rebuilds a filter from a full scan of
// 20k records with a progress interval short enough that every look at the
// clock reports: the build logs its progress while it runs and
// OnFilterProgress sees rising counts, an estimate of the records to read,
// and a last report with the final counts.
func TestFilterRebuildReportsProgress(t *testing.T) {
	const n = 20_000
	dir := t.TempDir()
	opts := testOptions(t, dir, 1)
	s, err := Open(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	claimAll(t, s, testKeys("progress", n))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(PartitionDir(dir, 0), SnapshotFile)); err != nil {
		t.Fatal(err)
	}

	var logs lockedBuffer
	var mu sync.Mutex
	var reports []FilterProgress
	opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	opts.FilterProgressInterval = time.Nanosecond
	opts.OnFilterProgress = func(fp FilterProgress) {
		mu.Lock()
		defer mu.Unlock()
		reports = append(reports, fp)
	}
	openStore(t, opts)

	mu.Lock()
	defer mu.Unlock()
	if len(reports) < 2 {
		t.Fatalf("%d progress reports for a scan of %d records, want several: %+v", len(reports), n, reports)
	}
	last := reports[len(reports)-1]
	if !last.Done || last.Scanned != n || last.Added != n || last.Source != SourceRebuild {
		t.Errorf("last report %+v, want Done with %d scanned and added by a rebuild", last, n)
	}
	for i, fp := range reports[:len(reports)-1] {
		if fp.Done || fp.Source != SourceRebuild || fp.Scanned == 0 || fp.Scanned >= n {
			t.Errorf("report %d: %+v, want a rebuild under way", i, fp)
		}
		if i > 0 && fp.Scanned <= reports[i-1].Scanned {
			t.Errorf("report %d scanned %d after %d", i, fp.Scanned, reports[i-1].Scanned)
		}
		if fp.EstimatedRecords < n {
			t.Errorf("report %d estimates %d records, want at least the %d in the store's tables", i, fp.EstimatedRecords, n)
		}
	}
	lines := 0
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "state: building filter") {
			lines++
			for _, want := range []string{"source=rebuild", "scanned=", "rate_per_second=", "estimated_records="} {
				if !strings.Contains(l, want) {
					t.Errorf("progress line without %q: %s", want, l)
				}
			}
		}
	}
	if lines != len(reports)-1 {
		t.Errorf("%d progress lines logged, want one per report before the last (%d):\n%s", lines, len(reports)-1, logs.String())
	}
}

func TestFilterProgressRemaining(t *testing.T) {
	fp := FilterProgress{Scanned: 100, EstimatedRecords: 1100, Elapsed: 10 * time.Second}
	if fp.Rate() != 10 || fp.Remaining() != 100*time.Second {
		t.Errorf("rate %v, remaining %v; want 10/s and 1m40s", fp.Rate(), fp.Remaining())
	}
	for _, fp := range []FilterProgress{
		{Scanned: 100, Elapsed: 10 * time.Second},                        // no estimate
		{Scanned: 200, EstimatedRecords: 100, Elapsed: 10 * time.Second}, // past the estimate
		{Scanned: 0, EstimatedRecords: 100},                              // no time yet
		{Scanned: 100, EstimatedRecords: 1100, Elapsed: time.Second, Done: true},
	} {
		if fp.Remaining() != 0 {
			t.Errorf("%+v: remaining %v, want 0 (unknown)", fp, fp.Remaining())
		}
	}
}

// TestOpenReportsStoreProgress rebuilds the filters of three partitions
// with a progress interval short enough that every partition's end is
// reported: Open logs the store's progress as partitions finish, up to
// every record of the store, and the caller's OnFilterProgress still sees
// every partition's last report.
func TestOpenReportsStoreProgress(t *testing.T) {
	const n, parts = 6_000, 3
	dir := t.TempDir()
	opts := testOptions(t, dir, parts)
	s, err := Open(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	claimAll(t, s, testKeys("store-progress", n))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range parts {
		if err := os.Remove(filepath.Join(PartitionDir(dir, i), SnapshotFile)); err != nil {
			t.Fatal(err)
		}
	}

	var logs lockedBuffer
	var mu sync.Mutex
	doneReports := 0
	opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	opts.FilterProgressInterval = time.Nanosecond
	opts.OnFilterProgress = func(fp FilterProgress) {
		mu.Lock()
		defer mu.Unlock()
		if fp.Done {
			doneReports++
		}
	}
	openStore(t, opts)

	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "state: opening partitions") {
			lines = append(lines, l)
		}
	}
	if len(lines) != parts {
		t.Fatalf("%d store progress lines, want one per partition (%d):\n%s", len(lines), parts, logs.String())
	}
	for i, l := range lines {
		for _, want := range []string{fmt.Sprintf("filters_built=%d ", i+1), fmt.Sprintf("partitions=%d ", parts), "records_scanned=", "rate_per_second="} {
			if !strings.Contains(l, want) {
				t.Errorf("store progress line %d without %q: %s", i, want, l)
			}
		}
	}
	if want := fmt.Sprintf("records_scanned=%d ", n); !strings.Contains(lines[parts-1], want) {
		t.Errorf("last store progress line without %q: %s", want, lines[parts-1])
	}
	mu.Lock()
	defer mu.Unlock()
	if doneReports != parts {
		t.Errorf("OnFilterProgress saw %d last reports, want %d", doneReports, parts)
	}
}
