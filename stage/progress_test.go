package stage_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/stage"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestFilterRebuildProgress restarts a stage whose filter snapshots are
// gone, so every partition rebuilds its filter from the store: the rebuild
// logs its progress and dedupe_filter_rebuild_keys_scanned on the stage's
// registry counts every record read, per partition.
func TestFilterRebuildProgress(t *testing.T) {
	const n = 12_000
	e := newEnv(t)
	e.cfg.State.Partitions = 2 // more records per partition than a progress step reads
	r := e.start()
	evs := make([]event, n)
	for i := range evs {
		evs[i] = event{key: fmt.Sprintf("k%06d", i), payload: []byte("p")}
	}
	e.publish(evs)
	e.drained(60 * time.Second)
	r.stop(t)
	for i := range e.cfg.State.Partitions {
		if err := os.Remove(filepath.Join(state.PartitionDir(e.cfg.State.Dir(), i), state.SnapshotFile)); err != nil {
			t.Fatal(err)
		}
	}

	var logs logBuffer
	reg := prometheus.NewRegistry()
	st, err := stage.New(context.Background(), stage.Options{
		Config: e.cfg, Conn: e.nc, Registry: reg, Clock: e.clock,
		Logger:                 slog.New(slog.NewTextHandler(&logs, nil)),
		FilterProgressInterval: time.Nanosecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := gauge(t, reg, "dedupe_filter_rebuild_keys_scanned"); got != n {
		t.Errorf("dedupe_filter_rebuild_keys_scanned sums to %v over the partitions, want the %d records", got, n)
	}
	if n, err := testutil.GatherAndCount(reg, "dedupe_filter_rebuild_keys_scanned"); err != nil || n != e.cfg.State.Partitions {
		t.Errorf("dedupe_filter_rebuild_keys_scanned has %d series (%v), want one per partition (%d)", n, err, e.cfg.State.Partitions)
	}
	if !strings.Contains(logs.String(), "state: building filter") {
		t.Errorf("no progress logged during the rebuild:\n%s", logs.String())
	}
}
