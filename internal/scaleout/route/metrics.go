package route

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
)

// Outcomes of routing one input message, the values of the outcome label
// of dedupe_route_messages_total.
const (
	// OutcomeRouted: the routed stream stored the copy; the input is acked.
	OutcomeRouted = "routed"
	// OutcomeDuplicate: the routed stream already held the copy's id (the
	// input was routed before, by this or another instance, and its ack
	// was lost or late); the input is acked.
	OutcomeDuplicate = "duplicate"
	// OutcomeLocal: the input's partition is this instance's, and
	// Options.Local took it to be judged where it is, with no copy; the
	// partition's worker acks it.
	OutcomeLocal = "local"
	// OutcomeDeadLetter: the input was dead-lettered with a reason and
	// acked.
	OutcomeDeadLetter = "dead_letter"
	// OutcomeUnstorable: the dead-letter stream refused the dead letter
	// even without payload; the refusal is logged with the input's stream
	// and sequence, and the input is acked and stays in its stream.
	OutcomeUnstorable = "dead_letter_unstorable"
)

// Metrics are the route step's Prometheus metrics. Build them with
// NewMetrics on the registry the caller serves.
type Metrics struct {
	// Messages counts input messages routed, by outcome.
	Messages *prometheus.CounterVec
	// DeadLetters counts the route step's dead letters, by reason.
	DeadLetters *prometheus.CounterVec
	// Pending is the route consumer's backlog, by kind (pending,
	// ack_pending), read every few seconds.
	Pending *prometheus.GaugeVec
	// Copies is how many inputs each routed message carries: 1 for a
	// copy alone, more for a bundle (Options.BundleMax).
	Copies prometheus.Histogram
}

// NewMetrics creates the route step's metrics and registers them on reg.
// Registering twice on one registry panics (a programming error).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_route_messages_total",
			Help: "Input messages handled by the route step, by outcome (routed: stored in the routed stream; duplicate: the routed stream already held it; local: judged by this instance, which owns its partition, with no copy; dead_letter; dead_letter_unstorable: the dead letter was refused even without payload, see the logs).",
		}, []string{"outcome"}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_route_dead_letters_total",
			Help: "Input messages the route step dead-lettered, by reason.",
		}, []string{"reason"}),
		Pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dedupe_route_consumer_pending_messages",
			Help: "The route consumer's backlog, shared by every instance of the group: kind=pending (not yet routed) or ack_pending (delivered to a route step, not yet acked). Every instance reports the same consumer.",
		}, []string{"kind"}),
		Copies: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dedupe_route_copies_per_message",
			Help:    "Inputs each message the route step publishes carries: 1 for a copy alone, more for a bundle of one partition's copies (scale_out.route_bundle_max).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}),
	}
	reg.MustRegister(m.Messages, m.DeadLetters, m.Pending, m.Copies)
	// Every outcome and reason from the start, at 0: a rate over them
	// never meets a missing series.
	for _, o := range []string{OutcomeRouted, OutcomeDuplicate, OutcomeLocal, OutcomeDeadLetter, OutcomeUnstorable} {
		m.Messages.WithLabelValues(o)
	}
	for _, r := range deadletter.Reasons() {
		m.DeadLetters.WithLabelValues(string(r))
	}
	return m
}
