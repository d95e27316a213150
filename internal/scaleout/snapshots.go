package scaleout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/ensure"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/snapshot"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Restore paths, the path label of dedupe_restore_path_total.
const (
	restoreSnapshot = "snapshot" // the newest snapshot, then the changelog after it
	restoreLocal    = "local"    // the changelog after the local store's cursor
	restoreFull     = "full"     // the changelog back to now - the output's retention
	restoreEmpty    = "empty"    // nothing: the output holds no record of the partition
)

// snapshotRequestTimeout bounds one request to the snapshot bucket other
// than a snapshot's own transfer.
const snapshotRequestTimeout = 10 * time.Second

// snapshotTransferTimeout bounds reading one snapshot back: far above what
// a partition's snapshot takes (tens of seconds at tens of millions of
// keys), so only a stalled transfer reaches it.
const snapshotTransferTimeout = time.Hour

// snapshots writes and reads the partition snapshots of a scale-out
// group (docs/scale-out.md §3.3): each owner writes a snapshot of each
// partition it owns every interval into the Object Store bucket
// "<group>-snapshots", object p<i>, which replaces the one before; a new
// owner loads it and replays only the changelog after the sequence it
// covers. It is safe for concurrent use.
type snapshots struct {
	js       jetstream.JetStream
	log      *slog.Logger
	group    string
	parts    int
	window   time.Duration
	bucket   string
	every    time.Duration // 0: none is written (loading still works)
	load     bool          // a takeover loads the partition's snapshot: false with totals, which it does not hold
	keep     time.Duration // the bucket's TTL
	replicas int
	metrics  *snapshotMetrics
	// fetch is held by the one snapshot load of the instance at a time
	// (see loadOne).
	fetch chan struct{}

	mu      sync.Mutex
	obs     jetstream.ObjectStore // nil until opened
	written map[int]uint64        // partition -> the cursor its last snapshot covered
}

// snapshotMetrics are the metrics of snapshots and of how partitions were
// restored.
type snapshotMetrics struct {
	paths   *prometheus.CounterVec
	writes  *prometheus.CounterVec
	records *prometheus.GaugeVec
	bytes   *prometheus.GaugeVec
	seconds prometheus.Histogram
	loaded  *prometheus.CounterVec
	current *prometheus.GaugeVec
}

func newSnapshotMetrics(reg prometheus.Registerer) *snapshotMetrics {
	m := &snapshotMetrics{
		paths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_restore_path_total",
			Help: "Takeovers by how the partition was restored: snapshot (the newest snapshot, then the output stream after it), local (the output stream after the local store's cursor) full (the output stream back to the retention) or empty (nothing: the output holds no record of the partition).",
		}, []string{"path"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_snapshot_writes_total",
			Help: "Partition snapshots written into the snapshot bucket, by result (ok, failed).",
		}, []string{"result"}),
		records: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dedupe_snapshot_records",
			Help: "Records in the partition's last snapshot this instance wrote.",
		}, []string{"partition"}),
		bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dedupe_snapshot_bytes",
			Help: "Size of the partition's last snapshot this instance wrote.",
		}, []string{"partition"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dedupe_snapshot_write_seconds",
			Help:    "Time to write a partition snapshot into the snapshot bucket, of the snapshots written.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}),
		loaded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_snapshot_restore_records_total",
			Help: "Records loaded from snapshots into the state store when taking a partition, by partition.",
		}, []string{"partition"}),
		current: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dedupe_snapshot_last_success_timestamp_seconds",
			Help: "When the partition's snapshot last covered everything this instance had forwarded for it (Unix time): at each snapshot written, and at each interval with nothing new since the last one. time() minus it is the age of what a new owner would read from the changelog after the snapshot.",
		}, []string{"partition"}),
	}
	reg.MustRegister(m.paths, m.writes, m.records, m.bytes, m.seconds, m.loaded, m.current)
	for _, p := range []string{restoreSnapshot, restoreLocal, restoreFull, restoreEmpty} {
		m.paths.WithLabelValues(p)
	}
	return m
}

// zeroPartitions exports the snapshot counters at 0: writes by result and
// the records loaded for each of partitions partitions.
func (m *snapshotMetrics) zeroPartitions(partitions int) {
	for _, r := range []string{"ok", "failed"} {
		m.writes.WithLabelValues(r)
	}
	for p := range partitions {
		m.loaded.WithLabelValues(strconv.Itoa(p))
	}
}

// newSnapshots returns the group's snapshots, as o configures them;
// replicas are the output stream's.
func newSnapshots(o Options, js jetstream.JetStream, log *slog.Logger, w time.Duration, replicas int, reg prometheus.Registerer) *snapshots {
	return &snapshots{js: js, log: log, group: o.Group, parts: o.Partitions, window: w,
		bucket: layout.SnapshotBucket(o.Group), every: o.SnapshotEvery, keep: o.SnapshotKeep, replicas: replicas, metrics: newSnapshotMetrics(reg), load: o.LoadSnapshots,
		written: make(map[int]uint64), fetch: make(chan struct{}, 1)}
}

// open returns the bucket, creating it when missing.
func (sn *snapshots) open(ctx context.Context) (jetstream.ObjectStore, error) {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.obs != nil {
		return sn.obs, nil
	}
	ctx, cancel := context.WithTimeout(ctx, snapshotRequestTimeout)
	defer cancel()
	obs, _, err := ensure.Open(ctx, "snapshot bucket "+sn.bucket, func(ctx context.Context) (jetstream.ObjectStore, error) {
		return sn.js.ObjectStore(ctx, sn.bucket)
	}, func(ctx context.Context) (jetstream.ObjectStore, error) {
		return sn.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: sn.bucket, TTL: sn.keep, Replicas: sn.replicas,
			Storage: jetstream.FileStorage, Description: "dedupe-stage: snapshots of group " + sn.group + "'s partitions, object p<i> each"})
	}, ensure.Options{Logger: sn.log})
	if err != nil {
		return nil, err
	}
	sn.obs = obs
	return obs, nil
}

// run writes a snapshot of every partition this instance owns, one at a
// time, every interval, until ctx is done. A partition whose cursor did
// not move since its last snapshot is skipped. A failure is logged
// (at most once per round) and counted; the next round tries again.
func (g *Group) runSnapshots(ctx context.Context, store *state.Store) {
	sn := g.snaps
	if sn == nil || sn.every == 0 {
		return
	}
	if _, err := sn.open(ctx); err != nil && ctx.Err() == nil {
		g.log.Warn("scale-out: snapshot bucket not reachable yet; snapshots wait for it", "err", err)
	}
	t := time.NewTicker(sn.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var failed error
		owned := g.ownedPartitions()
		sn.forgetOthers(owned)
		for _, p := range owned {
			if ctx.Err() != nil {
				return
			}
			if err := sn.write(ctx, store.Partition(p), g.outStream); err != nil {
				failed = err
			}
		}
		if failed != nil && ctx.Err() == nil {
			g.log.Warn("scale-out: writing a partition snapshot failed; a new owner reads more of the changelog until the next one", "err", failed)
		}
	}
}

// ownedPartitions returns the partitions this instance owns now.
func (g *Group) ownedPartitions() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Collect(maps.Keys(g.owned))
}

// forgetOthers drops the snapshot gauges of the partitions not in owned:
// another instance writes their snapshots now, and an age read from a
// partition this instance left would only grow.
func (sn *snapshots) forgetOthers(owned []int) {
	keep := make(map[string]bool, len(owned))
	for _, p := range owned {
		keep[strconv.Itoa(p)] = true
	}
	for p := range sn.parts {
		if label := strconv.Itoa(p); !keep[label] {
			for _, g := range []*prometheus.GaugeVec{sn.metrics.records, sn.metrics.bytes, sn.metrics.current} {
				g.DeleteLabelValues(label)
			}
		}
	}
}

// errUnchanged means the partition's cursor did not move since its last
// snapshot: there is nothing new to write.
var errUnchanged = errors.New("unchanged since the last snapshot")

// write streams a snapshot of p into object p<i>: the records of one
// consistent view of the store and the cursor of that view
// (state.Partition.ScanRecords). The object store writes the new object's
// chunks before it replaces the old one, so a write that fails part way
// leaves the old snapshot.
func (sn *snapshots) write(ctx context.Context, p *state.Partition, outStream string) error {
	obs, err := sn.open(ctx)
	if err != nil {
		sn.metrics.writes.WithLabelValues("failed").Inc()
		return err
	}
	if c, err := p.Cursor(); err == nil {
		sn.mu.Lock()
		last, ok := sn.written[p.Index()]
		sn.mu.Unlock()
		if c == 0 || ok && last == c {
			sn.markCurrent(p.Index(), time.Now()) // nothing new since the last snapshot
			return nil
		}
	}
	rctx, cancel := context.WithTimeout(ctx, snapshotRequestTimeout)
	st, err := sn.js.Stream(rctx, outStream)
	cancel()
	if err != nil {
		sn.metrics.writes.WithLabelValues("failed").Inc()
		return fmt.Errorf("snapshot of partition %d: output stream %s: %w", p.Index(), outStream, err)
	}
	created := st.CachedInfo().Created
	start := time.Now()
	pr, pw := io.Pipe()
	var cursor, n uint64
	scanned := make(chan error, 1)
	go func() {
		var w *snapshot.Writer
		err := p.ScanRecords(ctx, func(c uint64) error {
			sn.mu.Lock()
			last, ok := sn.written[p.Index()]
			sn.mu.Unlock()
			if c == 0 || ok && last == c {
				return errUnchanged
			}
			cursor = c
			var err error
			w, err = snapshot.NewWriter(pw, snapshot.Header{Group: sn.group, Partition: p.Index(), Partitions: sn.parts,
				Seq: c, StreamCreated: created, Window: sn.window, Taken: time.Now()})
			return err
		}, func(key []byte, r state.Record) error {
			return w.Add(snapshot.Record{Key: key, FirstSeen: r.FirstSeen, Fingerprint: r.Fingerprint,
				Refreshed: r.Refreshed, Version: r.Version, HasVersion: r.HasVersion, Forgotten: r.Forgotten, OutputSeq: r.OutputSeq})
		})
		if err == nil {
			n, err = w.Close()
		}
		pw.CloseWithError(err)
		scanned <- err
	}()
	info, err := obs.Put(ctx, jetstream.ObjectMeta{Name: snapshotObject(p.Index()),
		Description: "partition " + strconv.Itoa(p.Index()) + " of group " + sn.group}, pr)
	pr.CloseWithError(errors.New("the object store stopped reading"))
	serr := <-scanned
	label := strconv.Itoa(p.Index())
	switch {
	case errors.Is(serr, errUnchanged):
		sn.markCurrent(p.Index(), time.Now())
		return nil
	case serr != nil:
		err = serr
	}
	if err != nil {
		sn.metrics.writes.WithLabelValues("failed").Inc()
		return fmt.Errorf("snapshot of partition %d: %w", p.Index(), err)
	}
	took := time.Since(start)
	sn.metrics.writes.WithLabelValues("ok").Inc()
	sn.metrics.records.WithLabelValues(label).Set(float64(n))
	sn.metrics.bytes.WithLabelValues(label).Set(float64(info.Size))
	sn.metrics.seconds.Observe(took.Seconds())
	sn.markCurrent(p.Index(), start)
	sn.mu.Lock()
	sn.written[p.Index()] = cursor
	sn.mu.Unlock()
	sn.log.Debug("scale-out: partition snapshot written", "partition", p.Index(), "sequence", cursor, "records", n,
		"bytes", info.Size, "took", took.Round(time.Millisecond))
	return nil
}

// markCurrent records that partition p's snapshot held everything this
// instance had forwarded for it at t.
func (sn *snapshots) markCurrent(p int, t time.Time) {
	sn.metrics.current.WithLabelValues(strconv.Itoa(p)).Set(float64(t.Unix()))
}

// snapshotObject is partition p's object in the snapshot bucket.
func snapshotObject(p int) string { return layout.SnapshotObject(p) }

// errSnapshotUnusable wraps every reason a takeover does not restore from
// the partition's snapshot: the takeover falls back to the changelog.
var errSnapshotUnusable = errors.New("snapshot not usable")

// errSnapshotBehind means the snapshot covers no more of the changelog
// than the local store's cursor: the local store is the better start.
var errSnapshotBehind = errors.New("the local store is as far")

// checkSnapshot returns an error wrapping errSnapshotUnusable (and
// errSnapshotBehind when it covers no more than the local cursor) unless
// the snapshot h heads is of this group, partition and number of
// partitions, for a window at least W, of the output stream out, covers a
// sequence inside it past the local cursor (when that is valid; with warm
// standbys on, more than standbyPreferLocal past it), and the
// stream still holds that sequence's successors (checkReach).
func (o *Owner) checkSnapshot(h snapshot.Header, out *jetstream.StreamInfo, cursor uint64) error {
	g := o.g
	p, parts := o.p.Index(), g.snaps.parts
	unusable := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{errSnapshotUnusable}, args...)...)
	}
	switch {
	case h.Group != g.name || h.Partition != p || h.Partitions != parts:
		return unusable("it is of group %q partition %d of %d, want %q partition %d of %d", h.Group, h.Partition, h.Partitions, g.name, p, parts)
	case h.Window < g.window:
		return unusable("it holds a window of %v, below W = %v", h.Window, g.window)
	case !h.StreamCreated.Equal(out.Created):
		return unusable("it covers an output stream %s created %v, this one was created %v", g.outStream, h.StreamCreated, out.Created)
	case h.Seq == 0 || h.Seq > out.State.LastSeq:
		return unusable("it covers sequence %d, outside the output stream's 1..%d", h.Seq, out.State.LastSeq)
	case cursor > 0 && cursor <= out.State.LastSeq && h.Seq <= cursor+g.preferLocal():
		return fmt.Errorf("%w: %w: it covers sequence %d, not past the local cursor %d (+%d)", errSnapshotUnusable, errSnapshotBehind, h.Seq, cursor, g.preferLocal())
	}
	if err := g.checkReach(out.State, p, h.Seq+1, serverTime(out, g.clock)); err != nil {
		return unusable("%v", err)
	}
	return nil
}

// preferLocal is how far a snapshot must be past the local cursor to be
// loaded: standbyPreferLocal with warm standbys on, so that a standby's
// takeover reads its tail (path local), else 0.
func (g *Group) preferLocal() uint64 {
	if g.opts.Standbys > 0 {
		return standbyPreferLocal
	}
	return 0
}

// snapshotSink returns how loadSnapshot stores a snapshot's records in
// the worker's partition: put takes each chunk, finish stores the cursor
// after the last, cancel (deferred) undoes an unfinished load. An empty
// partition (a new owner's empty data dir) is loaded in bulk, as tables
// built in key order (state.Loader); one that holds anything gets each
// chunk merged in by Restore, its cursor with the last.
func (o *Owner) snapshotSink() (put func([]state.Restored) error, finish func(cursor uint64) error, cancel func(), err error) {
	ld, err := o.p.NewLoader()
	switch {
	case err == nil:
		return ld.Add, ld.Finish, func() {
			if err := ld.Cancel(); err != nil {
				o.g.log.Error("scale-out: dropping a snapshot load that did not finish", "partition", o.label, "err", err)
			}
		}, nil
	case errors.Is(err, state.ErrNotEmpty):
		put := func(recs []state.Restored) error { return o.p.Restore(recs, 0) }
		finish := func(cursor uint64) error { return o.p.Restore(nil, cursor) }
		return put, finish, func() {}, nil
	default:
		return nil, nil, nil, err
	}
}

// loadOne waits until no other partition of this instance loads its
// snapshot, keeping the batch alive meanwhile, and returns what ends this
// one's turn: object reads side by side on one connection stall each other
// (docs/scale-out.md, "Code notes").
func (o *Owner) loadOne(ctx context.Context, keepAlive func()) (release func(), err error) {
	fetch := o.g.snaps.fetch
	tick := time.NewTicker(o.g.consumer.AckWait / 3)
	defer tick.Stop()
	for {
		select {
		case fetch <- struct{}{}:
			return func() { <-fetch }, nil
		case <-tick.C:
			keepAlive()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// loadSnapshot restores the worker's partition from its newest snapshot when
// that is usable (docs/scale-out.md, "Code notes"), and returns the output
// sequence it covers (the changelog is replayed from the next one) and the
// records it loaded; out is the output stream as read before the fence was
// taken, cursor the local store's. An unusable one gives an error wrapping
// errSnapshotUnusable, and the changelog restore is as exact as without it.
func (o *Owner) loadSnapshot(ctx context.Context, out *jetstream.StreamInfo, cursor uint64, keepAlive func()) (uint64, int, error) {
	g := o.g
	sn, p := g.snaps, o.p.Index()
	unusable := func(format string, args ...any) (uint64, int, error) {
		return 0, 0, fmt.Errorf("%w: "+format, append([]any{errSnapshotUnusable}, args...)...)
	}
	obs, err := sn.open(ctx)
	if err != nil {
		return unusable("%v", err)
	}
	release, err := o.loadOne(ctx, keepAlive)
	if err != nil {
		return 0, 0, fmt.Errorf("load snapshot of partition %d: %w", p, err)
	}
	defer release()
	// The whole read is bounded by snapshotTransferTimeout, the wait for
	// each chunk by objectChunkTimeout.
	gctx, cancel := context.WithTimeout(ctx, snapshotTransferTimeout)
	defer cancel()
	res, err := openObject(gctx, sn.js, obs, sn.bucket, snapshotObject(p))
	if err != nil {
		return 0, 0, fmt.Errorf("%w: object %s: %w", errSnapshotUnusable, snapshotObject(p), err)
	}
	defer res.Close()
	r, err := snapshot.NewReader(res)
	if err != nil {
		return unusable("object %s: %v", snapshotObject(p), err)
	}
	h := r.Header()
	if err := o.checkSnapshot(h, out, cursor); err != nil {
		return 0, 0, err
	}
	put, finish, cancel, err := o.snapshotSink()
	if err != nil {
		return 0, 0, fmt.Errorf("load snapshot of partition %d: %w", p, err)
	}
	defer cancel()
	recs := make([]state.Restored, 0, restoreChunk)
	n := 0
	for {
		rec, err := r.Next()
		done := errors.Is(err, io.EOF)
		if err != nil && !done {
			return unusable("object %s after %d records: %v", snapshotObject(p), n, err)
		}
		if !done {
			recs = append(recs, state.Restored{Key: bytes.Clone(rec.Key), FirstSeen: rec.FirstSeen, Fingerprint: rec.Fingerprint,
				Refreshed: rec.Refreshed, Version: rec.Version, HasVersion: rec.HasVersion, Forgotten: rec.Forgotten,
				OutputSeq: rec.OutputSeq})
		}
		if len(recs) == restoreChunk || done {
			err := put(recs)
			if err == nil && done {
				err = finish(h.Seq) // every record is in: the cursor moves to what the snapshot covers
			}
			if errors.Is(err, state.ErrBadRestore) {
				return unusable("object %s after %d records: %v", snapshotObject(p), n, err)
			}
			if err != nil {
				return 0, n, fmt.Errorf("load snapshot of partition %d: %w", p, err)
			}
			n += len(recs)
			sn.metrics.loaded.WithLabelValues(o.label).Add(float64(len(recs)))
			g.restoring(p, n, true)
			recs = recs[:0]
			keepAlive()
		}
		if done {
			return h.Seq, n, nil
		}
	}
}
