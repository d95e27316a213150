package stage

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/sink"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// outcomeDropped is the outcome of a late event dropped by
// totals.late_events "drop".
const outcomeDropped = "dropped"

// flushChunk is the most totals given to one sink Write.
const flushChunk = 1000

// totals aggregates new events per (group, bucket) and flushes the
// absolute totals to the sinks. Built by newTotals when totals are on.
type totals struct {
	s      *Stage
	cfg    config.Totals
	bucket time.Duration
	group  *keys.Extractor
	time   *keys.Extractor // nil: the stream timestamp
	value  *keys.Extractor // nil: count 1
	sinks  []sink.Sink

	flushSeconds prometheus.Histogram
	pending      prometheus.Gauge
	lateEvents   *prometheus.CounterVec

	flushMu  sync.Mutex // serialises flushes
	failures int        // flushes failed in a row; guarded by flushMu
}

// newTotals compiles the totals configuration, registers its metrics (a
// registry that already holds them panics, as with every metric of the
// stage) and opens the sinks (see openSinks).
func newTotals(ctx context.Context, s *Stage, reg prometheus.Registerer) (_ *totals, err error) {
	cfg := s.cfg.Totals
	t := &totals{s: s, cfg: cfg, bucket: cfg.Bucket.D()}
	if t.group, err = keys.NewExtractor(cfg.Group); err != nil {
		return nil, fmt.Errorf("totals.group: %w", err)
	}
	if cfg.Time.Enabled() {
		if t.time, err = keys.NewExtractor(cfg.Time); err != nil {
			return nil, fmt.Errorf("totals.time: %w", err)
		}
	}
	if cfg.Value.Enabled() {
		if t.value, err = keys.NewExtractor(cfg.Value); err != nil {
			return nil, fmt.Errorf("totals.value: %w", err)
		}
	}
	t.flushSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "dedupe_totals_flush_seconds",
		Help:    "Time to flush the changed totals to every sink.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	})
	t.pending = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "dedupe_totals_pending_pairs",
		Help: "(group, bucket) pairs whose total changed and is not yet flushed to the sinks.",
	})
	t.lateEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dedupe_totals_late_events_total",
		Help: "New events for closed buckets (bucket end + W past), by action: dead_lettered or dropped. They never change a total.",
	}, []string{"action"})
	reg.MustRegister(t.flushSeconds, t.pending, t.lateEvents)
	for _, a := range []string{"dead_lettered", "dropped"} {
		t.lateEvents.WithLabelValues(a) // at 0 from the start
	}
	if t.sinks, err = openSinks(ctx, s.js, s.cfg, sink.NewMetrics(reg), s.log); err != nil {
		return nil, err
	}
	return t, nil
}

// close releases the sinks.
func (t *totals) close() {
	closeSinks(t.sinks)
}

// groupOf reads a message's group with ex, the totals.group extractor
// (spec), and checks it is usable as a total's group. A message without a
// usable group returns a *keys.Error with the dead-letter reason
// (deadletter.ReasonNoGroup, ReasonBadGroup or ReasonBadPayload). It is the one
// place a group is read: the totals and, with scale-out, the route step
// (which partitions by it) both call it.
func groupOf(ex *keys.Extractor, spec keys.FieldSpec, subject string, hdr nats.Header, data []byte) ([]byte, error) {
	g, err := ex.Extract(subject, hdr, data)
	if err != nil {
		reason := deadletter.Reason(keys.ReasonOf(err))
		switch reason {
		case deadletter.ReasonNoKey:
			reason = deadletter.ReasonNoGroup
		case deadletter.ReasonBadPayload:
		default:
			reason = deadletter.ReasonBadGroup
		}
		return nil, &keys.Error{Reason: string(reason), Detail: fmt.Sprintf("group (%v): %v", spec, err)}
	}
	if err := sink.CheckGroup(string(g)); err != nil {
		return nil, &keys.Error{Reason: string(deadletter.ReasonBadGroup), Detail: fmt.Sprintf("group (%v) %q: %v", spec, g, err)}
	}
	return g, nil
}

// extract reads a message's group, time and value; subject is the input
// subject the message arrived on (for a routed message, the one the route
// step recorded, not the routed stream's), and inputTime is its input
// time (item.at): the time its bucket is chosen by without totals.time,
// and the time an event time is judged against. A message that has no
// usable one returns a dead letter with its reason.
func (t *totals) extract(msg jetstream.Msg, subject string, data []byte, inputTime time.Time) (state.Contribution, *deadletter.Letter) {
	hdr := msg.Headers()
	dl := func(reason deadletter.Reason, format string, args ...any) (state.Contribution, *deadletter.Letter) {
		return state.Contribution{}, &deadletter.Letter{Msg: msg, Reason: reason, Detail: fmt.Sprintf(format, args...)}
	}
	g, err := groupOf(t.group, t.cfg.Group, subject, hdr, data)
	if err != nil {
		reason, detail := deadletter.KeyReason(err, deadletter.ReasonBadGroup)
		return dl(reason, "%s", detail)
	}
	var at time.Time
	switch {
	case t.time == nil:
		at = inputTime
	default:
		raw, err := t.time.Extract(subject, hdr, data)
		if err != nil {
			return dl(deadletter.ReasonBadTime, "time (%v): %v", t.cfg.Time, err)
		}
		if at, err = keys.ParseTime(raw); err != nil {
			return dl(deadletter.ReasonBadTime, "time (%v) %q: %v", t.cfg.Time, raw, err)
		}
		if ahead, ok := t.s.src.maxEventTimeAhead(); ok && at.Sub(inputTime) > ahead {
			return dl(deadletter.ReasonFutureTime, "time (%v) %s is %v ahead of its input time %s, more than scale_out.max_event_time_ahead %v: a new owner of the partition would not restore its total",
				t.cfg.Time, at.UTC().Format(time.RFC3339), at.Sub(inputTime).Round(time.Second), inputTime.UTC().Format(time.RFC3339), ahead)
		}
	}
	v := int64(1)
	if t.value != nil {
		raw, err := t.value.Extract(subject, hdr, data)
		if err != nil {
			return dl(deadletter.ReasonBadValue, "value (%v): %v", t.cfg.Value, err)
		}
		if v, err = keys.ParseValue(raw); err != nil {
			return dl(deadletter.ReasonBadValue, "value (%v) %q: %v", t.cfg.Value, raw, err)
		}
	}
	return state.Contribution{Group: string(g), Bucket: state.BucketOf(at, t.bucket), Value: v}, nil
}

// closes returns when the bucket starting at bucket closes: its end + W.
func (t *totals) closes(bucket time.Time) time.Time {
	return bucket.Add(t.bucket).Add(t.s.win.W)
}

// lateOutcome is what becomes of a new event, judged against its bucket.
type lateOutcome int

const (
	// onTime: the bucket is open; the event goes on to be forwarded and
	// counted.
	onTime lateOutcome = iota
	// lateDrop: the bucket is closed and totals.late_events is "drop": ack
	// the event without forwarding it, counted as outcome "dropped".
	lateDrop
	// lateDeadLetter: the bucket is closed: dead-letter the event with
	// reason closed_bucket.
	lateDeadLetter
)

// late judges a new event in partition against its bucket, at its input
// time now: a bucket whose end + W is before now is closed and its total
// final. It counts a late
// event in dedupe_totals_late_events_total and returns what to do with it;
// with lateDeadLetter, the dead letter to send. The caller acts on it.
func (t *totals) late(it *item, partition string, now time.Time) (lateOutcome, deadletter.Letter) {
	closes := t.closes(it.tot.Bucket)
	if !closes.Before(now) {
		return onTime, deadletter.Letter{}
	}
	if t.cfg.LateEvents == config.LateDrop {
		t.lateEvents.WithLabelValues("dropped").Inc()
		return lateDrop, deadletter.Letter{}
	}
	t.lateEvents.WithLabelValues("dead_lettered").Inc()
	return lateDeadLetter, deadletter.Letter{Msg: it.msg, Reason: deadletter.ReasonClosedBucket, Partition: partition,
		Detail: fmt.Sprintf("group %q bucket %s closed at %s (bucket end + W %v), event judged at %s: its total is final",
			it.tot.Group, it.tot.Bucket.UTC().Format(time.RFC3339), closes.UTC().Format(time.RFC3339), t.s.win.W, now.UTC().Format(time.RFC3339))}
}

// markAllDirty marks every total the store keeps as changed, so that the
// first flush after a start re-sends them (the set of changed pairs does
// not survive a restart; re-sending absolute values is harmless).
func (t *totals) markAllDirty(ctx context.Context) (int, error) {
	n := 0
	for i := range t.s.store.Partitions() {
		p := t.s.store.Partition(i)
		var recs []state.TotalRecord
		err := p.ScanTotals(ctx, time.Time{}, func(r state.TotalRecord) error {
			recs = append(recs, r)
			return nil
		})
		if err != nil {
			return n, err
		}
		p.MarkTotalsDirty(recs)
		n += len(recs)
	}
	t.pending.Set(float64(t.s.store.DirtyTotals()))
	return n, nil
}

// run flushes every flush interval until stop is closed.
func (t *totals) run(stop <-chan struct{}) {
	tick := time.NewTicker(t.cfg.FlushInterval.D())
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			ctx, cancel := context.WithTimeout(context.Background(), max(t.cfg.FlushInterval.D(), 30*time.Second))
			_ = t.flush(ctx)
			cancel()
		}
	}
}

// start runs the periodic flusher and returns the function that stops it
// and flushes once more, for after the workers have finished.
func (t *totals) start() (stopAndFlush func()) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t.run(stop)
	}()
	return func() {
		close(stop)
		<-done
		ctx, cancel := context.WithTimeout(context.Background(), min(t.s.shutdownTimeout, 30*time.Second))
		defer cancel()
		if err := t.flush(ctx); err != nil {
			t.s.log.Warn("final totals flush failed; the totals are kept in the state and re-flushed at the next start", "err", err)
			return
		}
		t.s.log.Info("totals flushed at shutdown")
	}
}

// flush takes the changed pairs of every partition, reads their absolute
// totals and writes them to every sink. When a sink fails, the pairs stay
// changed and the next flush sends them again (to every sink: the others
// count them as stale).
func (t *totals) flush(ctx context.Context) error {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	start := time.Now()
	store := t.s.store
	taken := make([][]state.TotalRecord, store.Partitions())
	var all []sink.Total
	var errs []error
	for i := range taken {
		recs, err := store.Partition(i).TakeDirtyTotals()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		taken[i] = recs
		for _, r := range recs {
			all = append(all, sink.Total{Group: r.Group, Bucket: r.Bucket, Value: r.Value})
		}
	}
	for _, sk := range t.sinks {
		for c := 0; c < len(all); c += flushChunk {
			if _, err := sk.Write(ctx, all[c:min(c+flushChunk, len(all))]); err != nil {
				errs = append(errs, fmt.Errorf("sink %s: %w", sk.Name(), err))
				break
			}
		}
	}
	err := errors.Join(errs...)
	if err != nil {
		for i, recs := range taken {
			store.Partition(i).MarkTotalsDirty(recs)
		}
	}
	t.flushSeconds.Observe(time.Since(start).Seconds())
	t.pending.Set(float64(store.DirtyTotals()))
	t.health(err, len(all))
	return err
}

// health reports the flush to the stage's status: totals_flush fails after
// three failed flushes in a row, until a flush succeeds.
func (t *totals) health(err error, pairs int) {
	s := t.s
	if err == nil {
		if t.failures > 0 {
			s.log.Info("totals flush recovered", "pairs", pairs, "failed_before", t.failures)
		}
		t.failures = 0
		s.status.Succeeded(CompTotalsFlush, false)
		return
	}
	t.failures++
	s.log.Warn("totals flush failed; the changed totals are kept and sent again at the next flush", "pairs", pairs, "attempt", t.failures, "err", err)
	s.status.Failed(CompTotalsFlush, err)
}

// openTotals builds the totals when they are on and marks every total the
// store keeps for a re-flush.
func (s *Stage) openTotals(ctx context.Context, reg prometheus.Registerer) error {
	if !s.cfg.Totals.Enabled {
		return nil
	}
	t, err := newTotals(ctx, s, reg)
	if err != nil {
		return err
	}
	n, err := t.markAllDirty(ctx)
	if err != nil {
		t.close()
		return fmt.Errorf("totals: read kept totals: %w", err)
	}
	s.totals = t
	s.log.Info("totals on", "group", s.cfg.Totals.Group.String(), "bucket", t.bucket, "sinks", len(t.sinks),
		"flush_interval", s.cfg.Totals.FlushInterval.D(), "kept_totals_to_reflush", n)
	return nil
}

// startTotals starts the periodic flush and returns the function that stops
// it and flushes once more; both do nothing when totals are off.
func (s *Stage) startTotals() (stopAndFlush func()) {
	if s.totals == nil {
		return func() {}
	}
	return s.totals.start()
}
