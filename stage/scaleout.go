package stage

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/synadia-io/orbit.go/pcgroups"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/route"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// headerPinID is the header nats-server puts on each message a pinned
// client of a priority group receives: the pin the message was delivered
// under. A partition's tenure in this instance is one pin.
const headerPinID = "Nats-Pin-Id"

// pcgPriorityGroup is the priority group pcgroups gives every member's
// consumer.
const pcgPriorityGroup = "PCG"

// restoreChunk is how many restored records are written to the store in
// one call.
const restoreChunk = 4096

// scaleOut is this instance's part in a scale-out group
// (docs/scale-out.md): the static consumer group's members it consumes, the
// fences of the partitions it owns, and their metrics.
type scaleOut struct {
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
	terms     string             // what retention adds up (config.OutputRetentionTerms)
	consumer  jetstream.ConsumerConfig
	metrics   *scaleOutMetrics
	snaps     *snapshots // the partitions' snapshots (docs/scale-out.md §3.3)

	mu    sync.Mutex
	owned map[int]string // partition -> the pin it is owned under
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
}

// scaleOutMetrics are the metrics of partition ownership; they exist only
// with scale-out on.
type scaleOutMetrics struct {
	owned      prometheus.Gauge
	takeovers  *prometheus.CounterVec
	refusals   *prometheus.CounterVec
	stale      *prometheus.CounterVec
	restored   *prometheus.CounterVec
	restoring  *prometheus.GaugeVec
	restoreDur *prometheus.GaugeVec
	released   *prometheus.CounterVec
	refused    *prometheus.CounterVec
	dlRefusals *prometheus.CounterVec
	partitions *prometheus.GaugeVec
}

func newScaleOutMetrics(reg prometheus.Registerer) *scaleOutMetrics {
	m := &scaleOutMetrics{
		owned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dedupe_partitions_owned",
			Help: "Partitions this instance owns: it holds their fence and judges their messages.",
		}),
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
		restoring: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dedupe_partition_restoring",
			Help: "1 while this instance restores the partition from the output stream, else 0.",
		}, []string{"partition"}),
		restoreDur: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dedupe_partition_restore_seconds",
			Help: "How long the last takeover of the partition took: the fence and the restore.",
		}, []string{"partition"}),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_partition_releases_total",
			Help: "Partitions this instance released to balance the group (it owned more than its fair share), by partition.",
		}, []string{"partition"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_partition_refused_total",
			Help: "Takeovers of the partition this instance refused because the output stream does not keep what its restore needs (reason limits: the stream's configuration drops records; short: records the restore needs are gone). The partition's input waits; the log names the stream field and the fix.",
		}, []string{"partition", "reason"}),
	}
	m.partitions = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "dedupe_group_partitions",
		Help: "The partitions of this instance's scale-out group (state.partitions), by group: sum(dedupe_partitions_owned) over the group's instances falls below it while a partition has no owner.",
	}, []string{"group"})
	reg.MustRegister(m.owned, m.takeovers, m.refusals, m.stale, m.restored, m.restoring, m.restoreDur, m.released, m.refused, m.dlRefusals, m.partitions)
	return m
}

// setUpScaleOut checks what scale-out needs of the streams and creates the
// static consumer group, with member p<i> consuming partition i, when it
// does not exist yet (every instance may try at once: the same record is
// written by all of them).
func (s *Stage) setUpScaleOut(ctx context.Context, reg prometheus.Registerer) error {
	cfg := s.cfg
	g := newScaleOut(cfg, s.win.W)
	if routed, why := cfg.ScaleOutRouted(); routed {
		if err := s.setUpRoute(ctx, g, reg, why); err != nil {
			return err
		}
	} else if err := checkTransform(ctx, s.js, cfg); err != nil {
		return err
	} else if err := checkUntokened(ctx, s.js, cfg); err != nil {
		return err
	}
	oc, err := s.checkSideStreams(ctx, g)
	if err != nil {
		return err
	}
	if g.handOvers, err = openHandOvers(ctx, s.js, cfg); err != nil {
		return err
	}
	if !s.atomicOutput {
		return fmt.Errorf("scale-out: the output is not published as atomic batches (output.publish %q, stream %s AllowAtomicPublish %v); the fence needs them",
			cfg.Output.Publish, g.outStream, oc.AllowAtomicPublish)
	}
	if err := s.createGroup(ctx, g); err != nil {
		return err
	}
	g.metrics = newScaleOutMetrics(reg)
	g.metrics.partitions.WithLabelValues(g.name).Set(float64(cfg.State.Partitions))
	g.snaps = newSnapshots(cfg, s.js, s.log, s.win.W, max(oc.Replicas, 1), reg)
	s.group = g
	s.log.Info("scale-out: joining the group", "group", g.name, "instance", g.instance, "partitions", cfg.State.Partitions,
		"input_stream", g.inStream, "output_stream", g.outStream, "handover_after_crash", g.consumer.AckWait)
	return nil
}

// newScaleOut returns this instance's part in the group cfg configures,
// with w the dedupe window, before it has checked or joined anything.
func newScaleOut(cfg config.Config, w time.Duration) *scaleOut {
	return &scaleOut{
		busy:       make([]sync.Mutex, cfg.State.Partitions),
		releaseNow: make(chan int),
		name:       cfg.ScaleOut.Group,
		instance:   cfg.ScaleOut.InstanceName(),
		prefix:     cfg.Output.SubjectPrefix,
		outStream:  cfg.Output.Stream,
		inStream:   cfg.Input.Stream,
		retention:  cfg.OutputRetention(w),
		terms:      cfg.OutputRetentionTerms(),
		owned:      make(map[int]string),
		lost:       make(map[int]string),
		consumer: jetstream.ConsumerConfig{
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       cfg.Input.AckWait.D(),
			MaxAckPending: cfg.Input.MaxAckPending,
			MaxDeliver:    cfg.Input.MaxDeliver,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		},
	}
}

// checkSideStreams checks that the output stream can be the changelog and
// that neither it nor the dead-letter stream is written on the
// partitions' control subjects, and sets the dead-letter fence's stream,
// subject and refresh. It returns the output stream's configuration.
func (s *Stage) checkSideStreams(ctx context.Context, g *scaleOut) (jetstream.StreamConfig, error) {
	cfg := s.cfg
	out, err := s.js.Stream(ctx, g.outStream)
	if err != nil {
		return jetstream.StreamConfig{}, fmt.Errorf("scale-out: output stream %s: %w", g.outStream, err)
	}
	oc := out.CachedInfo().Config
	if err := g.checkChangelog(oc); err != nil {
		return oc, err
	}
	if err := checkControlSubjects(oc, cfg.Output.SubjectPrefix, cfg.State.Partitions); err != nil {
		return oc, err
	}
	dl, err := s.js.Stream(ctx, cfg.DeadLetter.Stream)
	if err != nil {
		return oc, fmt.Errorf("scale-out: dead-letter stream %s: %w", cfg.DeadLetter.Stream, err)
	}
	if err := checkControlSubjects(dl.CachedInfo().Config, cfg.DeadLetter.Subject, cfg.State.Partitions); err != nil {
		return oc, err
	}
	g.dlStream, g.dlSubject = cfg.DeadLetter.Stream, cfg.DeadLetter.Subject
	g.dlRefresh = fenceRefresh(dl.CachedInfo().Config.MaxAge)
	return oc, nil
}

// createGroup creates the static consumer group, one member per
// partition, or checks that the one there is the same.
func (s *Stage) createGroup(ctx context.Context, g *scaleOut) error {
	n := s.cfg.State.Partitions
	mappings := make([]pcgroups.MemberMapping, n)
	for i := range mappings {
		mappings[i] = pcgroups.MemberMapping{Member: config.ScaleOutMember(i), Partitions: []int{i}}
	}
	// A cluster can leave a request unanswered (no responders while a
	// leader is elected, a time-out): asked again, for as long as the
	// streams' set-up is, each request for streamRequestTimeout of it.
	// Anything else pcgroups says (an invalid or mismatched group) no
	// retry changes.
	gctx, cancel := context.WithTimeout(ctx, streamSetUpTimeout)
	defer cancel()
	err := retry.Do(gctx, "consumer group", func() error {
		rctx, cancel := context.WithTimeout(gctx, streamRequestTimeout)
		defer cancel()
		_, err := pcgroups.CreateStatic(rctx, s.js, g.inStream, g.name, uint(n), nil, nil, mappings)
		var api *jetstream.APIError
		if err != nil && !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) &&
			!errors.Is(err, context.DeadlineExceeded) && !errors.As(err, &api) {
			return retry.MarkPermanent(err)
		}
		return err
	}, retry.Options{})
	if err != nil {
		return fmt.Errorf("scale-out: static consumer group %s on %s with %d partitions: %w", g.name, g.inStream, n, err)
	}
	return nil
}

// checkTransform checks that the input stream's subject transform puts
// each key's partition first, as the configuration implies.
func checkTransform(ctx context.Context, js jetstream.JetStream, cfg config.Config) error {
	name := cfg.Input.Stream
	in, err := js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("scale-out: input stream %s: %w", name, err)
	}
	src, dest, err := cfg.ScaleOutTransform()
	if err != nil {
		return fmt.Errorf("scale-out: %w", err)
	}
	if tr := in.CachedInfo().Config.SubjectTransform; tr == nil || tr.Source != src || tr.Destination != dest {
		have := "none"
		if tr != nil {
			have = fmt.Sprintf("%q -> %q", tr.Source, tr.Destination)
		}
		return fmt.Errorf("scale-out: input stream %s has subject transform %s, want %q -> %q: the server must put each key's partition "+
			"(of state.partitions = %d) first in the stored subject; edit the stream, create it with the stage (nats.create_streams), "+
			"or have the route step partition it (scale_out.route always)",
			name, have, src, dest, cfg.State.Partitions)
	}
	return nil
}

// setUpRoute prepares the route step: the group consumes the routed
// stream, which must keep the route step's guarantee (route.CheckStream),
// and Run routes the input into it.
func (s *Stage) setUpRoute(ctx context.Context, g *scaleOut, reg prometheus.Registerer, why string) error {
	cfg := s.cfg
	name := cfg.ScaleOut.RoutedStream
	st, err := s.js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("scale-out: routed stream %s (scale_out.routed_stream): %w", name, err)
	}
	ackWait, margin := cfg.Input.AckWait.D(), cfg.Output.RestartMargin.D()
	if err := route.CheckStream(st.CachedInfo().Config, cfg.ScaleOut.RoutedSubject, cfg.State.Partitions, ackWait, margin); err != nil {
		return fmt.Errorf("scale-out: %w", err)
	}
	g.inStream = name
	g.routed = &route.Options{
		Conn:              s.nc,
		InputStream:       cfg.Input.Stream,
		Group:             g.name,
		Partitions:        cfg.State.Partitions,
		RoutedStream:      name,
		RoutedSubject:     cfg.ScaleOut.RoutedSubject,
		Key:               s.keyFn,
		DeadLetterSubject: cfg.DeadLetter.SubjectFor,
		MaxMessageBytes:   int64(cfg.Pipeline.MaxMessageBytes),
		BatchSize:         cfg.Pipeline.BatchSize,
		BatchLinger:       cfg.Pipeline.BatchLinger.D(),
		AckWait:           ackWait,
		MaxAckPending:     cfg.Input.MaxAckPending,
		RestartMargin:     margin,
		ShutdownTimeout:   s.shutdownTimeout,
		Registry:          reg,
		Logger:            s.log,
		Logs:              s.logs,
		Reporter:          s.status,
	}
	if cfg.Totals.Enabled {
		// All of a group's events meet in one partition: the route step
		// partitions by the group, read as the totals read it.
		spec := cfg.Totals.Group
		ex, err := keys.NewExtractor(spec)
		if err != nil {
			return fmt.Errorf("scale-out: totals.group: %w", err)
		}
		g.routed.PartitionKey = func(subject string, hdr nats.Header, data []byte, _ []byte) ([]byte, error) {
			return groupOf(ex, spec, subject, hdr, data)
		}
	}
	if err := g.routed.Validate(); err != nil {
		return fmt.Errorf("scale-out: %w", err)
	}
	s.log.Info("scale-out: the route step partitions the input", "why", why, "routed_stream", name,
		"routed_subjects", route.Subject(0, cfg.ScaleOut.RoutedSubject, "<input subject>"), "route_consumer", route.ConsumerName(g.name))
	return nil
}

// runRoute runs the route step until ctx is done. A failure to start it
// (the routed stream or the route consumer) is retried with backoff: the
// partitions' owners meanwhile judge what was routed before.
func (s *Stage) runRoute(ctx context.Context) {
	b := retry.NewBackoff()
	for ctx.Err() == nil {
		err := route.Run(ctx, *s.group.routed)
		if err == nil {
			return
		}
		s.status.Failed(route.CompRoute, err)
		s.log.Error("scale-out: the route step stopped; restarting it", "err", err)
		b.Wait(ctx)
	}
}

// ReasonNotRouted: a message in the routed stream that the route step did
// not write (its subject, Nats-Msg-Id or headers are not the route step's).
const ReasonNotRouted = "not_routed"

// dispatchRouted is dispatch for a message of the routed stream, which the
// route step already checked: its key and input subject come from what the
// route step wrote (route.OriginOf), not derived again.
func (s *Stage) dispatchRouted(msg jetstream.Msg, p int, parts []chan item, dlq chan<- deadLetter) {
	o, err := route.OriginOf(s.group.routed.RoutedSubject, msg.Subject(), msg.Headers())
	if err != nil {
		dlq <- deadLetter{msg: msg, reason: ReasonNotRouted, partition: "none",
			detail: "in the routed stream, but not written by the route step: " + err.Error()}
		return
	}
	it := item{msg: msg, key: o.Key, fp: fingerprint(msg.Data()), pin: msg.Headers().Get(headerPinID), subject: o.Subject}
	if s.totals != nil {
		var dl *deadLetter
		if it.tot, dl = s.totals.extract(msg, o.Subject, msg.Data()); dl != nil {
			dlq <- *dl
			return
		}
	}
	parts[p] <- it
}

// consumeGroup consumes every member of the group until ctx is done: the
// server delivers a partition's messages to the one instance it pins.
// Beside it run the route step, when on, and balance.
func (s *Stage) consumeGroup(ctx context.Context, parts []chan item, dlq chan<- deadLetter) {
	g := s.group
	var gate sync.RWMutex // held to read while dispatching, to write when stopping
	stopped := false
	var side sync.WaitGroup
	defer side.Wait()
	if g.routed != nil {
		side.Go(func() { s.runRoute(ctx) })
	}
	side.Go(func() { s.runSnapshots(ctx) })
	m := &members{s: s, running: make(map[int]*member), handler: func(p int) func(jetstream.Msg) {
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
			s.dispatch(msg, p, parts, dlq)
		}
	}}
	for p := range parts {
		m.join(ctx, p)
	}
	var pr *presence
	side.Go(func() {
		var err error
		pr, err = s.joinPresence(ctx)
		if err == nil {
			s.balance(ctx, pr, m)
		}
	})
	<-ctx.Done()
	s.giveBackAll(m)
	gate.Lock()
	stopped = true
	gate.Unlock()
	side.Wait()
	if pr != nil {
		pr.leave()
	}
}

// joinPresence opens the presence bucket that balance counts the live
// instances in, retrying a transient failure (a cluster busy electing a
// leader times out) until ctx is done. A permanent one leaves the group
// without balance: partitions stay with whoever the server pins first,
// which costs throughput, never correctness.
func (s *Stage) joinPresence(ctx context.Context) (*presence, error) {
	var pr *presence
	err := retry.Do(ctx, "presence", func() (err error) {
		pr, err = openPresence(ctx, s.js, s.cfg, s.group.instance)
		return err
	}, retry.Options{OnRetry: func(attempt int, err error) {
		if attempt == 1 || attempt%20 == 0 {
			s.log.Warn("scale-out: presence bucket not reachable yet; balance waits for it", "attempt", attempt, "err", err)
		}
	}})
	if err != nil && ctx.Err() == nil {
		s.log.Warn("scale-out: no presence, g no balance: partitions stay with whoever the server pins first", "err", err)
	}
	return pr, err
}

// members are this instance's consumers of the group's members, one per
// partition; balance stops and restarts them.
type members struct {
	s       *Stage
	handler func(p int) func(jetstream.Msg)
	mu      sync.Mutex
	running map[int]*member // partition -> its member's consumer
}

// member is one running consumer of a group member.
type member struct {
	consuming pcgroups.ConsumerGroupConsumeContext
	ended     chan struct{} // closed when the library reports it done
}

// join consumes partition p's member, retrying until ctx is done.
func (m *members) join(ctx context.Context, p int) {
	s, g := m.s, m.s.group
	b := retry.NewBackoff()
	for ctx.Err() == nil {
		consuming, err := pcgroups.StaticConsume(ctx, s.js, g.inStream, g.name, config.ScaleOutMember(p), m.handler(p), g.consumer)
		if err != nil {
			s.log.Warn("scale-out: cannot consume member, retrying", "member", config.ScaleOutMember(p), "err", err)
			b.Wait(ctx)
			continue
		}
		mb := &member{consuming: consuming, ended: make(chan struct{})}
		go func() {
			defer close(mb.ended)
			if err := <-consuming.Done(); err != nil {
				s.log.Error("scale-out: the group stopped a member's consumer", "member", config.ScaleOutMember(p), "err", err)
			}
		}()
		m.mu.Lock()
		m.running[p] = mb
		m.mu.Unlock()
		return
	}
}

// leave stops consuming partition p's member.
func (m *members) leave(p int) {
	m.mu.Lock()
	mb := m.running[p]
	delete(m.running, p)
	m.mu.Unlock()
	if mb != nil {
		mb.consuming.Stop()
		<-mb.ended
	}
}

// leaveAll stops consuming every member.
func (m *members) leaveAll() {
	m.mu.Lock()
	all := make([]int, 0, len(m.running))
	for p := range m.running {
		all = append(all, p)
	}
	m.mu.Unlock()
	for _, p := range all {
		m.leave(p)
	}
}

// giveBackAll is a clean stop's release (docs/scale-out.md §7): what the
// members deliver from now on is kept aside, and the workers give back
// (nak) what they have not started judging; once each batch in flight has
// finished (the busy tokens), every owned partition is unpinned while the
// members still consume, so that nothing the client buffered is dropped;
// then the members stop and what was kept aside is given back.
func (s *Stage) giveBackAll(m *members) {
	g := s.group
	g.mu.Lock()
	g.givingBack = true
	if g.diverted == nil {
		g.diverted = make(map[int][]jetstream.Msg)
	}
	for p := range g.busy {
		g.diverted[p] = nil
	}
	g.mu.Unlock()
	for p := range g.busy {
		g.busy[p].Lock()
	}
	g.mu.Lock()
	pins := maps.Clone(g.owned)
	g.mu.Unlock()
	s.releaseAll()
	for p, pin := range pins {
		g.lose(p, pin)
	}
	for p := range g.busy {
		g.busy[p].Unlock()
	}
	m.leaveAll()
	g.mu.Lock()
	kept := g.diverted
	g.diverted = nil
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for p, msgs := range kept {
		if len(msgs) == 0 {
			continue
		}
		// A member pinned again before it stopped is unpinned once more.
		if now, err := s.pinOf(ctx, p); err == nil && now != "" && now == msgs[len(msgs)-1].Headers().Get(headerPinID) {
			if err := pcgroups.StaticMemberStepDown(ctx, s.js, g.inStream, g.name, config.ScaleOutMember(p)); err != nil {
				s.log.Warn("scale-out: unpin on stop failed; the partition moves after the pin's TTL", "partition", p, "err", err)
			}
		}
		giveBackMsgs(msgs)
		g.metrics.stale.WithLabelValues(strconv.Itoa(p)).Add(float64(len(msgs)))
	}
}

// giveBackMsgs naks msgs without delay.
func giveBackMsgs(msgs []jetstream.Msg) {
	for _, msg := range msgs {
		_ = msg.Nak() // a lost nak: the message comes back after ack_wait
	}
}

// releaseAll unpins the partitions this instance owns, after its workers
// finished, so that their next owners get them at once instead of after
// the pin's TTL.
func (s *Stage) releaseAll() {
	g := s.group
	g.mu.Lock()
	owned := make([]int, 0, len(g.owned))
	for p := range g.owned {
		owned = append(owned, p)
	}
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, p := range owned {
		if err := pcgroups.StaticMemberStepDown(ctx, s.js, g.inStream, g.name, config.ScaleOutMember(p)); err != nil {
			s.log.Warn("scale-out: unpin on stop failed; the partition moves after the pin's TTL", "partition", p, "err", err)
			continue
		}
		s.log.Info("scale-out: partition released", "partition", p)
	}
}

// giveBack naks every message of batch without delay: they were
// delivered under a pin this instance gave up (or it stops), and the
// partition's next owner gets them at once instead of after ack_wait.
func giveBack(batch []item) {
	for i := range batch {
		_ = batch[i].msg.Nak() // a lost nak: the message comes back after ack_wait
	}
}

// divert keeps msg aside when partition p is being released, and reports
// whether it did.
func (g *scaleOut) divert(p int, msg jetstream.Msg) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	ms, ok := g.diverted[p]
	if ok {
		g.diverted[p] = append(ms, msg)
	}
	return ok
}

// stopping reports whether the instance stops, so that its workers give
// back what they have not started judging.
func (g *scaleOut) stopping() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.givingBack
}

// setOwned records that this instance owns partition p, under pin now.
func (g *scaleOut) setOwned(p int, pin string) {
	g.mu.Lock()
	g.owned[p] = pin
	g.metrics.owned.Set(float64(len(g.owned)))
	g.mu.Unlock()
}

// groupBacklog reads the backlog of the partitions this instance owns
// now: the sum over their member consumers. A partition without an owner
// is reported by dedupe_group_partitions against dedupe_partitions_owned,
// and by status.
func (s *Stage) groupBacklog(ctx context.Context) (pending, ackPending uint64, err error) {
	for _, p := range s.group.ownedPartitions() {
		c, err := s.js.Consumer(ctx, s.group.inStream, config.ScaleOutMemberConsumer(s.group.name, p))
		if err != nil {
			return 0, 0, fmt.Errorf("partition %d's consumer: %w", p, err)
		}
		info := c.CachedInfo()
		pending += info.NumPending
		ackPending += uint64(info.NumAckPending)
	}
	return pending, ackPending, nil
}

// pinOf asks the server which pin partition p's consumer is pinned to now
// ("" when none).
func (s *Stage) pinOf(ctx context.Context, p int) (string, error) {
	g := s.group
	if pinCheckFault != nil {
		if err := pinCheckFault(p); err != nil {
			return "", err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := s.js.Consumer(ctx, g.inStream, config.ScaleOutMemberConsumer(g.name, p))
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
