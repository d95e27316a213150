package stage

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Outcomes of judging one message, the values of the outcome label.
const (
	outcomeNew        = "new"
	outcomeRepeat     = "repeat"
	outcomeStale      = "stale" // key.version: a repeat whose version is not greater than the key's
	outcomeDeadLetter = "dead_letter"
)

// outcomes are every value of dedupe_messages_total's outcome label,
// exported at 0 from the start (outcomeDropped is the totals').
var outcomes = []string{outcomeNew, outcomeRepeat, outcomeStale, outcomeDeadLetter, outcomeDropped}

// RepeatAgeBuckets are the upper bounds of dedupe_repeat_age_seconds, in
// seconds: fixed, from a second to 30 days, so that the histograms of
// instances with different windows add up; dedupe_window_seconds is W.
var RepeatAgeBuckets = []float64{
	1, 2, 5, 10, 30, // seconds: client retries
	60, 120, 300, 600, 1800, // minutes
	3600, 2 * 3600, 6 * 3600, 12 * 3600, // hours: webhook retries
	86400, 2 * 86400, 3 * 86400, 7 * 86400, 14 * 86400, 30 * 86400, // days: replays
}

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
	// ForwardsAfterWindow counts forwards of a key whose earlier forward's
	// window had ended by the input's clock, published with an id of
	// their own (Dedupe-After), since the output's duplicate window may
	// still hold the earlier one.
	ForwardsAfterWindow prometheus.Counter
	PublishSeconds      prometheus.Histogram
	CommitSeconds       prometheus.Histogram
	BatchMessages       prometheus.Histogram
	PublishRetries      prometheus.Counter
	CommitRetries       prometheus.Counter
	ConsumerPending     *prometheus.GaugeVec
	WindowSeconds       prometheus.Gauge
	// StartRestored counts the forwards read back from the output stream
	// after the store's watermark at start whose keys the store did not
	// hold: forwards a crash left between publish and commit.
	StartRestored prometheus.Counter
	// StoreAhead counts, by partition, the times the store was found ahead
	// of the output stream (its cursor past the output's last sequence: the
	// output lost forwards it had acknowledged), at start or at a takeover;
	// StoreAheadDropped the records dropped then (storeAhead).
	StoreAhead, StoreAheadDropped *prometheus.CounterVec
	// Expired counts the records and totals removed once their window
	// ended on the input's clock (runExpiry), by kind: record, total.
	Expired *prometheus.CounterVec
	// DeadLettersUnstorable counts dead letters the dead-letter stream
	// refused even shrunk: the input was acked and stays in its stream.
	DeadLettersUnstorable *prometheus.CounterVec
}

// NewMetrics creates the stage's metrics and registers them on reg, with
// windowSeconds (W) as dedupe_window_seconds. The repeat ages go in
// RepeatAgeBuckets. dedupe_ready, dedupe_healthy, dedupe_component_healthy
// and the NATS connection's metrics are read from st at each scrape. Every
// reason of dedupe_dead_letters_total and dedupe_dead_letters_unstorable_total
// is exported at 0 from the start; ZeroPartitions does the same for
// dedupe_messages_total.
func NewMetrics(reg prometheus.Registerer, windowSeconds float64, st *Health) *Metrics {
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
			Help:    "Age of caught repeats by the input's clock: the time the input stream stored the copy minus the time it stored the key's first copy (with window.refresh_on_repeat, its window's last move). Fixed buckets from 1s to 30d; compare with dedupe_window_seconds.",
			Buckets: RepeatAgeBuckets,
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
		Expired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_expired_total",
			Help: "Records and totals removed from the state store once their window ended on the input's clock, by kind (record, total).",
		}, []string{"kind"}),
		ForwardsAfterWindow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dedupe_forwards_after_window_total",
			Help: "Forwards of a key whose earlier forward's window had ended by the input's clock, published with an id of their own (Dedupe-After) because the output's duplicate window may still hold the earlier one.",
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
			Help: "Keys the restore at start stored that the store did not hold (one instance): forwards a crash left between publish and commit, or the keys of a lost data dir.",
		}),
		WindowSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dedupe_window_seconds",
			Help: "The dedupe window W derived from the configured slow paths.",
		}),
	}
	m.StoreAhead, m.StoreAheadDropped = storeAheadCounters()
	reg.MustRegister(m.Messages, m.DeadLetters, m.UnpartitionedDeadLetters, m.RepeatAge, m.NearWindowEnd, m.FingerprintMismatch,
		m.RepublishDuplicates, m.ForwardsAfterWindow, m.Expired, m.PublishSeconds, m.CommitSeconds, m.BatchMessages, m.PublishRetries,
		m.CommitRetries, m.ConsumerPending, m.WindowSeconds, m.DeadLettersUnstorable, m.StartRestored,
		m.StoreAhead, m.StoreAheadDropped)
	registerHealth(reg, st)
	m.WindowSeconds.Set(windowSeconds)
	m.exportZeros()
	return m
}

// storeAheadCounters returns Metrics.StoreAhead and StoreAheadDropped.
func storeAheadCounters() (ahead, dropped *prometheus.CounterVec) {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_store_ahead_of_output_total",
			Help: "Times a partition's store was found ahead of the output stream, at start or at a takeover: the output lost forwards it had acknowledged (a server that lost unsynced writes, or a stream made again).",
		}, []string{"partition"}),
		prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_store_ahead_dropped_records_total",
			Help: "Records dropped from a store found ahead of the output stream: keys whose forwards the output lost, judged new when their copies come again.",
		}, []string{"partition"})
}

// exportZeros exports every expiry kind and dead-letter reason at 0.
func (m *Metrics) exportZeros() {
	for _, kind := range []string{"record", "total"} {
		m.Expired.WithLabelValues(kind)
	}
	for _, r := range deadletter.Reasons() {
		m.DeadLetters.WithLabelValues(string(r))
		m.DeadLettersUnstorable.WithLabelValues(string(r))
	}
}

// ZeroPartitions exports dedupe_messages_total at 0 for every outcome of
// each of partitions partitions, so that a rate over it never meets a
// missing series.
func (m *Metrics) ZeroPartitions(partitions int) {
	for p := range partitions {
		for _, o := range outcomes {
			m.Messages.WithLabelValues(strconv.Itoa(p), o)
		}
		m.StoreAhead.WithLabelValues(strconv.Itoa(p))
		m.StoreAheadDropped.WithLabelValues(strconv.Itoa(p))
	}
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
		Help: "1 while no component keeps failing (what /healthz answers 200 to); 0 while one is failing and being retried, or the NATS connection has been down for longer than its grace.",
	}, func() float64 { return gaugeOf(st.Healthy() == nil) })
	connected := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dedupe_nats_connected",
		Help: "1 while the stage's NATS connection is up, 0 from the moment it is lost until it reconnects (dedupe_healthy and /healthz allow it a few seconds first).",
	}, func() float64 { return gaugeOf(st.NATSConnected()) })
	reconnects := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "dedupe_nats_reconnects_total",
		Help: "Times the stage's NATS connection was lost and made again.",
	}, func() float64 { return float64(st.NATSReconnects()) })
	reg.MustRegister(ready, healthy, connected, reconnects, componentCollector{st: st})
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
	"1 while the component's operation works, 0 after it failed three times in a row (at once when the server answers that it cannot work) and until it succeeds again; nats: 0 while the connection has been down for longer than its grace. Components: publish, dead_letter, lookup, commit, totals_flush, nats, fetch.",
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
