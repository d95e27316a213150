package stage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/sink"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Dead-letter reasons of the totals.
const (
	// ReasonNoGroup: the group field is missing.
	ReasonNoGroup = "no_group"
	// ReasonBadGroup: the group is not usable as a total's group (not
	// UTF-8, a control character, longer than sink.MaxGroupLen, or a JSON
	// value that is not a string or a number).
	ReasonBadGroup = "bad_group"
	// ReasonBadTime: the event time is missing or neither RFC 3339 nor a
	// Unix time in seconds or milliseconds.
	ReasonBadTime = "bad_time"
	// ReasonBadValue: the value is missing or not a decimal integer from 0
	// to math.MaxInt64.
	ReasonBadValue = "bad_value"
	// ReasonClosedBucket: a new event for a bucket that is closed (its end
	// + W is past), with totals.late_events "dead-letter".
	ReasonClosedBucket = "closed_bucket"
)

// outcomeDropped is the outcome of a late event dropped by
// totals.late_events "drop".
const outcomeDropped = "dropped"

// RoutingFile is the file in the state directory that records what the
// partition key is, so that a change (totals switched on or off, another
// group) is refused instead of silently routing keys to other partitions.
const RoutingFile = "ROUTING"

// unixMillisFrom is the smallest integer event time read as Unix
// milliseconds; smaller ones are Unix seconds (up to the year 5138).
const unixMillisFrom = 100_000_000_000

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
	pool   *pgxpool.Pool // the PostgreSQL sink's, nil without it

	flushSeconds prometheus.Histogram
	pending      prometheus.Gauge
	lateEvents   *prometheus.CounterVec

	flushMu  sync.Mutex // serialises flushes
	failures int        // flushes failed in a row; guarded by flushMu
}

// routing describes the partition key of cfg, as recorded in RoutingFile.
func routing(cfg config.Config) string {
	if cfg.Totals.Enabled {
		return "totals.group " + cfg.Totals.Group.String()
	}
	return "key"
}

// checkRouting compares the partition key recorded in dir/RoutingFile with
// want and records want when nothing is recorded. State written before the
// file existed (dir/LAYOUT without dir/ROUTING) was partitioned by the key.
// With one partition every key routes to it, so a change is harmless and
// simply recorded.
func checkRouting(dir string, partitions int, want string) error {
	path := filepath.Join(dir, RoutingFile)
	b, err := os.ReadFile(path)
	have := strings.TrimSpace(string(b))
	switch {
	case err == nil:
	case errors.Is(err, fs.ErrNotExist):
		if _, lerr := os.Stat(filepath.Join(dir, state.LayoutFile)); lerr == nil {
			have = "key"
		} else {
			have = want
		}
	default:
		return fmt.Errorf("state: read %s: %w", path, err)
	}
	if have != want && partitions > 1 {
		return fmt.Errorf("state in %s is partitioned by %s, but this configuration partitions by %s: "+
			"keys recorded there would be looked up in other partitions and their repeats forwarded (and counted) again; "+
			"start with an empty state.data_dir, or switch the configuration back", dir, have, want)
	}
	if err == nil && have == want {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	if err := os.WriteFile(path, []byte(want+"\n"), 0o644); err != nil {
		return fmt.Errorf("state: record the partition key: %w", err)
	}
	return nil
}

// newTotals compiles the totals configuration, registers its metrics and
// opens the sinks, creating the KV bucket, the stream or the table when
// configured to. On error it releases what it opened.
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
	if err := registerAll(reg, t.flushSeconds, t.pending, t.lateEvents); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	m := sink.NewMetrics(reg)
	create := s.cfg.NATS.ShouldCreateStreams()
	sk := cfg.Sinks
	if sk.KV.Enabled() {
		kv, err := ensureKV(ctx, s.js, sk.KV.Bucket, create || sk.KV.Create)
		if err != nil {
			return nil, err
		}
		t.sinks = append(t.sinks, sink.Instrument(sink.NewKV(kv), m))
	}
	if sk.Stream.Enabled() {
		if err := ensureTotalsStream(ctx, s.js, sk.Stream, create || sk.Stream.Create); err != nil {
			return nil, err
		}
		t.sinks = append(t.sinks, sink.Instrument(sink.NewStream(s.js, sk.Stream.SubjectPrefix), m))
	}
	if sk.Postgres.Enabled() {
		if t.pool, err = pgxpool.New(ctx, sk.Postgres.DSN); err != nil {
			return nil, fmt.Errorf("totals.sinks.postgres.dsn: %w", err)
		}
		if sk.Postgres.CreateSchema {
			if err := sink.CreateSchema(ctx, t.pool, sk.Postgres.Table); err != nil {
				return nil, err
			}
		}
		ps, err := sink.NewPostgres(ctx, t.pool, sk.Postgres.Table)
		if err != nil {
			return nil, fmt.Errorf("totals.sinks.postgres: %w", err)
		}
		t.sinks = append(t.sinks, sink.Instrument(ps, m))
	}
	return t, nil
}

func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register totals metrics: %w", err)
		}
	}
	return nil
}

// ensureKV returns the KV bucket name, creating it when missing and create.
func ensureKV(ctx context.Context, js jetstream.JetStream, name string, create bool) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, name)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) || !create {
		return nil, fmt.Errorf("totals.sinks.kv.bucket %s: %w (create it, or set totals.sinks.kv.create)", name, err)
	}
	kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: name, Description: "dedupe-stage totals: <group>.<bucket unix seconds> = total", Storage: jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("create KV bucket %s: %w", name, err)
	}
	return kv, nil
}

// ensureTotalsStream checks that the totals stream exists, creating it with
// subjects prefix.> when missing and create.
func ensureTotalsStream(ctx context.Context, js jetstream.JetStream, c config.StreamSink, create bool) error {
	_, err := js.Stream(ctx, c.Stream)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) || !create {
		return fmt.Errorf("totals.sinks.stream.stream %s: %w (create it, or set totals.sinks.stream.create)", c.Stream, err)
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name: c.Stream, Subjects: []string{c.Subjects()}, Storage: jetstream.FileStorage,
		Description: "dedupe-stage totals: the largest value per (group, bucket) is current",
	})
	if err != nil {
		return fmt.Errorf("create totals stream %s: %w", c.Stream, err)
	}
	return nil
}

// close releases the sinks and the PostgreSQL pool.
func (t *totals) close() {
	for _, sk := range t.sinks {
		_ = sk.Close()
	}
	if t.pool != nil {
		t.pool.Close()
	}
}

// extract reads a message's group, time and value. A message that has no
// usable one returns a dead letter with its reason.
func (t *totals) extract(msg jetstream.Msg, data []byte) (state.Contribution, *deadLetter) {
	subject, hdr := msg.Subject(), msg.Headers()
	dl := func(reason, format string, args ...any) (state.Contribution, *deadLetter) {
		return state.Contribution{}, &deadLetter{msg: msg, reason: reason, partition: "none", detail: fmt.Sprintf(format, args...)}
	}
	g, err := t.group.Extract(subject, hdr, data)
	if err != nil {
		switch reason := keys.ReasonOf(err); reason {
		case keys.ReasonNoKey:
			return dl(ReasonNoGroup, "group (%v): %v", t.cfg.Group, err)
		case keys.ReasonBadPayload:
			return dl(reason, "group (%v): %v", t.cfg.Group, err)
		default:
			return dl(ReasonBadGroup, "group (%v): %v", t.cfg.Group, err)
		}
	}
	if err := sink.CheckGroup(string(g)); err != nil {
		return dl(ReasonBadGroup, "group (%v) %q: %v", t.cfg.Group, g, err)
	}
	var at time.Time
	if t.time == nil {
		md, err := msg.Metadata()
		if err != nil {
			return dl(ReasonBadTime, "no stream timestamp: %v", err)
		}
		at = md.Timestamp
	} else {
		raw, err := t.time.Extract(subject, hdr, data)
		if err != nil {
			return dl(ReasonBadTime, "time (%v): %v", t.cfg.Time, err)
		}
		if at, err = parseEventTime(raw); err != nil {
			return dl(ReasonBadTime, "time (%v) %q: %v", t.cfg.Time, raw, err)
		}
	}
	v := int64(1)
	if t.value != nil {
		raw, err := t.value.Extract(subject, hdr, data)
		if err != nil {
			return dl(ReasonBadValue, "value (%v): %v", t.cfg.Value, err)
		}
		if v, err = parseValue(raw); err != nil {
			return dl(ReasonBadValue, "value (%v) %q: %v", t.cfg.Value, raw, err)
		}
	}
	return state.Contribution{Group: string(g), Bucket: state.BucketOf(at, t.bucket), Value: v}, nil
}

// parseEventTime reads RFC 3339 text, or a non-negative decimal integer as
// Unix seconds (below unixMillisFrom) or Unix milliseconds. Times after the
// year 9999 are refused: the sinks cannot store them.
func parseEventTime(b []byte) (time.Time, error) {
	var at time.Time
	if n, ok := parseDigits(b); ok {
		if n < unixMillisFrom {
			at = time.Unix(n, 0)
		} else {
			at = time.UnixMilli(n)
		}
	} else {
		var err error
		if at, err = time.Parse(time.RFC3339Nano, string(b)); err != nil {
			return time.Time{}, errors.New("want RFC 3339 text or Unix seconds or milliseconds")
		}
	}
	if at.UTC().Year() > 9999 {
		return time.Time{}, errors.New("after the year 9999")
	}
	return at, nil
}

// parseValue reads a decimal integer from 0 to math.MaxInt64.
func parseValue(b []byte) (int64, error) {
	n, ok := parseDigits(b)
	if !ok {
		return 0, errors.New("want an integer from 0 to 9223372036854775807 in decimal digits")
	}
	return n, nil
}

// parseDigits parses 1..19 decimal digits that fit an int64.
func parseDigits(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	return n, err == nil
}

// closes returns when the bucket starting at bucket closes: its end + W.
func (t *totals) closes(bucket time.Time) time.Time {
	return bucket.Add(t.bucket).Add(t.s.win.W)
}

// late handles batch[i] if it is a new event for a closed bucket (its end +
// W before now): it counts it and dead-letters it, or acks and drops it,
// and returns true. Otherwise it returns false and the event goes on.
func (t *totals) late(w *worker, i int, batch []item, now time.Time) bool {
	it := &batch[i]
	closes := t.closes(it.tot.Bucket)
	if !closes.Before(now) {
		return false
	}
	if t.cfg.LateEvents == config.LateDrop {
		t.lateEvents.WithLabelValues("dropped").Inc()
		t.s.metrics.Messages.WithLabelValues(w.label, outcomeDropped).Inc()
		w.acks = append(w.acks, i)
		return true
	}
	t.lateEvents.WithLabelValues("dead_lettered").Inc()
	w.dlq <- deadLetter{msg: it.msg, reason: ReasonClosedBucket, partition: w.label,
		detail: fmt.Sprintf("group %q bucket %s closed at %s (bucket end + W %v), event judged at %s: its total is final",
			it.tot.Group, it.tot.Bucket.UTC().Format(time.RFC3339), closes.UTC().Format(time.RFC3339), t.s.win.W, now.UTC().Format(time.RFC3339))}
	return true
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
