package stage

import (
	"context"

	"github.com/dedupe-stage/dedupe-stage/internal/scaleout"
)

// SetBeforePublishHook installs a hook that runs before a partition batch
// publishes its new messages. For tests only.
func (s *Stage) SetBeforePublishHook(f func(partition int, batchLen int)) { s.beforePublish = f }

// SetReady marks st ready or not. For tests only.
func SetReady(st *Health, r bool) { st.setReady(r) }

// SetPinCheckFault makes the stage's pin checks fail for partition p with
// f(p) when that is not nil, until the returned restore runs.
func SetPinCheckFault(f func(p int) error) (restore func()) {
	return scaleout.SetPinCheckFault(f)
}

// WriteSnapshots writes a snapshot of every partition the stage owns now,
// as each scale_out.snapshot_interval does, and returns how many it owns.
// For tests only.
func (s *Stage) WriteSnapshots(ctx context.Context) (int, error) {
	return s.src.(*groupSource).group.WriteSnapshots(ctx, s.store)
}

// ReleasePartition has the stage's balance release partition p at once,
// as it does for an instance owning more than its quota. For tests only.
func (s *Stage) ReleasePartition(p int) { s.src.(*groupSource).group.Release(p) }
