package stage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/admin"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/lograte"
	"github.com/dedupe-stage/dedupe-stage/internal/ownership"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// DefaultShutdownTimeout bounds how long a graceful stop may spend finishing
// the batch in flight when the output or the store keeps failing. What is
// not finished then is left unacked and comes back after AckWait.
const DefaultShutdownTimeout = 30 * time.Second

// Options configure New.
type Options struct {
	// Config is the validated service configuration.
	Config config.Config
	// Conn is the NATS connection to use. Required. The caller closes it
	// after Close.
	Conn *nats.Conn
	// Registry receives the stage's metrics, registered with MustRegister
	// like every metric in this project: a registry that already holds them
	// (a second stage on one registry) is a programming error and panics.
	// Default: a new registry that is not served.
	Registry prometheus.Registerer
	// Logger receives the stage's logs. Default slog.Default().
	Logger *slog.Logger
	// Clock tells the time for window judgements. Default window.SystemClock.
	Clock window.Clock
	// Health, if set, is updated as the stage becomes ready and healthy,
	// follows Conn (the nats component) and gets the store for
	// inspection. Default: a private one.
	Health *Health
	// ShutdownTimeout: default DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// FilterProgressInterval is how often a filter rebuild at start logs its
	// progress and updates dedupe_filter_rebuild_keys_scanned. Default
	// state.DefaultFilterProgressInterval.
	FilterProgressInterval time.Duration
	// InputTime, if set, gives each message its input time: the stage
	// judges it at InputTime(msg, stored) instead of stored, the time the
	// input stream stored it. Every age, window end and totals bucket
	// without totals.time follows it, as it follows the input stream's
	// clock without it. `dedupe-stage test` sets it to the time offset of
	// each message of a case; run leaves it nil.
	InputTime func(msg jetstream.Msg, stored time.Time) time.Time
}

// Stage is a running dedupe stage. Run processes messages; Close releases
// the store. Its methods are safe for concurrent use.
type Stage struct {
	cfg     config.Config
	log     *slog.Logger
	logs    *lograte.Limiter // log: the lines of per-message and per-batch events, rate-limited
	clock   window.Clock
	win     window.Window
	nc      *nats.Conn
	js      jetstream.JetStream
	src     source // where the messages come from: one consumer, or a scale-out group
	store   *state.Store
	keyFn   *keys.KeyFunc
	version *keys.Versioner // key.version; nil when versions are off
	metrics *Metrics
	status  *Health
	totals  *totals // nil when totals are off

	maxDeliver         int
	ackWait            time.Duration
	shutdownTimeout    time.Duration
	fpMismatchIsRepeat bool // treat fingerprint mismatches as repeats instead of dead-lettering them
	refresh            bool // window.refresh_on_repeat: a repeat moves its key's window

	atomicOutput bool // publish the output as atomic batches (outputPublish)
	// atomicDeadLetters: publish dead letters as atomic batches
	// (deadLetterPublish).
	atomicDeadLetters bool
	outputBatches     *forward.Limiter // bounds the atomic batches open on the output stream

	beforePublish func(partition, batchLen int) // test hook
	// inputTimeHook (Options.InputTime) gives a message its input time
	// instead of the time the input stream stored it.
	inputTimeHook func(msg jetstream.Msg, stored time.Time) time.Time
	turns         turns             // a partition's batches and its operator actions, one at a time
	owners        []ownership.Owner // each partition's, used in its turn: by its worker, or an operator's forget

	outMu  sync.Mutex
	outStr jetstream.Stream // the output stream, looked up on first need (outputStream)

	running     atomic.Bool
	lastBacklog atomic.Pointer[inputBacklog] // pollPending's last read, for Status
	closeOnce   sync.Once
	closeErr    error
}

// New checks the configuration against the servers, creates the streams
// when configured to, binds the durable consumer, checks the output
// stream's duplicate window and opens the state store. It returns only
// after every partition's filter answers "maybe" for every unexpired key in
// the store. On error it releases what it opened.
func New(ctx context.Context, opts Options) (*Stage, error) {
	cfg := opts.Config
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if opts.Conn == nil {
		return nil, errors.New("stage: Options.Conn is nil")
	}
	s, reg := newStage(opts)
	s.status.watchConn(s.nc)
	var err error
	if s.win, err = cfg.Window.Derive(); err != nil {
		return nil, fmt.Errorf("window: %w", err)
	}
	s.log.Info("dedupe window derived", "window", s.win.W, "how", s.win.String())
	if s.keyFn, err = keys.NewKeyFunc(cfg.Key); err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	if cfg.Key.Version.Enabled() {
		if s.version, err = keys.NewVersioner(cfg.Key.Version); err != nil {
			return nil, fmt.Errorf("key.version: %w", err)
		}
	}
	s.refresh = cfg.Window.RefreshOnRepeat
	s.js, err = cfg.NATS.NewJetStream(s.nc,
		jetstream.WithPublishAsyncMaxPending(cfg.Pipeline.MaxPublishInFlight),
		jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if err := s.checkServers(ctx); err != nil {
		return nil, err
	}
	if err := s.src.open(ctx, s, reg); err != nil {
		return nil, err
	}

	s.status.declare(CompPublish, CompDeadLetter, CompLookup, CompCommit)
	if cfg.Totals.Enabled {
		s.status.declare(CompTotalsFlush)
	}
	s.metrics = NewMetrics(reg, s.win.W.Seconds(), s.status)
	s.metrics.ZeroPartitions(cfg.State.Partitions)
	s.log.Info("server limits", "max_payload", s.nc.MaxPayload(), "max_header_bytes", retry.MaxHeaderBytes)
	if err := s.openState(ctx, reg, opts.FilterProgressInterval); err != nil {
		return nil, err
	}
	if err := s.src.prepare(ctx); err != nil {
		s.Close()
		return nil, err
	}
	s.owners = make([]ownership.Owner, s.store.Partitions())
	for i := range s.owners {
		s.owners[i] = s.src.owner(s.store.Partition(i))
	}
	return s, nil
}

// newStage returns the stage of opts with its defaults filled in, and the
// registry its metrics go on.
func newStage(opts Options) (*Stage, prometheus.Registerer) {
	cfg := opts.Config
	s := &Stage{
		cfg:                cfg,
		log:                opts.Logger,
		clock:              opts.Clock,
		nc:                 opts.Conn,
		src:                sourceFor(cfg),
		status:             opts.Health,
		shutdownTimeout:    opts.ShutdownTimeout,
		inputTimeHook:      opts.InputTime,
		fpMismatchIsRepeat: cfg.Pipeline.OnFingerprintMismatch == config.FingerprintRepeat,
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.clock == nil {
		s.clock = window.SystemClock{}
	}
	if s.status == nil {
		s.status = &Health{}
	}
	if s.shutdownTimeout <= 0 {
		s.shutdownTimeout = DefaultShutdownTimeout
	}
	s.turns = newTurns(cfg.State.Partitions)
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	s.logs = lograte.New(s.log, lograte.DefaultOptions(), reg)
	return s, reg
}

// checkServers checks the configuration against the servers: it creates
// the streams when configured to (else checks that they exist), binds the
// source's consumer (source.bind), checks the output stream's duplicate
// window, and chooses how the output and the dead letters are published.
func (s *Stage) checkServers(ctx context.Context) error {
	cfg := s.cfg
	var err error
	if cfg.NATS.ShouldCreateStreams() {
		if err := ensureStreams(ctx, s.js, cfg, s.log); err != nil {
			return err
		}
	} else if err := checkStreamsExist(ctx, s.js, cfg); err != nil {
		return err
	}
	warnStreams(ctx, s.js, cfg, s.log)
	consumerCfg, err := s.src.bind(ctx, s)
	if err != nil {
		return err
	}
	s.maxDeliver, s.ackWait = consumerCfg.MaxDeliver, consumerCfg.AckWait
	if s.maxDeliver > 0 {
		s.log.Warn("consumer limits deliveries: the last allowed delivery of a message is dead-lettered instead of risking its loss", "max_deliver", s.maxDeliver)
	}
	if err := checkDuplicateWindow(ctx, s.js, cfg, consumerCfg, s.log); err != nil {
		return err
	}
	if s.atomicOutput, err = outputPublish(ctx, s.js, cfg, s.log); err != nil {
		return err
	}
	if s.atomicDeadLetters, err = deadLetterPublish(ctx, s.js, cfg, s.log); err != nil {
		return err
	}
	s.outputBatches = forward.NewLimiter(cfg.Output.MaxBatchesInFlight)
	return nil
}

// openState opens the state store, which returns once every partition's
// filter answers "maybe" for every unexpired key in it, and the totals.
// On error it releases what it opened.
func (s *Stage) openState(ctx context.Context, reg prometheus.Registerer, progressEvery time.Duration) error {
	cfg := s.cfg
	started := time.Now()
	stateOpts := cfg.StateOptions(s.win)
	stateOpts.Clock = s.clock
	stateOpts.Logger = s.log.With("component", "state")
	stateOpts.FilterProgressInterval = progressEvery
	stateOpts.OnFilterProgress = newFilterProgressMetric(reg)
	if err := state.CheckRouting(stateOpts.Dir, stateOpts.Partitions, cfg.Routing()); err != nil {
		return err
	}
	var err error
	if s.store, err = state.Open(ctx, stateOpts); err != nil {
		if de := (*state.DamageError)(nil); errors.As(err, &de) {
			s.log.Error("the store is damaged: refusing to judge with it (state.on_damage: refuse)", "file", de.File, "err", de.Err)
			return fmt.Errorf("%w; %s (docs/failures.md, \"A damaged store\")", err, de.Fix("state.on_damage"))
		}
		return layoutRefusal(err)
	}
	if aside := s.store.MovedAside(); aside != "" {
		s.log.Warn("the store was damaged and was rebuilt empty (state.on_damage: rebuild): every partition is restored from the output stream before any message is judged",
			"damaged_store", aside)
	}
	reg.MustRegister(NewStoreCollector(s.store))
	if err := s.openTotals(ctx, reg); err != nil {
		s.store.Close()
		return err
	}
	s.status.setStore(s.store, s.win)
	s.log.Info("state open, filters ready", "dir", stateOpts.Dir, "partitions", stateOpts.Partitions,
		"filter", cfg.Filter.Enabled, "keys_in_filters", s.store.Stats().FilterKeys, "took", time.Since(started).Round(time.Millisecond))
	return nil
}

// outputStream returns the output stream, looked up once.
func (s *Stage) outputStream(ctx context.Context) (jetstream.Stream, error) {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	if s.outStr == nil {
		st, err := s.js.Stream(ctx, s.cfg.Output.Stream)
		if err != nil {
			return nil, fmt.Errorf("look up output stream %s: %w", s.cfg.Output.Stream, err)
		}
		s.outStr = st
	}
	return s.outStr, nil
}

// Store returns the stage's state store.
func (s *Stage) Store() *state.Store { return s.store }

// Window returns the derived dedupe window.
func (s *Stage) Window() window.Window { return s.win }

// item is one message routed to a partition.
type item struct {
	msg jetstream.Msg
	key []byte
	fp  uint64
	tot state.Contribution // what it adds to its total when new; zero when totals are off
	pin string             // the pin it was delivered under ("" for none)
	// subject is the input subject its source recorded for a copy
	// (arrival.subject); "" means msg.Subject().
	subject string
	// version is the message's version (key.version) when versioned.
	version   uint64
	versioned bool
	// at is the message's input time: when the input stream stored it
	// (for a copy, its original), on the input stream's clock. Every age
	// is judged at it, never at the stage's clock.
	at time.Time
}

// inputSubject returns the subject the message had in the input stream.
func (it *item) inputSubject() string {
	if it.subject != "" {
		return it.subject
	}
	return it.msg.Subject()
}

// Run consumes the input until ctx is done, then stops fetching, finishes
// the batches in flight (publish, commit, ack), and returns nil. Run may be
// called once.
func (s *Stage) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("stage: Run called twice")
	}
	// Work in flight runs on its own context: a stop finishes it, and only
	// the shutdown timeout, or the NATS link found down, abandons it
	// (unacked, so it comes back).
	work, abandon := context.WithCancel(context.Background())
	defer abandon()
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(s.shutdownTimeout, abandon) })
	defer stopTimer()
	stopWatch := context.AfterFunc(ctx, func() { s.abandonOnLostLink(work, abandon) })
	defer stopWatch()

	parts := make([]chan item, s.store.Partitions())
	dlq := make(chan deadletter.Letter, 1024)
	var workers, dlqWorker sync.WaitGroup
	for i := range parts {
		parts[i] = make(chan item, s.cfg.Pipeline.BatchSize)
		in := s.src.queue(parts[i], s.ackWait)
		workers.Add(1)
		go func() {
			defer workers.Done()
			s.runPartition(work, s.store.Partition(i), in, dlq)
		}()
	}
	dlqWorker.Add(1)
	go func() {
		defer dlqWorker.Done()
		s.deadLetterWorker(work, dlq)
	}()
	flushTotals := s.startTotals()
	// The suppressed counts of rate-limited lines are written every
	// interval, and the last ones once everything else has stopped.
	logsCtx, stopLogs := context.WithCancel(context.Background())
	var logs sync.WaitGroup
	logs.Go(func() { s.logs.Run(logsCtx) })

	s.status.setReady(true)
	go s.pollPending(ctx, s.src.backlog)
	var expiry sync.WaitGroup
	expiry.Go(func() { s.runExpiry(ctx) })
	s.src.run(ctx, &intake{s: s, parts: parts, dlq: dlq})

	s.status.setReady(false)
	expiry.Wait()
	for _, ch := range parts {
		close(ch)
	}
	workers.Wait()
	close(dlq)
	dlqWorker.Wait()
	flushTotals()
	s.src.finish()
	stopLogs()
	logs.Wait()
	s.log.Info("stopped: batches in flight finished")
	return nil
}

// lostLinkPoll is how often a stop checks the NATS connection.
const lostLinkPoll = 50 * time.Millisecond

// abandonOnLostLink calls abandon once the NATS connection is down (the
// client reconnecting, or closed) before work ends: a batch in flight
// cannot finish without the server, so a stop then ends at once instead of
// retrying until the shutdown timeout. What it abandons stays unacked and
// comes back after AckWait. A link that stops answering without a reset is
// found down within nats.ping_interval x (nats.max_pings_out + 1).
func (s *Stage) abandonOnLostLink(work context.Context, abandon context.CancelFunc) {
	go func() {
		t := time.NewTicker(lostLinkPoll)
		defer t.Stop()
		for {
			select {
			case <-work.Done():
				return
			case <-t.C:
			}
			if !s.nc.IsConnected() {
				s.log.Warn("stopping while the NATS connection is down: the batches in flight are left unacked and come back after ack_wait",
					"status", s.nc.Status().String(), "ack_wait", s.ackWait)
				abandon()
				return
			}
		}
	}()
}

// inputBacklog is the input backlog a source read: its total, and each
// owned partition's when the source reads them apart (a group's).
type inputBacklog struct {
	total admin.Backlog
	parts map[int]admin.Backlog // nil for a single instance
}

// pollPending exports the input backlog that backlog reads every few
// seconds, and keeps it for Status.
func (s *Stage) pollPending(ctx context.Context, backlog func(context.Context) (inputBacklog, error)) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		b, err := backlog(rctx)
		cancel()
		if err == nil {
			s.metrics.ConsumerPending.WithLabelValues("pending").Set(float64(b.total.Pending))
			s.metrics.ConsumerPending.WithLabelValues("ack_pending").Set(float64(b.total.AckPending))
			s.lastBacklog.Store(&b)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Close closes the state store, writing each filter's snapshot. It does not
// close the NATS connection. It is safe to call twice.
func (s *Stage) Close() error {
	s.closeOnce.Do(func() {
		s.status.setReady(false)
		s.status.setStore(nil, s.win)
		if s.totals != nil {
			s.totals.close()
		}
		if s.store != nil {
			s.closeErr = s.store.Close()
		}
	})
	return s.closeErr
}
