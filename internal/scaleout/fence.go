package scaleout

import (
	"context"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
)

// fenceRefresh is how often an owner writes its fence again in an output
// stream that removes messages after maxAge: a quarter of it, so that the
// fence never ages out while its owner holds it (docs/scale-out.md §3.4);
// 0, never, without a max_age.
func fenceRefresh(maxAge time.Duration) time.Duration { return maxAge / 4 }

// refreshFence writes the tenure's fence again (changelog.Refresh) once its
// refresh interval has passed since it was written, or when written is
// zero (a new pin of the tenure), before the worker's
// next batch expects it. It returns false when the batch must be left
// unacked: the fence moved (the tenure ends, as in fenced) or ctx ended.
// A partition with no batch for longer than the output's max_age lets its
// fence age out; its next batch is then refused and, the instance still
// pinned, takes the fence again from its cursor.
func (o *Owner) refreshFence(ctx context.Context) bool {
	t := o.tenure
	g := o.g
	if t.written.IsZero() || t.refresh > 0 && time.Since(t.written) >= t.refresh {
		written := time.Now()
		seq, err := changelog.Refresh(ctx, o.g.js, g.outStream, t.fence.Subject, g.instance, t.fence.Seq)
		if err != nil {
			return o.refreshFailed(ctx, "output", err)
		}
		t.fence.Seq, t.written = seq, written
	}
	// The dead-letter fence, on the dead-letter stream's own max_age.
	if g.dlRefresh > 0 && t.dlFence.Subject != "" && time.Since(t.dlWritten) >= g.dlRefresh {
		written := time.Now()
		seq, err := changelog.Refresh(ctx, o.g.js, g.dlStream, t.dlFence.Subject, g.instance, t.dlFence.Seq)
		if err != nil {
			return o.refreshFailed(ctx, "dead_letter", err)
		}
		t.dlFence.Seq, t.dlWritten = seq, written
	}
	return true
}

// refreshFailed handles a failed refresh of the tenure's fence in stream
// (output or dead_letter) and returns false: the batch is left unacked.
// A fence that moved ends the tenure, as in fenced.
func (o *Owner) refreshFailed(ctx context.Context, stream string, err error) bool {
	switch {
	case retry.IsFenced(err):
		o.fenced(ctx, err)
	case ctx.Err() == nil:
		o.g.logs.Warn("fence_refresh_failed", "scale-out: refreshing the fence failed; the batch stays unacked and comes back", "partition", o.label, "stream", stream, "err", err)
	}
	return false
}
