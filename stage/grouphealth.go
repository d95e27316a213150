package stage

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/lograte"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/status"
)

// groupHealthEvery is how often the group's health reader (the live
// instance whose name sorts first, scaleout.Group.ReadsHealth) reads the
// group's status for the gauges, give or take a quarter; every instance
// checks that often whether it is the reader. It is well below any
// hand-over time, which starts at input.ack_wait plus
// output.restart_margin.
const groupHealthEvery = 15 * time.Second

// groupHealthTimeout bounds one read: status.Read asks again while the
// cluster leaves a request unanswered, and a read that takes longer than
// this is counted as failed.
const groupHealthTimeout = 10 * time.Second

// groupHealth exports how the scale-out group stands as status.Read judges
// it, the judgement `dedupe-stage status` prints, so that an alert on the
// gauges fires exactly when status reports the group critical. One
// instance of the group reads and exports it (reads says which); the
// others export no health series at all, so that none shows a view it did
// not read. A failed read leaves the last values.
type groupHealth struct {
	cfg   config.Config
	js    jetstream.JetStream
	logs  *lograte.Limiter
	reads func() (reads, known bool)

	partitions  *prometheus.GaugeVec // by state
	longestWait *prometheus.GaugeVec // no labels but the group's: absent while not the reader
	readErrors  prometheus.Counter
}

// groupStates are the states a partition can be in, each exported even
// at zero so that an alert on one never sees it absent.
var groupStates = []string{status.StateOwned, status.StateIdle, status.StateWaiting, status.StateStalled}

// StatusTarget returns what status.Read reads for the stage or group cfg
// (validated) describes: the one place status's view of a configuration
// is filled, for `dedupe-stage status` and the group's health gauges.
func StatusTarget(cfg config.Config) status.Target {
	routed, _ := cfg.ScaleOutPartitioning().Routed()
	return status.Target{
		ScaleOut: cfg.ScaleOut.Enabled, InputStream: cfg.Input.Stream, Consumer: cfg.Input.Consumer,
		InputSubjects: cfg.Input.Subjects, FilterSubject: cfg.Input.FilterSubject,
		Group: cfg.ScaleOut.Group, Partitions: cfg.State.Partitions,
		Routed: routed, RoutedStream: cfg.ScaleOut.RoutedStream,
		OutputStream: cfg.Output.Stream, OutputPrefix: cfg.Output.SubjectPrefix,
		AckWait: cfg.Input.AckWait.D(), RestartMargin: cfg.Output.RestartMargin.D(),
	}
}

// newGroupHealth registers the group's health gauges on reg.
func newGroupHealth(reg prometheus.Registerer, cfg config.Config, js jetstream.JetStream, logs *lograte.Limiter, reads func() (bool, bool)) *groupHealth {
	group := prometheus.Labels{"group": cfg.ScaleOut.Group}
	h := &groupHealth{cfg: cfg, js: js, logs: logs, reads: reads,
		partitions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name:        "dedupe_group_health_partitions",
			Help:        "The group's partitions by state, as `dedupe-stage status` judges them: owned; idle (no owner, no input waits); waiting (no owner, input has waited no longer than the hand-over time); stalled (longer: nothing takes it on its own).",
			ConstLabels: group,
		}, []string{"state"}),
		longestWait: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name:        "dedupe_group_health_longest_wait_seconds",
			Help:        "The longest any partition's input has waited without an owner, 0 when none waits.",
			ConstLabels: group,
		}, nil),
		readErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dedupe_group_health_read_errors_total",
			Help: "Reads of the group's status that the cluster did not answer; the health gauges keep their last values meanwhile.",
		}),
	}
	reg.MustRegister(h.partitions, h.longestWait, h.readErrors)
	return h
}

// run reads the group's status every groupHealthEvery, with jitter, while
// this instance is the group's reader (at once when it is from the
// start), until ctx is done. While it is not, it exports no health series;
// before it knows, it waits a second at a time.
func (h *groupHealth) run(ctx context.Context) {
	for {
		wait := groupHealthEvery + rand.N(groupHealthEvery/2) - groupHealthEvery/4
		switch reads, known := h.reads(); {
		case !known:
			wait = time.Second
		case reads:
			h.read(ctx)
		default:
			h.partitions.Reset()
			h.longestWait.Reset()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// read reads the group's status once and sets the gauges from it.
func (h *groupHealth) read(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, groupHealthTimeout)
	defer cancel()
	r, err := status.Read(rctx, h.js, StatusTarget(h.cfg), time.Now())
	if err != nil {
		if ctx.Err() == nil {
			h.readErrors.Inc()
			h.logs.Warn("group_health_read", "scale-out: reading the group's status failed; its health gauges keep their last values", "err", err)
		}
		return
	}
	counts := map[string]int{}
	var longest time.Duration
	for _, p := range r.Partitions {
		counts[p.State]++
		if p.Waiting != nil {
			longest = max(longest, time.Duration(p.Waiting.For))
		}
	}
	for _, s := range groupStates {
		h.partitions.WithLabelValues(s).Set(float64(counts[s]))
	}
	h.longestWait.WithLabelValues().Set(longest.Seconds())
}
