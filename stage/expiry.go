package stage

import (
	"context"
	"time"

	"github.com/dedupe-stage/dedupe-stage/state"
)

// expiryInterval is how often runExpiry looks for records to remove: once
// per filter generation (W/G), the lag the filter forgets keys with, and
// between a second and an hour.
func expiryInterval(w time.Duration, generations int) time.Duration {
	return min(max(w/time.Duration(max(generations, 1)), time.Second), time.Hour)
}

// runExpiry removes, every expiryInterval until ctx is done, the records
// and totals of each partition this instance keeps (it judges it, or is
// one of its warm standbys) whose window ended
// before its expiry horizon (state.Partition.Expire): the newest input
// time the partition has judged, held back to the input time of the
// oldest message the servers may still hand it again (source.pendingFloors).
// Time moves only with the input: a stage with nothing to judge expires
// nothing, which costs disk and memory only, never a repeat
// (docs/state.md, "The input's clock").
func (s *Stage) runExpiry(ctx context.Context) {
	t := time.NewTicker(expiryInterval(s.win.W, s.cfg.Filter.Generations))
	defer t.Stop()
	done := make([]time.Time, s.store.Partitions()) // each partition's last horizon
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		floor, err := s.src.pendingFloors(rctx)
		cancel()
		if err != nil {
			s.logs.Warn("expiry_floor", "could not read what the servers still hold unacknowledged; nothing expires until they answer", "err", err)
			continue
		}
		for i := range done {
			if !s.src.keeps(i) {
				continue
			}
			p := s.store.Partition(i)
			h := expiryHorizon(p, floor)
			if h.IsZero() || !h.After(done[i]) {
				continue
			}
			st, err := p.Expire(ctx, h, 0)
			s.metrics.Expired.WithLabelValues("record").Add(float64(st.Records))
			s.metrics.Expired.WithLabelValues("total").Add(float64(st.Totals))
			if err != nil {
				if ctx.Err() == nil {
					s.logs.Warn("expiry_failed", "removing ended records failed; tried again next time", "partition", i, "err", err)
				}
				continue
			}
			done[i] = h
			s.log.Debug("expired ended records", "partition", i, "horizon", h, "scanned", st.Scanned, "records", st.Records, "totals", st.Totals)
		}
	}
}

// expiryHorizon is partition p's expiry horizon: its newest input time,
// or the input time of the oldest message the servers may hand it again
// when that is older (floor); zero while it has judged nothing.
func expiryHorizon(p *state.Partition, floor func(int) (time.Time, bool)) time.Time {
	h := p.Newest()
	if f, ok := floor(p.Index()); ok && f.Before(h) {
		h = f
	}
	return h
}
