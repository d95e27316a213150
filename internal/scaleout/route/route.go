package route

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/batcher"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/lograte"
	"github.com/dedupe-stage/dedupe-stage/internal/pull"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/streams"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Headers the route step adds to a routed message.
const (
	// HeaderKey carries the key the route step extracted (scope included),
	// so that the stage reads it instead of deriving it again.
	HeaderKey = "Dedupe-Key"
	// HeaderInputTime carries the input stream's timestamp of the
	// original, RFC 3339 with nanoseconds, in UTC (read it with
	// InputTime): the routed stream's own timestamp is later.
	HeaderInputTime = "Dedupe-Input-Time"
	// HeaderOriginalMsgID carries the input's Nats-Msg-Id, which MsgID
	// replaces; absent when the input had none.
	HeaderOriginalMsgID = "Dedupe-Original-Msg-Id"
	// HeaderInputStream and HeaderInputSequence carry the input stream and
	// sequence of the original (as MsgID does) in headers that survive the
	// stage replacing Nats-Msg-Id on its forwarded copy: a dead letter of
	// a routed message names the input (InputOf), not the routed copy,
	// which is deleted once acked.
	HeaderInputStream   = "Dedupe-Input-Stream"
	HeaderInputSequence = "Dedupe-Input-Sequence"
)

// Health components the route step reports to Options.Reporter.
const (
	// CompRoute: publishes to the routed stream.
	CompRoute = "route"
	// CompRouteDeadLetter: the route step's dead letters.
	CompRouteDeadLetter = "route_dead_letter"
)

// Defaults of Options.
const (
	DefaultBatchSize       = 256
	DefaultBatchesInFlight = 4
	DefaultAckWait         = 10 * time.Second
	DefaultMaxAckPending   = 4096
	DefaultRestartMargin   = streams.DefaultRestartMargin
	DefaultShutdownTimeout = 10 * time.Second
)

// Options configure Run.
type Options struct {
	// Conn is the NATS connection. Required; the caller closes it.
	Conn *nats.Conn
	// NewJetStream makes the JetStream API on Conn (the stage passes
	// config.NATS.NewJetStream, which applies the JetStream domain).
	// Default jetstream.New.
	NewJetStream func(*nats.Conn, ...jetstream.JetStreamOpt) (jetstream.JetStream, error)
	// InputStream is the stream read. Required.
	InputStream string
	// Group names the route consumer, ConsumerName(Group). Required.
	Group string
	// Partitions is N, the group's partition count. Required, at least 1.
	Partitions int
	// RoutedStream is the routed stream, checked at start (CheckStream).
	// Required; StreamConfig says how to create it.
	RoutedStream string
	// RoutedSubject is the routed subject root (Subject). Required.
	RoutedSubject string
	// Key extracts the key, exactly as the stage does. Required.
	Key *keys.KeyFunc
	// PartitionKey, if set, returns the partition key of a message whose
	// key is key (with totals, the group). An error whose chain holds a
	// *keys.Error dead-letters the message with that Reason and Detail;
	// any other with deadletter.ReasonNoPartitionKey. Default: the key itself.
	PartitionKey func(subject string, hdr nats.Header, data []byte, key []byte) ([]byte, error)
	// DeadLetterSubject returns the dead-letter subject of a reason
	// (config.DeadLetter.SubjectFor). Required.
	DeadLetterSubject func(reason string) string
	// MaxMessageBytes dead-letters inputs with a larger payload
	// (pipeline.max_message_bytes). Default 0: only the server's limit.
	MaxMessageBytes int64
	// Local, if set, is offered every input the route step can route,
	// with its partition and key, before a copy is made. It returns true
	// when it took the input: the caller judges it in this instance (whose
	// partition it is) and acks, naks or dead-letters it; the route step
	// neither copies nor acks it and counts it OutcomeLocal. False routes
	// a copy, as without it.
	Local func(msg jetstream.Msg, p int, key []byte) bool

	// BatchSize is the most messages routed together (published with all
	// in flight, then acked). Default DefaultBatchSize.
	BatchSize int
	// BundleMax, above 1, routes a batch's copies of one partition as
	// bundles of up to BundleMax (Unbundle), one routed message each.
	// Default 0: every copy a message of its own. A member of a version
	// that does not read a bundle's form dead-letters it (not_routed).
	BundleMax int
	// BundleForm is asked before each batch with copies which bundle form
	// every instance that reads the routed stream reads now: BundleForm2
	// or BundleForm1, or 0 to route the batch's copies alone. Default:
	// always BundleForm2.
	BundleForm func() int
	// BatchLinger is how long a batch waits to fill; 0 takes what is
	// already delivered. Default 0.
	BatchLinger time.Duration
	// BatchesInFlight is how many batches are routed at once, each by its
	// own goroutine: a batch waits a replicated write's round trip for
	// its copies to be stored, and the batches behind it use that time.
	// Default DefaultBatchesInFlight.
	BatchesInFlight int
	// AckWait of the route consumer. Default DefaultAckWait.
	AckWait time.Duration
	// MaxAckPending of the route consumer, shared by all instances.
	// Default DefaultMaxAckPending.
	MaxAckPending int
	// RestartMargin is how long a router's restart may take; with AckWait
	// it sets the routed stream's required duplicate window. Default
	// DefaultRestartMargin.
	RestartMargin time.Duration
	// ShutdownTimeout bounds finishing the batch in flight after ctx ends;
	// what is not finished stays unacked and comes back. Default
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration

	// Registry receives the route step's metrics (NewMetrics). Default: a
	// new registry that is not served.
	Registry prometheus.Registerer
	// Logger: default slog.Default().
	Logger *slog.Logger
	// Logs rate-limits the lines of per-message and per-batch events
	// (reasons prefixed route_); they get the attribute component=route.
	// Default: a limiter of lograte.DefaultOptions on Logger, its counters
	// on Registry, flushed while Run runs.
	Logs *lograte.Limiter
	// Reporter hears every attempt of CompRoute and CompRouteDeadLetter,
	// for health. Default: nobody.
	Reporter retry.Reporter

	// withholdAck, when set, is asked before each ack; true leaves the
	// message unacked. For tests only.
	withholdAck func(jetstream.Msg) bool
}

// Validate reports what is missing or out of range, naming each field.
func (o Options) Validate() error {
	var errs []error
	missing := func(field string, bad bool) {
		if bad {
			errs = append(errs, fmt.Errorf("route: Options.%s is required", field))
		}
	}
	missing("Conn", o.Conn == nil)
	missing("InputStream", o.InputStream == "")
	missing("Group", o.Group == "")
	missing("RoutedStream", o.RoutedStream == "")
	missing("RoutedSubject", o.RoutedSubject == "")
	missing("Key", o.Key == nil)
	missing("DeadLetterSubject", o.DeadLetterSubject == nil)
	if o.Partitions < 1 {
		errs = append(errs, fmt.Errorf("route: Options.Partitions is %d, want at least 1", o.Partitions))
	}
	for field, v := range map[string]int64{"BatchSize": int64(o.BatchSize), "BatchesInFlight": int64(o.BatchesInFlight), "MaxAckPending": int64(o.MaxAckPending),
		"MaxMessageBytes": o.MaxMessageBytes, "AckWait": int64(o.AckWait), "BatchLinger": int64(o.BatchLinger),
		"RestartMargin": int64(o.RestartMargin), "ShutdownTimeout": int64(o.ShutdownTimeout)} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("route: Options.%s is negative (%d)", field, v))
		}
	}
	return errors.Join(errs...)
}

// withDefaults returns o with its defaults filled in.
func (o Options) withDefaults() Options {
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.BatchesInFlight == 0 {
		o.BatchesInFlight = DefaultBatchesInFlight
	}
	if o.BundleForm == nil {
		o.BundleForm = func() int { return BundleForm2 }
	}
	if o.AckWait == 0 {
		o.AckWait = DefaultAckWait
	}
	if o.MaxAckPending == 0 {
		o.MaxAckPending = DefaultMaxAckPending
	}
	if o.RestartMargin == 0 {
		o.RestartMargin = DefaultRestartMargin
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o.NewJetStream == nil {
		o.NewJetStream = jetstream.New
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Run routes the input until ctx is done, then finishes the batch in flight
// (within Options.ShutdownTimeout) and returns nil. It first checks the
// routed stream (CheckStream) and creates or updates the route consumer;
// an error there is returned at once.
func Run(ctx context.Context, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	o = o.withDefaults()
	js, err := o.NewJetStream(o.Conn, jetstream.WithPublishAsyncMaxPending(max(o.BatchSize, 256)))
	if err != nil {
		return fmt.Errorf("route: jetstream: %w", err)
	}
	st, err := js.Stream(ctx, o.RoutedStream)
	if err != nil {
		return fmt.Errorf("route: routed stream %s: %w", o.RoutedStream, err)
	}
	if err := CheckStream(st.CachedInfo().Config, o.RoutedSubject, o.Partitions, o.AckWait, o.RestartMargin); err != nil {
		return err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, o.InputStream, jetstream.ConsumerConfig{
		Durable:       ConsumerName(o.Group),
		Description:   "dedupe-stage route step, shared by every instance of group " + o.Group,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       o.AckWait,
		MaxAckPending: o.MaxAckPending,
		MaxDeliver:    -1,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("route: consumer %s on stream %s: %w", ConsumerName(o.Group), o.InputStream, err)
	}
	metrics, log := NewMetrics(o.Registry), o.Logger.With("component", "route")
	logs := o.Logs
	if logs == nil {
		root := lograte.New(o.Logger, lograte.DefaultOptions(), o.Registry)
		logs = root
		var flushed sync.WaitGroup
		flushCtx, stopFlush := context.WithCancel(context.Background())
		flushed.Go(func() { root.Run(flushCtx) })
		defer flushed.Wait()
		defer stopFlush()
	}
	logs = logs.With("component", "route")
	atomic := st.CachedInfo().Config.AllowAtomicPublish
	if !atomic {
		log.Warn("the routed stream does not allow atomic publish, so each routed copy is its own publish; allow it (AllowAtomicPublish) to route a batch in one",
			"routed_stream", o.RoutedStream)
	}

	// The batches in flight run on their own context: a stop finishes
	// them, and only the shutdown timeout abandons them (unacked, so they
	// come back).
	work, abandon := context.WithCancel(context.Background())
	defer abandon()
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(o.ShutdownTimeout, abandon) })
	defer stopTimer()

	// BatchesInFlight routers share in, each gathering and routing its own
	// batches: the order of routed copies is not kept, and need not be
	// (the package comment).
	in := make(chan jetstream.Msg, o.BatchSize)
	var routers sync.WaitGroup
	for range o.BatchesInFlight {
		r := &router{o: o, js: js, metrics: metrics, logs: logs, atomic: atomic, maxMsgSize: st.CachedInfo().Config.MaxMsgSize}
		r.dead = r.deadLetterPublisher()
		routers.Go(func() {
			batcher.Run(in, o.BatchSize, o.BatchLinger, func(batch []jetstream.Msg) { r.process(work, batch) })
		})
	}
	log.Info("routing", "stream", o.InputStream, "consumer", ConsumerName(o.Group), "partitions", o.Partitions,
		"routed_stream", o.RoutedStream, "routed_subjects", Subject(0, o.RoutedSubject, "<input subject>"), "key", o.Key.Config().String(),
		"batches_in_flight", o.BatchesInFlight)
	var polled sync.WaitGroup
	polled.Go(func() { pollPending(ctx, cons, metrics) })
	pull.Run(ctx, cons, pull.Options{MaxMessages: min(o.MaxAckPending, (o.BatchesInFlight+1)*o.BatchSize), AckWait: o.AckWait, Logger: log, Conn: o.Conn},
		func(msg jetstream.Msg) { in <- msg })
	close(in)
	polled.Wait()
	routers.Wait()
	log.Info("route step stopped: batch in flight finished")
	return nil
}

// pollPending exports the route consumer's backlog every few seconds
// until ctx is done.
func pollPending(ctx context.Context, cons jetstream.Consumer, m *Metrics) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := cons.Info(rctx)
		cancel()
		if err == nil {
			m.Pending.WithLabelValues("pending").Set(float64(info.NumPending))
			m.Pending.WithLabelValues("ack_pending").Set(float64(info.NumAckPending))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// router routes batches. One goroutine calls process; the routers of one
// Run share their metrics.
type router struct {
	o       Options
	js      jetstream.JetStream
	metrics *Metrics
	logs    *lograte.Limiter // per-batch and per-message lines
	atomic  bool             // the routed stream allows atomic publish
	// maxMsgSize is the routed stream's max_msg_size (0 or -1: none).
	maxMsgSize int32

	// per batch, reused
	out      []routedCopy
	pub      []*nats.Msg // what is published: copies alone, or bundles of them
	es       []entry     // the form-2 entries of the bundle group is making
	held     []int       // indexes into out, pub by pub (carried)
	ends     []int       // pub[k] carries out[held[ends[k-1]:ends[k]]]
	res      []forward.Result
	dls      []deadletter.Letter
	dead     *deadletter.Publisher // publishes dls, and a copy's input refused for good
	progress batcher.Progress      // paces the batch's InProgress signals
}

// routedCopy is the routed copy of one input of a batch: what the route
// step adds to the input, and the copy alone once built (copyOf).
type routedCopy struct {
	msg    *nats.Msg // the copy alone; nil until copyOf builds it
	i      int       // the input's index in the batch
	p      int       // the input's partition
	seq    uint64    // the input's stream sequence
	stream string    // the input's stream
	key    string
	at     time.Time // the input's stream timestamp
}

// process routes one batch: build every copy, publish them all in flight,
// ack each input once its copy is stored, and dead-letter what cannot be
// routed (beside the copies, in flight at the same time). If ctx ends while the routed stream keeps failing, the rest is
// left unacked and comes back after AckWait.
func (r *router) process(ctx context.Context, batch []jetstream.Msg) {
	r.out, r.dls = r.out[:0], r.dls[:0]
	r.progress.Start(time.Now())
	maxPayload := r.o.Conn.MaxPayload()
	for i, msg := range batch {
		c, dl := r.routed(msg)
		if c.stream == "" && dl == nil { // taken by Options.Local (a copy has its input's stream)
			r.metrics.Messages.WithLabelValues(OutcomeLocal).Inc()
			continue
		}
		if dl == nil {
			if err := r.checkAlone(msg, &c, maxPayload); err != nil {
				dl = &deadletter.Letter{Msg: msg, Reason: deadletter.ReasonOversized, Detail: "the routed copy (with the route step's headers) cannot be published: " + err.Error()}
			}
		}
		if dl != nil {
			r.dls = append(r.dls, *dl)
			continue
		}
		c.i = i
		r.out = append(r.out, c)
	}
	// The batch's dead letters are stored beside its routed copies, in
	// flight at the same time.
	var dead sync.WaitGroup
	if len(r.dls) > 0 {
		dead.Go(func() { r.dead.Publish(ctx, r.dls) })
	}
	defer func() {
		dead.Wait()
		clear(r.dls)
	}()
	if len(r.out) == 0 {
		return
	}
	r.group(batch, r.bundleBytes(maxPayload))
	if alone := r.publish(ctx, batch, true); len(alone) > 0 {
		// A bundle the routed stream refused for good: its inputs are
		// routed again as copies alone, which it judges one by one.
		r.pub, r.held, r.ends = r.pub[:0], r.held[:0], r.ends[:0]
		for _, k := range alone {
			r.add(r.copyOf(batch, k), k)
		}
		r.publish(ctx, batch, false)
	}
	clear(r.out)
	clear(r.pub)
	clear(r.es)
}

// publish publishes pub, all in flight, and settles the inputs each
// carries: acked once stored, dead-lettered when the routed stream
// refuses a copy alone for good, left unacked when not done. With
// bundles, a bundle refused for good is not dead-lettered: publish
// returns the indexes into out of its copies, to be routed alone.
func (r *router) publish(ctx context.Context, batch []jetstream.Msg, bundles bool) (alone []int) {
	r.res = append(r.res[:0], make([]forward.Result, len(r.pub))...)
	err := forward.Batch(ctx, r.js, r.pub, r.res, forward.Options{
		Component: CompRoute,
		Retry:     retry.Options{Reporter: r.o.Reporter, Pause: func() { keepAlive(batch, &r.progress, r.o.AckWait) }},
		OnRetry: func(attempt, failed int, err error) {
			r.logs.Warn("route_publish_retry", "routed publishes failed, retrying; nothing is acked meanwhile", "attempt", attempt, "failed", failed, "err", err)
		},
		Atomic:     r.atomic,
		OnFallback: r.fallback,
	})
	if err != nil {
		r.logs.Warn("route_batch_unfinished", "stopping with routed publishes unsettled; their inputs stay unacked and come back", "err", err)
	}
	for k, res := range r.res {
		ks := r.carried(k)
		switch {
		case !res.Done:
			continue
		case res.Err != nil && bundles && len(ks) > 1:
			r.logs.Warn("route_bundle_refused", "the routed stream refused a bundle; its inputs are routed as copies alone", "copies", len(ks), "err", res.Err)
			alone = append(alone, ks...)
			continue
		case res.Err == nil && !res.Duplicate:
			r.metrics.Copies.Observe(float64(len(ks)))
		}
		for _, o := range ks {
			msg := batch[r.out[o].i]
			switch {
			case res.Err != nil:
				r.dead.Publish(ctx, []deadletter.Letter{{Msg: msg, Reason: deadletter.ReasonRoutedRejected, Detail: deadletter.Describe(res.Err)}})
			case res.Duplicate:
				r.ack(msg, OutcomeDuplicate)
			default:
				r.ack(msg, OutcomeRouted)
			}
		}
	}
	return alone
}

// add appends m to what the batch publishes, carrying the copies out[ks].
func (r *router) add(m *nats.Msg, ks ...int) {
	r.pub = append(r.pub, m)
	r.held = append(r.held, ks...)
	r.ends = append(r.ends, len(r.held))
}

// carried returns the indexes into out of the copies pub[k] carries.
func (r *router) carried(k int) []int {
	from := 0
	if k > 0 {
		from = r.ends[k-1]
	}
	return r.held[from:r.ends[k]]
}

// bundleBytes is the most bytes a bundle may have: the server's
// maxPayload, or the routed stream's max_msg_size when it is smaller.
func (r *router) bundleBytes(maxPayload int64) int64 {
	if m := int64(r.maxMsgSize); m > 0 && m < maxPayload {
		return m
	}
	return maxPayload
}

// group sets what the batch publishes: with Options.BundleMax above 1
// and Options.Bundles true, one bundle per partition holding up to
// BundleMax of its copies and at most maxPayload bytes; a partition with
// one copy, or without bundles, publishes its copies as they are.
func (r *router) group(batch []jetstream.Msg, maxPayload int64) {
	r.pub, r.held, r.ends = r.pub[:0], r.held[:0], r.ends[:0]
	form := 0
	if r.o.BundleMax > 1 {
		form = r.o.BundleForm()
	}
	if form != BundleForm1 && form != BundleForm2 {
		for k := range r.out {
			r.add(r.copyOf(batch, k), k)
		}
		return
	}
	byPart := make(map[int][]int, r.o.Partitions) // partition -> indexes into out
	order := make([]int, 0, r.o.Partitions)
	for k, c := range r.out {
		if _, ok := byPart[c.p]; !ok {
			order = append(order, c.p)
		}
		byPart[c.p] = append(byPart[c.p], k)
	}
	for _, p := range order {
		ks := byPart[p]
		for len(ks) > 0 {
			n, size := 0, bundleOverhead(r.o.InputStream)
			r.es = r.es[:0]
			for n < len(ks) && n < r.o.BundleMax {
				var e entry
				var add int
				if form == BundleForm2 {
					e = r.entry(batch, ks[n])
					add = bundleSize2(e)
				} else {
					add = bundleSize(r.copyOf(batch, ks[n]), batch[r.out[ks[n]].i].Subject())
				}
				if n > 0 && int64(size+add) > maxPayload {
					break
				}
				if form == BundleForm2 {
					r.es = append(r.es, e)
				}
				size += add
				n++
			}
			r.bundle(batch, ks[:n], size, form)
			ks = ks[n:]
		}
	}
}

// bundle adds the bundle, of form, of the copies out[ks] to what the
// batch publishes (the copy itself when there is one); size bounds its
// bytes, and with form 2 r.es holds their entries. Its id names the inputs by their sequences in the input stream,
// the stream the route consumer reads (Options.InputStream), as MsgID
// does.
func (r *router) bundle(batch []jetstream.Msg, ks []int, size, form int) {
	if len(ks) == 1 {
		r.add(r.copyOf(batch, ks[0]), ks[0])
		return
	}
	seqs := make([]uint64, len(ks))
	for j, k := range ks {
		seqs[j] = r.out[k].seq
	}
	first := r.out[ks[0]]
	m := &nats.Msg{Subject: Subject(first.p, r.o.RoutedSubject, batch[first.i].Subject()),
		Header: nats.Header{HeaderBundle: {strconv.Itoa(form)}, jetstream.MsgIDHeader: {BundleID(r.o.InputStream, seqs)}}}
	if form == BundleForm2 {
		m.Data = appendBundle2(make([]byte, 0, size), r.o.InputStream, r.es, forward.IsDirective)
	} else {
		copies := make([]*nats.Msg, len(ks))
		subjects := make([]string, len(ks))
		for j, k := range ks {
			copies[j], subjects[j] = r.copyOf(batch, k), batch[r.out[k].i].Subject()
		}
		m.Data = appendBundle(make([]byte, 0, size), copies, subjects)
	}
	r.add(m, ks...)
}

// entry is the form-2 bundle entry of the input of out[k].
func (r *router) entry(batch []jetstream.Msg, k int) entry {
	c, in := r.out[k], batch[r.out[k].i]
	return entry{subject: in.Subject(), header: in.Headers(), data: in.Data(), seq: c.seq, at: c.at.UnixNano(), key: c.key}
}

// copyOf returns the routed copy alone of out[k], building it the first
// time.
func (r *router) copyOf(batch []jetstream.Msg, k int) *nats.Msg {
	c := &r.out[k]
	if c.msg == nil {
		in := batch[c.i]
		c.msg = &nats.Msg{Subject: Subject(c.p, r.o.RoutedSubject, in.Subject()),
			Header: copyHeader(in.Headers(), c.key, c.stream, c.seq, c.at), Data: in.Data()}
	}
	return c.msg
}

// copyHeaderBound bounds what copyHeader adds to an input's headers
// besides the key and the stream's name (twice): the six names, their
// framing, a sequence twice, a time, and the status line of an input
// without headers.
const copyHeaderBound = 256

// checkAlone returns nil when c, the routed copy of in, alone fits the
// server's maxPayload and JetStream's header limit (forward.CheckSize);
// it builds the copy to check it only when a bound of its size does not
// fit.
func (r *router) checkAlone(in jetstream.Msg, c *routedCopy, maxPayload int64) error {
	hdr := forward.HeaderSize(in.Headers()) + copyHeaderBound + len(c.key) + 2*len(c.stream)
	if hdr <= retry.MaxHeaderBytes && (maxPayload <= 0 || int64(hdr+len(in.Data())) <= maxPayload) {
		return nil
	}
	m := &nats.Msg{Subject: Subject(c.p, r.o.RoutedSubject, in.Subject()),
		Header: copyHeader(in.Headers(), c.key, c.stream, c.seq, c.at), Data: in.Data()}
	if err := forward.CheckSize(m, maxPayload); err != nil {
		return err
	}
	c.msg = m
	return nil
}

// routed returns what the routed copy of msg adds to it (its partition,
// sequence, stream, key and time; its batch index is the caller's to
// set; copyOf builds the copy alone), or says why it cannot be routed;
// neither (the zero routedCopy, no dead letter) when Options.Local took
// msg.
func (r *router) routed(msg jetstream.Msg) (routedCopy, *deadletter.Letter) {
	data := msg.Data()
	if limit := r.o.MaxMessageBytes; limit > 0 && int64(len(data)) > limit {
		return routedCopy{}, &deadletter.Letter{Msg: msg, Reason: deadletter.ReasonOversized,
			Detail: fmt.Sprintf("payload is %d bytes, pipeline.max_message_bytes is %d", len(data), limit)}
	}
	md, err := msg.Metadata()
	if err != nil {
		return routedCopy{}, &deadletter.Letter{Msg: msg, Reason: deadletter.ReasonNoMetadata, Detail: err.Error()}
	}
	subject, in := msg.Subject(), msg.Headers()
	key, err := r.o.Key.Key(subject, in, data)
	if err != nil {
		return routedCopy{}, keyDeadLetter(msg, err, deadletter.ReasonNoKey)
	}
	pkey := key
	if r.o.PartitionKey != nil {
		if pkey, err = r.o.PartitionKey(subject, in, data, key); err != nil {
			return routedCopy{}, keyDeadLetter(msg, err, deadletter.ReasonNoPartitionKey)
		}
	}
	p := state.PartitionFNV(pkey, r.o.Partitions)
	if r.o.Local != nil && r.o.Local(msg, p, key) {
		return routedCopy{}, nil
	}
	return routedCopy{p: p, seq: md.Sequence.Stream, stream: md.Stream, key: string(key), at: md.Timestamp}, nil
}

// keyDeadLetter is the dead letter of a key or partition key that cannot
// be extracted: the keys.Error's reason and detail, or fallback and the
// error's text.
func keyDeadLetter(msg jetstream.Msg, err error, fallback deadletter.Reason) *deadletter.Letter {
	reason, detail := deadletter.KeyReason(err, fallback)
	return &deadletter.Letter{Msg: msg, Reason: reason, Detail: detail}
}

// ack acks msg (unless a test withholds it) and counts its outcome.
func (r *router) ack(msg jetstream.Msg, outcome string) {
	if r.o.withholdAck == nil || !r.o.withholdAck(msg) {
		_ = msg.Ack()
	}
	r.metrics.Messages.WithLabelValues(outcome).Inc()
}

// keepAlive tells the server that msgs are still being worked on, once a
// third of ackWait has passed since it last did (batcher.Progress).
func keepAlive(msgs []jetstream.Msg, p *batcher.Progress, ackWait time.Duration) {
	if !p.Due(ackWait) {
		return
	}
	for _, m := range msgs {
		_ = m.InProgress()
	}
}

// fallback logs a batch of routed copies the routed stream refused as a
// whole, which forward then publishes one copy at a time. A copy already
// in the duplicate window (an input redelivered after its copy was
// stored) is expected; any other refusal is a warning.
func (r *router) fallback(messages int, err error) {
	r.logs.Log(context.Background(), deadletter.FallbackLevel(err), "route_atomic_fallback", "routed stream refused a batch of copies; publishing them one at a time",
		"messages", messages, "err", deadletter.Describe(err))
}

// deadLetterPublisher is the route step's dead-letter publisher
// (deadletter.Publisher): not atomic, never fenced (the route
// step owns no partition), each input its own; a letter settled is counted
// by reason and its input acked as dead-lettered or unstorable. It runs
// beside the batch's routed publishes, so it keeps its own inputs alive.
func (r *router) deadLetterPublisher() *deadletter.Publisher {
	return &deadletter.Publisher{
		JS: r.js, Conn: r.o.Conn, Component: CompRouteDeadLetter, Reporter: r.o.Reporter, Logs: r.logs,
		AckWait: r.o.AckWait, Subject: r.o.DeadLetterSubject, Note: deadletter.OmittedRoute,
		Done: func(dl deadletter.Letter, unstorable bool) {
			outcome := OutcomeDeadLetter
			if unstorable {
				outcome = OutcomeUnstorable
			}
			r.metrics.DeadLetters.WithLabelValues(string(dl.Reason)).Inc()
			r.ack(dl.Msg, outcome)
		},
	}
}
