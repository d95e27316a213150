package sink

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds the sink metrics. Build it with NewMetrics and attach it to
// sinks with Instrument; one Metrics serves any number of sinks, which are
// told apart by the "sink" label (Sink.Name). It is safe for concurrent use.
type Metrics struct {
	writes  *prometheus.CounterVec
	retries *prometheus.CounterVec
	errors  *prometheus.CounterVec
	seconds *prometheus.HistogramVec
}

// NewMetrics creates the sink metrics (docs/metrics.md) and registers them
// with reg, nothing when reg is nil. It panics if they are already
// registered with reg, like prometheus.MustRegister.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_sink_writes_total",
			Help: "Totals given to a sink, by result: applied (raised the stored value), stale (already held the same or more).",
		}, []string{"sink", "result"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_sink_write_retries_total",
			Help: "Extra write attempts a sink made because another writer changed the same totals at the same time (compare-and-set conflicts, deadlocks, serialization failures); not a count of totals.",
		}, []string{"sink"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_sink_write_errors_total",
			Help: "Sink Write calls that returned an error.",
		}, []string{"sink"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dedupe_sink_write_seconds",
			Help:    "Duration of sink Write calls.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"sink"}),
	}
	if reg != nil {
		reg.MustRegister(m.writes, m.retries, m.errors, m.seconds)
	}
	return m
}

// Instrument returns a Sink that behaves like s and records every Write in
// m: its Result (also when the Write failed), whether it failed, and how long
// it took. A nil m returns s unchanged.
func Instrument(s Sink, m *Metrics) Sink {
	if m == nil {
		return s
	}
	name := s.Name()
	return &instrumented{
		Sink:    s,
		applied: m.writes.WithLabelValues(name, "applied"),
		stale:   m.writes.WithLabelValues(name, "stale"),
		retried: m.retries.WithLabelValues(name),
		errors:  m.errors.WithLabelValues(name),
		seconds: m.seconds.WithLabelValues(name),
	}
}

// instrumented is a Sink that records its Writes; see Instrument.
type instrumented struct {
	Sink
	applied, stale, retried, errors prometheus.Counter
	seconds                         prometheus.Observer
}

// Write calls the wrapped sink's Write and records it.
func (s *instrumented) Write(ctx context.Context, totals []Total) (Result, error) {
	start := time.Now()
	res, err := s.Sink.Write(ctx, totals)
	s.seconds.Observe(time.Since(start).Seconds())
	s.applied.Add(float64(res.Applied))
	s.stale.Add(float64(res.Stale))
	s.retried.Add(float64(res.Retried))
	if err != nil {
		s.errors.Inc()
	}
	return res, err
}
