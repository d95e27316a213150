package stage

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
)

// maxAfterHops bounds how many earlier forwards of one key afterDuplicates
// walks past for one copy: each is a forward of the key, W apart by the
// input's clock, that the output's duplicate window still holds.
const maxAfterHops = 8

// afterDuplicates forwards again, with an id of their own, the batch's new
// forwards that the output dropped as duplicates of an earlier forward of
// their key whose window had ended when they came, by the input's clock
// (docs/state.md, "The input's clock"). The output's duplicate window runs
// on the servers' clock: a stage that judges a backlog after a stop
// forwards two copies W apart by the input seconds apart, and the filter
// may prove the second new without the store naming the first
// (LookupResult.Ended). A duplicate's PubAck names the message it
// duplicates; when that is an earlier window's forward of the same key,
// the copy is published again as AfterID of it, and so on along the key's
// forwards the output still holds. A duplicate of a forward of the same
// window (a copy forwarded before a crash) stays a duplicate: the key is
// forwarded already. It returns false when the batch is left unacked.
func (w *worker) afterDuplicates(ctx context.Context, batch []item) bool {
	for range maxAfterHops {
		var out []*nats.Msg
		var at []int // each re-forward's index in w.out
		for k, i := range w.newIdx {
			r := w.res[k]
			if r.Err != nil || !r.Duplicate {
				continue
			}
			prev, ok, err := w.endedForward(ctx, &batch[i], r.Seq)
			if err != nil {
				w.stopping(batch, err)
				return false
			}
			if !ok {
				continue
			}
			m := w.out[k]
			m.Header.Set(jetstream.MsgIDHeader, changelog.AfterID(w.base[k], prev))
			changelog.AnnotateAfter(m.Header, prev)
			w.s.metrics.ForwardsAfterWindow.Inc()
			out = append(out, m)
			at = append(at, k)
		}
		if len(out) == 0 {
			return true
		}
		res := make([]forward.Result, len(out))
		if !w.publish(ctx, batch, out, res) {
			return false
		}
		for j, k := range at {
			w.res[k] = res[j]
		}
	}
	return true
}

// endedForward reads the output message at seq, which the forward of it
// duplicated, and returns its first-seen time and true when it is a
// forward of it's key (and version) whose window had ended when it came:
// it then needs an id of its own. A message that is not such a forward
// (the same window's, or another producer's with that id) returns false.
func (w *worker) endedForward(ctx context.Context, it *item, seq uint64) (time.Time, bool, error) {
	s := w.s
	st, err := s.outputStream(ctx)
	if err != nil {
		return time.Time{}, false, err
	}
	raw, err := st.GetMsg(ctx, seq)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read the output message %d that forward of key %q duplicated: %w", seq, it.key, err)
	}
	rec, err := changelog.DecodeForward(raw.Header, raw.Data)
	if err != nil || string(rec.Key) != string(it.key) || rec.HasVersion != it.versioned || rec.Version != it.version {
		return time.Time{}, false, nil
	}
	if s.win.Inside(rec.FirstSeen, it.at) {
		return time.Time{}, false, nil
	}
	return rec.FirstSeen, true, nil
}
