package stage

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/scaleout"
)

// SetBeforePublishHook installs a hook that runs before a partition batch
// publishes its new messages. For tests only.
func (s *Stage) SetBeforePublishHook(f func(partition int, batchLen int)) { s.beforePublish = f }

// SetInputTimeHook has the stage judge each message at f(msg, stored)
// instead of stored, the time the input stream stored it, so that a test
// can give messages input times without waiting for them, after New
// (Options.InputTime sets it before). For tests only.
func (s *Stage) SetInputTimeHook(f func(msg jetstream.Msg, stored time.Time) time.Time) {
	s.inputTimeHook = f
}

// SetReady marks st ready or not. For tests only.
func SetReady(st *Health, r bool) { st.setReady(r) }

// WatchConn has st follow nc as New does, telling the time with now (nil:
// time.Now). For tests only.
func WatchConn(st *Health, nc *nats.Conn, now func() time.Time) {
	st.now = now
	st.watchConn(nc)
}

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
