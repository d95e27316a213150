package stage

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/admin"
	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/internal/ownership"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/route"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// The stage's side of scale-out (docs/scale-out.md): internal/scaleout is
// this instance's part in the group; groupSource hands the stage what the
// group delivers, decoded, and each partition's scaleout.Owner.

// ErrChangelog means the output stream does not keep what a new owner of
// a partition restores it from; New refuses to start on a stream
// configured so. See scaleout.ErrChangelog.
var ErrChangelog = scaleout.ErrChangelog

// ErrControlSubjects means the output or dead-letter stream has no
// subjects for the partitions' fences; New refuses to start. See
// scaleout.ErrControlSubjects.
var ErrControlSubjects = scaleout.ErrControlSubjects

// groupSource is the source of one instance of a scale-out group: the
// members of the consumer group it consumes and, when the route step
// runs, what the route step hands it directly. It decodes what the route
// step wrote (bundles, a copy's origin) so that the stage judges a copy
// as it would its input.
type groupSource struct {
	cfg    config.Config
	s      *Stage
	group  *scaleout.Group
	health *groupHealth // the group's health gauges
	// routedStream and routedSubject are the routed stream and its subject
	// prefix when the members consume the routed stream; routed says
	// whether they do.
	routedStream, routedSubject string
	routed                      bool
}

// streams implements source (scaleOutStreams).
func (*groupSource) streams(cfg config.Config, w window.Window, streams []StreamToCreate) ([]StreamToCreate, error) {
	return scaleOutStreams(cfg, w, streams)
}

// bind implements source (checkConsumer).
func (src *groupSource) bind(ctx context.Context, s *Stage) (jetstream.ConsumerConfig, error) {
	src.s = s
	c, _ := src.checkConsumer(ctx, nil)
	return c, nil
}

// checkConsumer implements source: the group's member consumers are made
// when Run joins the group, with input's settings.
func (src *groupSource) checkConsumer(context.Context, jetstream.Stream) (jetstream.ConsumerConfig, []finding.Finding) {
	return memberConsumer(src.cfg.Input), nil
}

// check implements source: the output must be published as atomic
// batches, and the group's own checks (scaleout.Check).
func (src *groupSource) check(ctx context.Context, js jetstream.JetStream, w window.Window, atomic bool) []finding.Finding {
	cfg := src.cfg
	var fs []finding.Finding
	if !atomic {
		fix := "nats stream edit " + cfg.Output.Stream + " --allow-batch --force"
		fs = append(fs, finding.Finding{Check: "atomic_publish", Severity: finding.Error, Fix: fix,
			Message: fmt.Sprintf("scale-out: the output is not published as atomic batches (output.publish %q, stream %s without AllowAtomicPublish); the fence needs them",
				cfg.Output.Publish, cfg.Output.Stream)})
	}
	o, err := groupOptions(cfg, w.W)
	if err != nil {
		return append(fs, finding.FromError("partition_transform", finding.Error, err))
	}
	return append(fs, scaleout.Check(ctx, js, o)...)
}

// open implements source: it prepares this instance's part in the
// scale-out group (scaleout.New checks the streams and creates the
// consumer group); run joins it.
func (src *groupSource) open(ctx context.Context, s *Stage, reg prometheus.Registerer) error {
	cfg := src.cfg
	o, err := groupOptions(cfg, s.win.W)
	if err != nil {
		return err
	}
	o.Conn, o.JS, o.Clock, o.Key = s.nc, s.js, s.clock, s.keyFn
	o.AtomicOutput, o.ShutdownTimeout, o.Registry = s.atomicOutput, s.shutdownTimeout, reg
	o.Logger, o.Logs, o.Reporter, o.Restoring = s.log, s.logs, s.status, s.status.setRestoring
	o.StoreAhead = s.storeAhead
	if cfg.Totals.Enabled {
		// All of a group's events meet in one partition: the route step
		// partitions by the group, read as the totals read it.
		spec := cfg.Totals.Group
		ex, err := keys.NewExtractor(spec)
		if err != nil {
			return fmt.Errorf("scale-out: totals.group: %w", err)
		}
		o.PartitionKey = func(subject string, hdr nats.Header, data, _ []byte) ([]byte, error) {
			return groupOf(ex, spec, subject, hdr, data)
		}
	}
	g, err := scaleout.New(ctx, o)
	if err != nil {
		return err
	}
	src.group = g
	src.routedStream, src.routedSubject, src.routed = g.Route()
	src.health = newGroupHealth(reg, cfg, s.js, s.logs, g.ReadsHealth)
	return nil
}

// groupOptions returns the scale-out options cfg (validated, scale-out
// on) configures, given the window w: the names, streams and settings
// scaleout.New and scaleout.Check read; the caller adds the connection,
// the clock, the key and the logs.
func groupOptions(cfg config.Config, w time.Duration) (scaleout.Options, error) {
	so := cfg.ScaleOut
	_, every, keep, _ := cfg.ScaleOutSnapshots(w)
	o := scaleout.Options{
		Group: so.Group, Instance: so.InstanceName(), Partitions: cfg.State.Partitions, Replicas: so.Replicas,
		InputStream: cfg.Input.Stream, InputSubjects: cfg.Input.Subjects,
		AckWait: cfg.Input.AckWait.D(), MaxAckPending: cfg.Input.MaxAckPending, MaxDeliver: cfg.Input.MaxDeliver,
		OutputStream: cfg.Output.Stream, OutputPrefix: cfg.Output.SubjectPrefix, OutputPublish: cfg.Output.Publish,
		DeadLetterStream: cfg.DeadLetter.Stream, DeadLetterSubject: cfg.DeadLetter.Subject,
		Retention: cfg.OutputRetention(w), RetentionTerms: cfg.OutputRetentionTerms(),
		SnapshotEvery: every, SnapshotKeep: keep, LoadSnapshots: !cfg.Totals.Enabled,
		BundleMax: so.RouteBundleMax, Window: w, Standbys: so.Standbys,
	}
	pt := cfg.ScaleOutPartitioning()
	routed, why := pt.Routed()
	if !routed {
		src, dest, err := pt.Transform()
		if err != nil {
			return o, fmt.Errorf("scale-out: %w", err)
		}
		o.Transform = jetstream.SubjectTransformConfig{Source: src, Destination: dest}
		return o, nil
	}
	o.RouteWhy = why
	o.Route = &route.Options{
		NewJetStream:      cfg.NATS.NewJetStream,
		InputStream:       cfg.Input.Stream,
		Partitions:        cfg.State.Partitions,
		RoutedStream:      so.RoutedStream,
		RoutedSubject:     so.RoutedSubject,
		DeadLetterSubject: cfg.DeadLetter.SubjectFor,
		MaxMessageBytes:   int64(cfg.Pipeline.MaxMessageBytes),
		BatchSize:         cfg.Pipeline.BatchSize,
		BatchLinger:       cfg.Pipeline.BatchLinger.D(),
		AckWait:           cfg.Input.AckWait.D(),
		MaxAckPending:     cfg.Input.MaxAckPending,
		RestartMargin:     cfg.Output.RestartMargin.D(),
	}
	return o, nil
}

// prepare implements source: each partition restores from its cursor
// when this instance takes it. A partition whose local store is ahead of
// the output (the output lost forwards it had acknowledged) drops what
// the output lost now, before another owner's forwards carry the
// output's last sequence past its cursor, and again at its takeover
// (changelog.CheckAhead).
func (src *groupSource) prepare(ctx context.Context) error {
	s, stream := src.s, src.cfg.Output.Stream
	info, err := changelog.StreamState(ctx, s.js, stream)
	if err != nil {
		return fmt.Errorf("scale-out: check the store against the output stream: %w", err)
	}
	for i := range s.store.Partitions() {
		a, ahead, err := changelog.CheckAhead(ctx, s.js, stream, s.store.Partition(i), info.State.LastSeq)
		if err != nil {
			return fmt.Errorf("scale-out: check the store against the output stream: %w", err)
		}
		if ahead {
			s.storeAhead(a)
		}
	}
	return nil
}

// queue implements source: a member's callback must never wait on its
// partition (hold). The worker's channel is unbuffered, so that whatever
// is not in the batch being judged is kept alive by hold.
func (*groupSource) queue(ch chan item, ackWait time.Duration) <-chan item {
	held := make(chan item)
	go hold(ch, held, ackWait/3)
	return held
}

// run implements source: it runs this instance's part in the group
// (scaleout.Group.Run) and the group's health gauges until ctx is done.
func (src *groupSource) run(ctx context.Context, in *intake) {
	go src.health.run(ctx)
	src.group.Run(ctx, src.s.store, func(msg jetstream.Msg, p int) { src.deliver(in, msg, p) },
		func(msg jetstream.Msg, p int, key []byte) bool {
			return in.offer(arrival{msg: msg, p: p, key: key, pin: scaleout.LocalPin})
		})
}

// deliver hands in msg, delivered by the member of partition p: each
// input a bundle carries as a copy of its own, and a copy of the routed
// stream with what the route step recorded of its input
// (route.OriginOfMsg), not derived again.
func (src *groupSource) deliver(in *intake, msg jetstream.Msg, p int) {
	if !src.routed {
		in.deliver(arrival{msg: msg, p: p, pin: msg.Headers().Get(scaleout.HeaderPinID)})
		return
	}
	if !route.IsBundle(msg.Headers()) {
		in.deliver(src.decode(msg, p))
		return
	}
	ms, err := route.Unbundle(msg)
	if err != nil {
		in.reject(msg, "in the routed stream, a bundle this version cannot read: "+err.Error())
		return
	}
	for _, m := range ms {
		in.deliver(src.decode(m, p))
	}
}

// decode returns the arrival of msg, a message of the routed stream
// delivered for partition p, with its input's key, subject and time.
func (src *groupSource) decode(msg jetstream.Msg, p int) arrival {
	a := arrival{msg: msg, p: p, pin: msg.Headers().Get(scaleout.HeaderPinID)}
	o, err := route.OriginOfMsg(src.routedSubject, msg)
	if err != nil {
		a.undecodable = "in the routed stream, but not written by the route step: " + err.Error()
		return a
	}
	a.key, a.subject, a.at = o.Key, o.Subject, o.Time
	return a
}

// finish implements source: it releases every partition this instance
// still holds (scaleout.Group.ReleaseAll).
func (src *groupSource) finish() { src.group.ReleaseAll() }

// backlog implements source: the backlog of each partition this
// instance owns now (scaleout.Group.Backlog), and their sum.
func (src *groupSource) backlog(ctx context.Context) (inputBacklog, error) {
	parts, err := src.group.Backlog(ctx)
	if err != nil {
		return inputBacklog{}, err
	}
	b := inputBacklog{parts: make(map[int]admin.Backlog, len(parts))}
	for p, pb := range parts {
		b.parts[p] = admin.Backlog{Pending: pb.Pending, AckPending: pb.AckPending}
		b.total.Pending += pb.Pending
		b.total.AckPending += pb.AckPending
	}
	return b, nil
}

// pendingFloors implements source (scaleout.Group.PendingFloors).
func (src *groupSource) pendingFloors(ctx context.Context) (func(int) (time.Time, bool), error) {
	floors, err := src.group.PendingFloors(ctx)
	if err != nil {
		return nil, err
	}
	return func(p int) (time.Time, bool) {
		f, ok := floors[p]
		return f, ok
	}, nil
}

// owner implements source: this instance's tenures of partition p
// (scaleout.Owner).
func (src *groupSource) owner(p *state.Partition) ownership.Owner {
	return src.group.Owner(p)
}

// inputOf implements source: for a message of the routed stream, the input
// message the route step copied (route.InputOfMsg), not the routed copy,
// which the work-queue stream deletes once it is acked.
func (src *groupSource) inputOf(msg jetstream.Msg, stream string) (string, string, uint64, bool) {
	if !src.routed || stream != src.routedStream {
		return "", "", 0, false
	}
	return route.InputOfMsg(src.routedSubject, msg)
}

// copyHeader implements source: the headers the route step adds to a copy
// alone (route.IsCopyHeader).
func (*groupSource) copyHeader(k string) bool { return route.IsCopyHeader(k) }

// maxEventTimeAhead implements source: scale_out.max_event_time_ahead,
// beyond which a new owner of the partition would not restore the total.
func (src *groupSource) maxEventTimeAhead() (time.Duration, bool) {
	return src.cfg.ScaleOut.MaxEventTimeAhead.D(), true
}

// deadLetterFenced implements source (scaleout.Group.DeadLetterFenced).
func (src *groupSource) deadLetterFenced(p int, pin string) { src.group.DeadLetterFenced(p, pin) }

// holds implements source (scaleout.Group.Holds).
func (src *groupSource) holds(p int) bool { return src.group.Holds(p) }

// confirms implements source (scaleout.Group.HoldsFence).
func (src *groupSource) confirms(ctx context.Context, p int) bool {
	return src.group.HoldsFence(ctx, p)
}

// keeps implements source (scaleout.Group.Keeps): the partitions it owns
// and those it is a warm standby of.
func (src *groupSource) keeps(p int) bool { return src.group.Keeps(p) }

// scaleOutStreams changes the streams StreamsToCreate returns (input,
// output, dead letter) for scale-out: scale_out.replicas each; the input
// stream's subject transform puts the partition first
// (layout.Partitioning.Transform), or, when the route step runs
// (layout.Partitioning.Routed), the routed stream is added (route.StreamConfig,
// its Field "scale_out.routed"); the output keeps Limits retention and at
// least config.OutputRetention (validation refuses a configured max_age
// below it, and a max_bytes).
func scaleOutStreams(cfg config.Config, w window.Window, streams []StreamToCreate) ([]StreamToCreate, error) {
	for i := range streams {
		streams[i].Config.Replicas = cfg.ScaleOut.Replicas
	}
	pt := cfg.ScaleOutPartitioning()
	if routed, _ := pt.Routed(); routed {
		// The route step partitions the input into the routed stream.
		scale := cfg.ScaleOut
		rs := StreamToCreate{Field: "scale_out.routed", Config: route.StreamConfig(scale.RoutedStream, scale.RoutedSubject,
			cfg.State.Partitions, scale.Replicas, cfg.Input.AckWait.D(), cfg.Output.RestartMargin.D())}
		rs.Config.MaxConsumers = StreamMaxConsumers(cfg.State.Partitions)
		streams = append(streams, rs)
	} else {
		src, dest, err := pt.Transform()
		if err != nil {
			return nil, fmt.Errorf("scale-out: %w", err)
		}
		streams[0].Config.SubjectTransform = &jetstream.SubjectTransformConfig{Source: src, Destination: dest}
	}
	out := &streams[1].Config
	out.Retention = jetstream.LimitsPolicy
	if need := cfg.OutputRetention(w.W); out.MaxAge < need {
		out.MaxAge = need
	}
	return streams, nil
}
