package stage

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/state"
)

// Outcomes of judging one message, the values of the outcome label.
const (
	outcomeNew        = "new"
	outcomeRepeat     = "repeat"
	outcomeStale      = "stale" // key.version: a repeat whose version is not greater than the key's
	outcomeDeadLetter = "dead_letter"
)

// Metrics are the stage's Prometheus metrics, all prefixed dedupe_. Build
// them with NewMetrics on the registry the caller serves.
type Metrics struct {
	Messages    *prometheus.CounterVec
	DeadLetters *prometheus.CounterVec
	// UnpartitionedDeadLetters counts inputs dead-lettered before they
	// reached a partition; Messages counts the rest.
	UnpartitionedDeadLetters prometheus.Counter
	RepeatAge                prometheus.Histogram
	NearWindowEnd            prometheus.Counter
	FingerprintMismatch      prometheus.Counter
	RepublishDuplicates      prometheus.Counter
	PublishSeconds           prometheus.Histogram
	CommitSeconds            prometheus.Histogram
	BatchMessages            prometheus.Histogram
	PublishRetries           prometheus.Counter
	CommitRetries            prometheus.Counter
	ConsumerPending          *prometheus.GaugeVec
	WindowSeconds            prometheus.Gauge
	// StartRestored counts the forwards read back from the output stream
	// after the store's watermark at start whose keys the store did not
	// hold: forwards a crash left between publish and commit.
	StartRestored prometheus.Counter
	// DeadLettersUnstorable counts dead letters the dead-letter stream
	// refused even shrunk: the input was acked and stays in its stream.
	DeadLettersUnstorable *prometheus.CounterVec
}

// NewMetrics creates the stage's metrics and registers them on reg. The
// repeat-age buckets run from one second to past the window w (seconds).
// dedupe_ready, dedupe_healthy and dedupe_component_healthy are read from
// st at each scrape.
func NewMetrics(reg prometheus.Registerer, windowSeconds float64, st *Health) *Metrics {
	ageBuckets := prometheus.ExponentialBucketsRange(1, max(2, windowSeconds*1.25), 16)
	m := &Metrics{
		Messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_messages_total",
			Help: "Input messages judged in a partition, by partition and outcome (new: forwarded; repeat: recognised and acked; dead_letter: sent to the dead-letter subject; dropped: a late event dropped by the totals). Inputs dead-lettered before they reach a partition are counted in dedupe_unpartitioned_dead_letters_total.",
		}, []string{"partition", "outcome"}),
		UnpartitionedDeadLetters: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dedupe_unpartitioned_dead_letters_total",
			Help: "Input messages dead-lettered before they reached a partition (no usable key or group, oversized, max_deliver, not_routed); dedupe_dead_letters_total has their reasons.",
		}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_dead_letters_total",
			Help: "Messages dead-lettered, by reason.",
		}, []string{"reason"}),
		RepeatAge: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dedupe_repeat_age_seconds",
			Help:    "Age of caught repeats: now minus the key's first-seen time.",
			Buckets: ageBuckets,
		}),
		NearWindowEnd: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dedupe_repeats_near_window_end_total",
			Help: "Repeats caught past window.near_fraction of the window; they predict repeats that arrive after it.",
		}),
		FingerprintMismatch: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dedupe_fingerprint_mismatches_total",
			Help: "Repeats whose payload fingerprint differs from the recorded one: a key reused for a different operation.",
		}),
		RepublishDuplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dedupe_republish_duplicates_total",
			Help: "Forwards the output stream reported as duplicates of an id it already held: re-publishes after a crash between publish and commit.",
		}),
		PublishSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dedupe_publish_seconds",
			Help:    "Time to publish a batch's new messages to the output and receive every PubAck.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}),
		CommitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dedupe_commit_seconds",
			Help:    "Time to commit a batch's claims to the state store.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}),
		BatchMessages: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dedupe_batch_messages",
			Help:    "Messages per partition batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}),
		PublishRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dedupe_publish_retries_total",
			Help: "Output publishes retried after an error.",
		}),
		CommitRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dedupe_commit_retries_total",
			Help: "State commits retried after an error.",
		}),
		ConsumerPending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dedupe_consumer_pending_messages",
			Help: "Input consumer backlog: kind=pending (not yet delivered) or ack_pending (delivered, not yet acked). In a scale-out group, the sum over the partitions this instance owns.",
		}, []string{"kind"}),
		DeadLettersUnstorable: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_dead_letters_unstorable_total",
			Help: "Dead letters the dead-letter stream refused even without payload, by reason: logged with the input's stream and sequence, acked, and kept in the input stream.",
		}, []string{"reason"}),
		StartRestored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dedupe_start_restored_records_total",
			Help: "Forwards read back from the output stream after the store's watermark at start whose keys the store did not hold, stored (one instance alone): forwards a crash left between publish and commit.",
		}),
		WindowSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dedupe_window_seconds",
			Help: "The dedupe window W derived from the configured slow paths.",
		}),
	}
	reg.MustRegister(m.Messages, m.DeadLetters, m.UnpartitionedDeadLetters, m.RepeatAge, m.NearWindowEnd, m.FingerprintMismatch,
		m.RepublishDuplicates, m.PublishSeconds, m.CommitSeconds, m.BatchMessages, m.PublishRetries,
		m.CommitRetries, m.ConsumerPending, m.WindowSeconds, m.DeadLettersUnstorable, m.StartRestored)
	registerHealth(reg, st)
	m.WindowSeconds.Set(windowSeconds)
	return m
}

// registerHealth registers the gauges and collector that read st: ready,
// healthy and each component's health.
func registerHealth(reg prometheus.Registerer, st *Health) {
	ready := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dedupe_ready",
		Help: "1 when every partition's filter is ready and the stage is judging messages.",
	}, func() float64 { return gaugeOf(st.Ready()) })
	healthy := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dedupe_healthy",
		Help: "1 while no component keeps failing (what /healthz answers 200 to); 0 while one is failing and being retried.",
	}, func() float64 { return gaugeOf(st.Healthy() == nil) })
	reg.MustRegister(ready, healthy, componentCollector{st: st})
}

// gaugeOf is a gauge's value for b: 1 when true, 0 when false.
func gaugeOf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// componentHealthy describes dedupe_component_healthy.
var componentHealthy = prometheus.NewDesc("dedupe_component_healthy",
	"1 while the component's operation works, 0 after it failed three times in a row and until it succeeds again. Components: publish, dead_letter, lookup, commit, totals_flush.",
	[]string{"component"}, nil)

// componentCollector exports each component's health from the Health.
type componentCollector struct{ st *Health }

// Describe implements prometheus.Collector.
func (c componentCollector) Describe(ch chan<- *prometheus.Desc) { ch <- componentHealthy }

// Collect implements prometheus.Collector.
func (c componentCollector) Collect(ch chan<- prometheus.Metric) {
	for comp, ok := range c.st.Components() {
		ch <- prometheus.MustNewConstMetric(componentHealthy, prometheus.GaugeValue, gaugeOf(ok), comp)
	}
}

// storeCollector exports the state store's per-partition counters.
type storeCollector struct {
	store *state.Store

	lookups, filterAnswers, storeReads, falsePositives, claims *prometheus.Desc
	filterBytes, filterKeys, estFP                             *prometheus.Desc
}

// NewStoreCollector returns a collector for the store's filter and read
// counters, read from the store at each scrape.
func NewStoreCollector(s *state.Store) prometheus.Collector {
	p := []string{"partition"}
	return &storeCollector{
		store:          s,
		lookups:        prometheus.NewDesc("dedupe_lookups_total", "Key lookups (pre-check, then the store where the filter says maybe).", p, nil),
		filterAnswers:  prometheus.NewDesc("dedupe_filter_answers_total", "Bloom pre-check answers: negative (definitely new, store skipped) or positive (maybe seen, store read).", []string{"partition", "answer"}, nil),
		storeReads:     prometheus.NewDesc("dedupe_store_reads_total", "Reads of the Badger state store.", p, nil),
		falsePositives: prometheus.NewDesc("dedupe_filter_false_positives_total", "Pre-check positives the store answered with no unexpired record: each cost one read, never an event.", p, nil),
		claims:         prometheus.NewDesc("dedupe_claims_total", "Keys claimed in the store, by result (new or existing).", []string{"partition", "result"}, nil),
		filterBytes:    prometheus.NewDesc("dedupe_filter_bytes", "Memory held by the partition's Bloom filter generations.", p, nil),
		filterKeys:     prometheus.NewDesc("dedupe_filter_keys", "Keys in the partition filter's live generations.", p, nil),
		estFP:          prometheus.NewDesc("dedupe_filter_estimated_false_positive_ratio", "False-positive ratio of the partition's filter now, estimated from its fill; the observed ratio is computed from dedupe_filter_false_positives_total and dedupe_filter_answers_total (docs/metrics.md).", p, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.lookups, c.filterAnswers, c.storeReads, c.falsePositives, c.claims, c.filterBytes, c.filterKeys, c.estFP} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	for i := 0; i < c.store.Partitions(); i++ {
		st := c.store.Partition(i).Stats()
		p := strconv.Itoa(i)
		ch <- prometheus.MustNewConstMetric(c.lookups, prometheus.CounterValue, float64(st.Lookups), p)
		ch <- prometheus.MustNewConstMetric(c.filterAnswers, prometheus.CounterValue, float64(st.FilterNegatives), p, "negative")
		ch <- prometheus.MustNewConstMetric(c.filterAnswers, prometheus.CounterValue, float64(st.FilterPositives), p, "positive")
		ch <- prometheus.MustNewConstMetric(c.storeReads, prometheus.CounterValue, float64(st.StoreReads), p)
		ch <- prometheus.MustNewConstMetric(c.falsePositives, prometheus.CounterValue, float64(st.FalsePositives), p)
		ch <- prometheus.MustNewConstMetric(c.claims, prometheus.CounterValue, float64(st.ClaimsNew), p, "new")
		ch <- prometheus.MustNewConstMetric(c.claims, prometheus.CounterValue, float64(st.Claims-st.ClaimsNew), p, "existing")
		ch <- prometheus.MustNewConstMetric(c.filterBytes, prometheus.GaugeValue, float64(st.FilterBytes), p)
		ch <- prometheus.MustNewConstMetric(c.filterKeys, prometheus.GaugeValue, float64(st.FilterKeys), p)
		ch <- prometheus.MustNewConstMetric(c.estFP, prometheus.GaugeValue, st.FilterEstimatedFP, p)
	}
}
