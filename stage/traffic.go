package stage

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
)

// traffic reads, for Status, what the stage has judged from its metrics'
// counters (so that the admin service and /metrics tell the same counts),
// the backlog pollPending read last, and the NATS connection's state.
func (s *Stage) traffic() *admin.Traffic {
	m := s.metrics
	t := &admin.Traffic{At: s.clock.Now().UTC(), DeadLetters: map[string]uint64{},
		UnpartitionedDeadLetters: counterOf(m.UnpartitionedDeadLetters), NearWindowEnd: counterOf(m.NearWindowEnd)}
	b := s.lastBacklog.Load()
	if b != nil {
		t.Backlog = &b.total
	}
	for p := range s.store.Partitions() {
		label := strconv.Itoa(p)
		pt := admin.PartitionTraffic{Partition: p,
			New:        counterOf(m.Messages.WithLabelValues(label, outcomeNew)),
			Repeat:     counterOf(m.Messages.WithLabelValues(label, outcomeRepeat)),
			Stale:      counterOf(m.Messages.WithLabelValues(label, outcomeStale)),
			DeadLetter: counterOf(m.Messages.WithLabelValues(label, outcomeDeadLetter)),
			Dropped:    counterOf(m.Messages.WithLabelValues(label, outcomeDropped)),
		}
		if pb, ok := b.partition(p); ok {
			pt.Backlog = &pb
		}
		t.Partitions = append(t.Partitions, pt)
	}
	for _, r := range deadletter.Reasons() {
		if n := counterOf(m.DeadLetters.WithLabelValues(string(r))); n > 0 {
			t.DeadLetters[string(r)] = n
		}
	}
	var h dto.Metric
	if err := m.RepeatAge.Write(&h); err == nil && h.GetHistogram().GetSampleCount() > 0 {
		q := histogramQuantile(0.99, h.GetHistogram())
		t.RepeatAgeP99 = &q
	}
	if s.nc != nil {
		t.NATS = admin.NATSState{Connected: s.nc.IsConnected(), Server: s.nc.ConnectedUrlRedacted(), Reconnects: s.status.NATSReconnects()}
	}
	return t
}

// partition returns partition p's backlog, when the source read it apart.
func (b *inputBacklog) partition(p int) (admin.Backlog, bool) {
	if b == nil {
		return admin.Backlog{}, false
	}
	pb, ok := b.parts[p]
	return pb, ok
}

// counterOf reads a counter's value.
func counterOf(c prometheus.Metric) uint64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return uint64(m.GetCounter().GetValue())
}

// histogramQuantile is the q-quantile (0 < q < 1) of h, interpolated
// linearly inside the bucket that holds it, as PromQL's
// histogram_quantile does: the lowest bucket starts at 0, and a quantile
// past the highest finite bound is that bound. h has at least one sample.
func histogramQuantile(q float64, h *dto.Histogram) float64 {
	total := float64(h.GetSampleCount())
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range h.GetBucket() {
		upper, cum := b.GetUpperBound(), float64(b.GetCumulativeCount())
		if cum >= rank && cum > below {
			return lower + (upper-lower)*(rank-below)/(cum-below)
		}
		lower, below = upper, cum
	}
	return lower
}
