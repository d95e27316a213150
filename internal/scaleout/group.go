package scaleout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/lograte"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/route"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// LocalPin is the pin of a message the route step handed to this
// instance's worker directly (Run's local): it came under no pin, and its
// batch is judged only under a tenure this instance already holds.
const LocalPin = "local"

// HeaderPinID is the header nats-server puts on each message a pinned
// client of a priority group receives: the pin the message was delivered
// under. A partition's tenure in this instance is one pin.
const HeaderPinID = "Nats-Pin-Id"

// pcgPriorityGroup is the priority group pcgroups gives every member's
// consumer.
const pcgPriorityGroup = "PCG"

// restoreChunk is how many restored records are written to the store in
// one call.
const restoreChunk = 4096

// Options configure New. Every field is required but Transform (required
// when the route step does not run), Route, Key (required when it runs),
// PartitionKey and Reporter. The caller fills them from its validated
// configuration; Check reads the same.
type Options struct {
	// Group is the static consumer group's name (scale_out.group), and
	// Instance this instance's name among the live ones.
	Group, Instance string
	// Partitions is the partition count (state.partitions): one member of
	// the group each.
	Partitions int
	// Replicas of the buckets the group creates (scale_out.replicas).
	Replicas int
	// InputStream is the input stream and InputSubjects its subjects.
	InputStream   string
	InputSubjects []string
	// AckWait, MaxAckPending and MaxDeliver are each member consumer's
	// (input's). AckWait is also the pin's TTL.
	AckWait                   time.Duration
	MaxAckPending, MaxDeliver int
	// Transform is the input stream's subject transform that puts the
	// partition first, when the route step does not run.
	Transform jetstream.SubjectTransformConfig
	// Route, when set, runs the route step with these options; the group
	// fills in what is its own (Conn, Group, Key, BundleForm, the
	// shutdown, metrics, logs and PartitionKey). RouteWhy says why it
	// runs, for the log.
	Route    *route.Options
	RouteWhy string
	// OutputStream is the output stream, the changelog, and OutputPrefix
	// its subject prefix; OutputPublish is output.publish, for messages.
	OutputStream, OutputPrefix, OutputPublish string
	// DeadLetterStream is the dead-letter stream and DeadLetterSubject
	// its subject prefix.
	DeadLetterStream, DeadLetterSubject string
	// Retention is how far back a restore without a cursor reads, and
	// RetentionTerms what it adds up, for messages.
	Retention      time.Duration
	RetentionTerms string
	// SnapshotEvery is how often an owner writes each partition's
	// snapshot, 0 for never, and SnapshotKeep how long the bucket keeps
	// one. LoadSnapshots says whether a takeover loads one (not with
	// totals: a snapshot does not hold the open totals).
	SnapshotEvery, SnapshotKeep time.Duration
	LoadSnapshots               bool
	// BundleMax is the most copies the route step bundles
	// (scale_out.route_bundle_max); bundles are written only while it is
	// above 1 and every live instance reads them.
	BundleMax int
	// Conn is the NATS connection, and JS the JetStream context on it.
	Conn *nats.Conn
	JS   jetstream.JetStream
	// Window is W, the dedupe window: what a snapshot must hold.
	Window time.Duration
	// Clock tells the time of judgements.
	Clock window.Clock
	// Key is the key the route step reads. Required when the route step
	// runs (Route).
	Key *keys.KeyFunc
	// PartitionKey, when set, is what the route step partitions by instead
	// of the key: with totals on, the group of the event's total.
	PartitionKey func(subject string, hdr nats.Header, data, key []byte) ([]byte, error)
	// AtomicOutput says whether the output is published as atomic batches:
	// the fence needs them, and New refuses to start without.
	AtomicOutput bool
	// ShutdownTimeout bounds how long the route step finishes what it
	// routes when it stops.
	ShutdownTimeout time.Duration
	// Registry receives the group's metrics.
	Registry prometheus.Registerer
	// Logger receives the group's logs, and Logs the rate-limited ones of
	// per-batch events.
	Logger *slog.Logger
	Logs   *lograte.Limiter
	// Reporter hears the route step's health. Optional.
	Reporter retry.Reporter
	// Standbys is how many warm standbys each partition has
	// (scale_out.standbys, docs/scale-out.md §4.4): the instances after
	// its owner in its ranking that tail its changelog into their local
	// store. 0 turns them off.
	Standbys int
	// Restoring hears a takeover's restore of partition p: on at its start
	// and at each chunk of records, off at its end.
	Restoring func(p, records int, on bool)
	// StoreAhead hears a takeover that found the local store ahead of the
	// output stream and dropped what the output lost
	// (changelog.CheckAhead). Optional.
	StoreAhead func(changelog.Ahead)
}

// Group is this instance's part in a scale-out group: the static consumer
// group's members it consumes, the fences of the partitions it owns, and
// their metrics. Its methods are safe for concurrent use; each Owner
// belongs to one partition's worker.
type Group struct {
	opts      Options
	js        jetstream.JetStream
	joinJS    jetstream.JetStream // js with groupRequestTimeout for requests without a deadline: the members' joins
	log       *slog.Logger
	logs      *lograte.Limiter // log: the lines of per-batch events, rate-limited
	clock     window.Clock
	window    time.Duration // W
	restoring func(p, records int, on bool)
	ahead     func(changelog.Ahead) // Options.StoreAhead; nil: nobody hears
	reporter  retry.Reporter        // nil: the route step's failures are logged only
	// bundles: the bundle form every live instance says it reads, 0 for
	// none (setBundles)
	bundles   atomic.Int32
	name      string
	instance  string
	prefix    string             // output subject prefix
	outStream string             // output stream: changelog and fences
	dlStream  string             // dead-letter stream: dead letters and their fences
	dlSubject string             // dead-letter subject prefix
	dlRefresh time.Duration      // how often a dead-letter fence is written again (fenceRefresh)
	handOvers jetstream.KeyValue // each partition's last takeover, for status (recordHandOver)
	inStream  string             // the stream the group's members consume: the input, or the routed stream
	routed    *route.Options     // the route step's options when it runs, else nil
	retention time.Duration      // how far back a restore without a cursor reads
	terms     string             // what retention adds up (Options.RetentionTerms)
	consumer  jetstream.ConsumerConfig
	metrics   *scaleOutMetrics
	snaps     *snapshots // the partitions' snapshots (docs/scale-out.md §3.3)
	// presence is the presence bucket once joined (ReadsHealth); noPresence
	// is set when it cannot be joined.
	presence   atomic.Pointer[presence]
	noPresence atomic.Bool

	mu    sync.Mutex
	owned map[int]string // partition -> the pin it is owned under
	took  time.Time      // when this instance last took a partition it did not own (balance)
	lost  map[int]string // partition -> the pin it was released under (balance)
	// rechecked: partition -> when a lost pin was last checked again (recheckLost)
	rechecked map[int]time.Time
	// busy holds, per partition, the token its worker keeps while it
	// judges and forwards a batch: a planned release takes it, so the
	// batch in flight finishes before the partition is unpinned.
	busy []sync.Mutex
	// releaseNow asks balance to release a partition at once (tests).
	releaseNow chan int
	// diverted: partition -> the messages its member delivered while it
	// was being released, given back once it is (releaseForBalance).
	diverted map[int][]jetstream.Msg
	// givingBack is set when the instance stops: its workers give back
	// (nak) what they have not started judging.
	givingBack bool
	// pre: partition -> its tenure taken before any message (pretake),
	// until its worker adopts it; pretaking: the partitions whose pretake
	// runs, in pretakes.
	pre       map[int]*tenure
	pretaking map[int]bool
	pretakes  sync.WaitGroup
	// assigned is each partition's assigned owner as balance last
	// computed it (assign); a pretake runs only while it names this
	// instance.
	assigned []string
	// standby holds the partitions this instance is a warm standby of, as
	// balance last computed them (setStandbys).
	standby map[int]bool
	// successor holds the partitions this instance pulls on for a
	// takeover while another instance owns them (setSuccessors).
	successor map[int]bool
	// tails: partition -> the cancel of its warm standby's tail step in
	// flight; taking: partition -> the takers waiting for its busy token,
	// before whom no tail step starts (preemptTail).
	tails  map[int]context.CancelFunc
	taking map[int]int
	// takes: partition -> the takeovers of it in flight here, until the
	// partition is owned or the take failed (startTake); detection
	// leaves their pins alone.
	takes map[int]int
	// tailSeen: partition -> the output's last sequence when its tail
	// last found nothing new (tailedUpTo)
	tailSeen map[int]uint64
}

// scaleOutMetrics are the metrics of partition ownership; they exist only
// with scale-out on.
type scaleOutMetrics struct {
	owned      prometheus.Gauge
	takeovers  *prometheus.CounterVec
	refusals   *prometheus.CounterVec
	stale      *prometheus.CounterVec
	restored   *prometheus.CounterVec
	bundlesOn  prometheus.Gauge
	reopens    *prometheus.CounterVec
	restoring  *prometheus.GaugeVec
	restoreDur *prometheus.HistogramVec
	released   *prometheus.CounterVec
	refused    *prometheus.CounterVec
	dlRefusals *prometheus.CounterVec
	partitions *prometheus.GaugeVec
	goneUnpins *prometheus.CounterVec
	members    prometheus.Gauge
	// warm standbys (standby.go)
	sbPartitions prometheus.Gauge
	sbRecords    prometheus.Counter
	sbCursor     *prometheus.GaugeVec
}

func newScaleOutMetrics(reg prometheus.Registerer) *scaleOutMetrics {
	m := &scaleOutMetrics{
		owned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dedupe_partitions_owned",
			Help: "Partitions this instance owns: it holds their fence and judges their messages.",
		}),
		members: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dedupe_members_consumed",
			Help: "Partitions whose member consumer this instance pulls on: those it owns or is assigned, and, once the group has settled, those it succeeds (scale_out.standbys, at least one successor per partition), standing by for a crash.",
		}),
		goneUnpins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_gone_owner_unpins_total",
			Help: "Times this instance, standing by for a partition, unpinned it because its owner's presence had been silent for 3 s: the partition moves before the pin's TTL.",
		}, []string{"partition"}),
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_partition_takeovers_total",
			Help: "Times this instance took a partition's fence and restored the partition, by partition.",
		}, []string{"partition"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_fence_refusals_total",
			Help: "Output batches the server refused because the partition's fence moved: another instance took the partition, and nothing of the batch was stored.",
		}, []string{"partition"}),
		dlRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_dead_letter_fence_refusals_total",
			Help: "Dead letters the server refused because the partition's dead-letter fence moved: another instance took the partition; they stay unacked for its owner.",
		}, []string{"partition"}),
		stale: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_stale_pin_messages_total",
			Help: "Messages given back (nak) because they were delivered under a pin this instance lost or released; the partition's owner gets them at once.",
		}, []string{"partition"}),
		restored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_restore_records_total",
			Help: "Records read back from the output stream into the state store when taking a partition, by partition.",
		}, []string{"partition"}),
		bundlesOn: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dedupe_route_bundles_on",
			Help: "1 while the route step writes bundles: scale_out.route_bundle_max is above 1 and every live instance of the group says (in the presence bucket) that it reads them; 0 while it routes every copy alone.",
		}),
		reopens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_restore_reader_reopens_total",
			Help: fmt.Sprintf("Times a restore replaced its changelog reader because it delivered nothing for %v (a consumer alive but silent), by partition.", changelog.RestoreReopenAfter),
		}, []string{"partition"}),
		restoring: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dedupe_partition_restoring",
			Help: "1 while this instance restores the partition from the output stream, else 0.",
		}, []string{"partition"}),
		restoreDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dedupe_partition_restore_seconds",
			Help:    "Time this instance took to take a partition, the fence and the restore, by the restore's path (snapshot, local, full, empty: the output held no record of the partition).",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 17),
		}, []string{"path"}),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_partition_releases_total",
			Help: "Partitions this instance released to balance the group (it owned more than its fair share), by partition.",
		}, []string{"partition"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_partition_refused_total",
			Help: "Takeovers of the partition this instance refused because the output stream does not keep what its restore needs (reason limits: the stream's configuration drops records; short: records the restore needs are gone). The partition's input waits; the log names the stream field and the fix.",
		}, []string{"partition", "reason"}),
	}
	m.sbPartitions = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "dedupe_standby_partitions",
		Help: "Partitions this instance is a warm standby of (scale_out.standbys): it tails their changelog from the output stream into its local store, so that its takeover of one restores only the tail.",
	})
	m.sbRecords = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "dedupe_standby_records_total",
		Help: "Changelog records this instance applied to its local store as a warm standby of partitions it does not own.",
	})
	m.sbCursor = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "dedupe_standby_cursor",
		Help: "The output stream sequence up to which this instance, a warm standby of the partition, holds its changelog in its local store.",
	}, []string{"partition"})
	m.partitions = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "dedupe_group_partitions",
		Help: "The partitions of this instance's scale-out group (state.partitions), by group: sum(dedupe_partitions_owned) over the group's instances falls below it while a partition has no owner, idle or not (dedupe_group_health_partitions says which).",
	}, []string{"group"})
	for _, p := range []string{restoreSnapshot, restoreLocal, restoreFull, restoreEmpty} {
		m.restoreDur.WithLabelValues(p)
	}
	reg.MustRegister(m.bundlesOn, m.owned, m.takeovers, m.refusals, m.stale, m.restored, m.reopens, m.restoring, m.restoreDur, m.released, m.refused, m.dlRefusals, m.partitions, m.goneUnpins,
		m.members, m.sbPartitions, m.sbRecords, m.sbCursor)
	return m
}

// zeroPartitions exports the per-partition counters at 0 for each of
// partitions partitions (and dedupe_partition_refused_total for each
// reason), so that a rate over them never meets a missing series.
func (m *scaleOutMetrics) zeroPartitions(partitions int) {
	for p := range partitions {
		label := strconv.Itoa(p)
		for _, c := range []*prometheus.CounterVec{m.takeovers, m.refusals, m.dlRefusals, m.stale, m.restored, m.reopens, m.released} {
			c.WithLabelValues(label)
		}
		for _, r := range []string{refusedLimits, refusedShort} {
			m.refused.WithLabelValues(label, r)
		}
	}
}

// startTake counts a takeover of partition p in flight until done is
// called, once the partition is owned or the take failed: meanwhile the
// pin it came under is this instance's, though it does not hold the
// partition yet (takingOver reports it).
func (g *Group) startTake(p int) (done func()) { return g.countIn(&g.takes, p, nil) }

// countIn counts partition p once more in *m, under g.mu together with
// then (when not nil), and returns what counts it off again.
func (g *Group) countIn(m *map[int]int, p int, then func()) (done func()) {
	g.mu.Lock()
	if *m == nil {
		*m = map[int]int{}
	}
	(*m)[p]++
	if then != nil {
		then()
	}
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		if (*m)[p]--; (*m)[p] <= 0 {
			delete(*m, p)
		}
		g.mu.Unlock()
	}
}

// takingOver reports whether a takeover of partition p is in flight here
// (startTake).
func (g *Group) takingOver(p int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.takes[p] > 0
}

// holds reports whether this instance owns partition p now.
func (g *Group) holds(p int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.owned[p]
	return ok
}

// runRoute runs the route step until ctx is done, offering each input to
// local first (route.Options.Local). A failure to start
// it (the routed stream or the route consumer) is retried with backoff:
// the partitions' owners meanwhile judge what was routed before.
func (g *Group) runRoute(ctx context.Context, local func(msg jetstream.Msg, p int, key []byte) bool) {
	o := *g.routed
	o.Local = local
	b := retry.NewBackoff()
	for ctx.Err() == nil {
		err := route.Run(ctx, o)
		if err == nil {
			return
		}
		if g.reporter != nil {
			g.reporter.Failed(route.CompRoute, err)
		}
		g.log.Error("scale-out: the route step stopped; restarting it", "err", err)
		b.Wait(ctx)
	}
}

// Run consumes every member of the group until ctx is done, handing what the
// server delivers for partition p to deliver(msg, p), which must not wait
// long; beside it run the route step, balance and the snapshots. The route
// step hands an input of a partition this instance owns to local, and
// routes a copy when local returns false (docs/scale-out.md, "Code notes").
func (g *Group) Run(ctx context.Context, store *state.Store, deliver func(msg jetstream.Msg, p int), local func(msg jetstream.Msg, p int, key []byte) bool) {
	g.log.Info("judging messages of the partitions the server pins to this instance", "stream", g.opts.InputStream,
		"group", g.name, "instance", g.instance, "output_stream", g.outStream,
		"output_subjects", changelog.PartitionSubject(g.prefix, 0, "<input subject>"))
	var gate sync.RWMutex // held to read while dispatching, to write when stopping
	stopped := false
	var side sync.WaitGroup
	defer side.Wait()
	if g.routed != nil {
		side.Go(func() {
			g.runRoute(ctx, func(msg jetstream.Msg, p int, key []byte) bool {
				gate.RLock()
				defer gate.RUnlock()
				return !stopped && g.holds(p) && local(msg, p, key)
			})
		})
	}
	side.Go(func() { g.runSnapshots(ctx, store) })
	side.Go(func() { g.runStandbys(ctx, store) })
	m := &members{g: g, running: make(map[int]*member), handler: func(p int) func(jetstream.Msg) {
		return func(msg jetstream.Msg) {
			gate.RLock()
			defer gate.RUnlock()
			if stopped {
				_ = msg.Nak() // given back: the next owner gets it at once
				return
			}
			if g.divert(p, msg) {
				return
			}
			deliver(msg, p)
		}
	}}
	// Balance joins the members this instance is assigned, owns or
	// stands by for; without presence, every member is joined, all at
	// once: a member whose join waits on the server holds up no other.
	var pr *presence
	side.Go(func() {
		var err error
		pr, err = g.joinPresence(ctx)
		if err != nil {
			g.noPresence.Store(true)
			var joins sync.WaitGroup
			for p := range g.opts.Partitions {
				joins.Go(func() { m.ensure(ctx, p) })
			}
			joins.Wait()
			return
		}
		g.presence.Store(pr)
		g.balance(ctx, pr, m, store)
	})
	<-ctx.Done()
	// A clean stop leaves the presence bucket first: the others count one
	// less at once, so the instance each partition is assigned to next
	// pulls on it by the time it is unpinned below, whether or not it
	// stood by for it (docs/scale-out.md §7). The second leave, at the
	// end, deletes a put of the heartbeat that ran meanwhile.
	if pr := g.presence.Load(); pr != nil {
		pr.leave()
	}
	g.giveBackAll(m)
	gate.Lock()
	stopped = true
	gate.Unlock()
	side.Wait()
	g.pretakes.Wait()
	if pr != nil {
		g.presence.Store(nil)
		pr.leave()
	}
}

// ReadsHealth reports whether this instance is the one of its group that
// reads the group's status for the health gauges: the live instance whose
// name sorts first in this instance's view of the presence bucket, so that
// a group reads its status once per interval, not once per instance
// (docs/scale-out.md §13). known is false while that
// view is not there yet (the bucket not joined, its watch not synced): the
// caller then reads nothing. Without presence at all (the bucket cannot be
// joined) every instance reads, as the gauges must not go dark.
func (g *Group) ReadsHealth() (reads, known bool) {
	if g.noPresence.Load() {
		return true, true
	}
	pr := g.presence.Load()
	if pr == nil {
		return false, false
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if !pr.watching || !pr.synced {
		return false, false
	}
	now := time.Now()
	for name, at := range pr.seen {
		if name < g.instance && now.Sub(at) < pr.ttl {
			return false, true
		}
	}
	return true, true
}

// joinPresence opens the presence bucket that balance counts the live
// instances in, retrying a transient failure (a cluster busy electing a
// leader times out) until ctx is done. A permanent one leaves the group
// without balance: partitions stay with whoever the server pins first,
// which costs throughput, never correctness.
func (g *Group) joinPresence(ctx context.Context) (*presence, error) {
	var pr *presence
	err := retry.Do(ctx, "presence", func() (err error) {
		pr, err = openPresence(ctx, g.js, g.opts, g.instance, g.log)
		return err
	}, retry.Options{OnRetry: func(attempt int, err error) {
		if attempt == 1 || attempt%20 == 0 {
			g.log.Warn("scale-out: presence bucket not reachable yet; balance waits for it", "attempt", attempt, "err", err)
		}
	}})
	if err != nil && ctx.Err() == nil {
		g.log.Warn("scale-out: no presence, so no balance: partitions stay with whoever the server pins first", "err", err)
	}
	return pr, err
}

// Backlog is a member consumer's backlog: messages not yet delivered
// and delivered but not acknowledged.
type Backlog struct {
	Pending, AckPending uint64
}

// Backlog reads the backlog of each partition this instance owns now,
// from its member consumer. A partition without an owner is reported by
// dedupe_group_partitions against dedupe_partitions_owned, and by status.
func (g *Group) Backlog(ctx context.Context) (map[int]Backlog, error) {
	owned := g.ownedPartitions()
	out := make(map[int]Backlog, len(owned))
	for _, p := range owned {
		c, err := g.js.Consumer(ctx, g.inStream, layout.MemberConsumer(g.name, p))
		if err != nil {
			return nil, fmt.Errorf("partition %d's consumer: %w", p, err)
		}
		info := c.CachedInfo()
		out[p] = Backlog{Pending: info.NumPending, AckPending: uint64(info.NumAckPending)}
	}
	return out, nil
}

// pinOf asks the server which pin partition p's consumer is pinned to now
// ("" when none).
func (g *Group) pinOf(ctx context.Context, p int) (string, error) {
	if pinCheckFault != nil {
		if err := pinCheckFault(p); err != nil {
			return "", err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := g.js.Consumer(ctx, g.inStream, layout.MemberConsumer(g.name, p))
	if err != nil {
		return "", err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return "", err
	}
	for _, g := range info.PriorityGroups {
		if g.Group == pcgPriorityGroup {
			return g.PinnedClientID, nil
		}
	}
	return "", errors.New("the consumer has no priority group " + pcgPriorityGroup)
}

// Route returns the routed stream and subject the group consumes when the
// route step runs (scale_out.route); ok is false when the members consume
// the input stream itself.
func (g *Group) Route() (stream, subject string, ok bool) {
	if g.routed == nil {
		return "", "", false
	}
	return g.inStream, g.routed.RoutedSubject, true
}

// DeadLetterFenced handles dead letters the server refused because
// partition p's dead-letter fence moved: another instance took the
// partition, so the tenure of pin, the one that decided them, is lost here
// as a lost pin is (lose), and the refusal is counted.
func (g *Group) DeadLetterFenced(p int, pin string) {
	g.metrics.dlRefusals.WithLabelValues(strconv.Itoa(p)).Inc()
	g.lose(p, pin)
}

// Release has balance release partition p at once, as it does a
// partition beyond this instance's quota; it waits until balance takes
// the request. It is for tests: an operator moves partitions by starting
// and stopping instances.
func (g *Group) Release(p int) { g.releaseNow <- p }

// WriteSnapshots writes a snapshot of every partition of store this
// instance owns now, as each scale_out.snapshot_interval does, and
// returns how many it owns. It is for tests, which cannot wait for the
// interval.
func (g *Group) WriteSnapshots(ctx context.Context, store *state.Store) (int, error) {
	owned := g.ownedPartitions()
	var errs []error
	for _, p := range owned {
		errs = append(errs, g.snaps.write(ctx, store.Partition(p), g.outStream))
	}
	return len(owned), errors.Join(errs...)
}
