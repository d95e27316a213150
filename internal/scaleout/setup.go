package scaleout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/pcgroups"

	"github.com/dedupe-stage/dedupe-stage/internal/ensure"
	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/route"
	"github.com/dedupe-stage/dedupe-stage/internal/streams"
)

// New checks what scale-out needs of the streams, creates the static
// consumer group, with member p<i> consuming partition i, when it does not
// exist yet (every instance may try at once: the same record is written by
// all of them), and opens the hand-over bucket. The group is joined by
// Run.
func New(ctx context.Context, o Options) (*Group, error) {
	if o.Conn == nil || o.JS == nil || o.Clock == nil || o.Registry == nil || o.Logger == nil || o.Logs == nil || o.Restoring == nil {
		return nil, errors.New("scale-out: Options.Conn, JS, Clock, Registry, Logger, Logs and Restoring are required")
	}
	g := newGroup(o)
	// pcgroups asks for a member's consumer on the context the member
	// runs on, which has no deadline: those requests get
	// groupRequestTimeout instead of the client's 5 s, so that one the
	// cluster leaves unanswered is asked again soon (members.join).
	var err error
	if g.joinJS, err = jetstream.New(o.Conn, jetstream.WithDefaultTimeout(groupRequestTimeout)); err != nil {
		return nil, fmt.Errorf("scale-out: jetstream: %w", err)
	}
	if o.Route != nil {
		if err := g.setUpRoute(ctx, o); err != nil {
			return nil, err
		}
	} else if err := checkTransform(ctx, g.js, o); err != nil {
		return nil, err
	} else if err := checkUntokened(ctx, g.js, o); err != nil {
		return nil, err
	}
	oc, err := g.checkSideStreams(ctx)
	if err != nil {
		return nil, err
	}
	if g.handOvers, err = openHandOvers(ctx, g.js, o, g.log); err != nil {
		return nil, err
	}
	if !o.AtomicOutput {
		return nil, fmt.Errorf("scale-out: the output is not published as atomic batches (output.publish %q, stream %s AllowAtomicPublish %v); the fence needs them",
			o.OutputPublish, g.outStream, oc.AllowAtomicPublish)
	}
	if err := g.createGroup(ctx); err != nil {
		return nil, err
	}
	g.metrics = newScaleOutMetrics(o.Registry)
	g.metrics.partitions.WithLabelValues(g.name).Set(float64(o.Partitions))
	g.metrics.zeroPartitions(o.Partitions)
	g.snaps = newSnapshots(o, g.js, g.log, g.window, max(oc.Replicas, 1), o.Registry)
	g.snaps.metrics.zeroPartitions(o.Partitions)
	g.log.Info("scale-out: joining the group", "group", g.name, "instance", g.instance, "partitions", o.Partitions,
		"input_stream", g.inStream, "output_stream", g.outStream, "handover_after_crash", g.consumer.AckWait)
	return g, nil
}

// newGroup returns this instance's part in the group o configures, before
// it has checked or joined anything.
func newGroup(o Options) *Group {
	return &Group{
		opts:       o,
		js:         o.JS,
		log:        o.Logger,
		logs:       o.Logs,
		clock:      o.Clock,
		window:     o.Window,
		restoring:  o.Restoring,
		ahead:      o.StoreAhead,
		reporter:   o.Reporter,
		busy:       make([]sync.Mutex, o.Partitions),
		releaseNow: make(chan int),
		name:       o.Group,
		instance:   o.Instance,
		prefix:     o.OutputPrefix,
		outStream:  o.OutputStream,
		inStream:   o.InputStream,
		retention:  o.Retention,
		terms:      o.RetentionTerms,
		owned:      make(map[int]string),
		lost:       make(map[int]string),
		pre:        make(map[int]*tenure),
		pretaking:  make(map[int]bool),
		consumer: jetstream.ConsumerConfig{
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       o.AckWait,
			MaxAckPending: o.MaxAckPending,
			MaxDeliver:    o.MaxDeliver,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		},
	}
}

// checkSideStreams checks that the output stream can be the changelog and
// that neither it nor the dead-letter stream is written on the
// partitions' control subjects, and sets the dead-letter fence's stream,
// subject and refresh. It returns the output stream's configuration.
func (g *Group) checkSideStreams(ctx context.Context) (jetstream.StreamConfig, error) {
	o := g.opts
	out, err := lookupStream(ctx, g.js, g.log, "scale-out: output stream", g.outStream)
	if err != nil {
		return jetstream.StreamConfig{}, err
	}
	oc := out.CachedInfo().Config
	if err := g.checkChangelog(oc); err != nil {
		return oc, err
	}
	if err := checkControlSubjects(oc, o.OutputPrefix, o.Partitions); err != nil {
		return oc, err
	}
	dl, err := lookupStream(ctx, g.js, g.log, "scale-out: dead-letter stream", o.DeadLetterStream)
	if err != nil {
		return oc, err
	}
	if err := checkControlSubjects(dl.CachedInfo().Config, o.DeadLetterSubject, o.Partitions); err != nil {
		return oc, err
	}
	g.dlStream, g.dlSubject = o.DeadLetterStream, o.DeadLetterSubject
	g.dlRefresh = fenceRefresh(dl.CachedInfo().Config.MaxAge)
	return oc, nil
}

// createGroup creates the static consumer group, one member per
// partition, or checks that the one there is the same. pcgroups keeps the
// group in its key-value bucket, which it looks up before it creates it:
// opened here first (ensure.Open), so that the instances of a group
// starting together do not wait on a lookup the cluster leaves
// unanswered.
func (g *Group) createGroup(ctx context.Context) error {
	n := g.opts.Partitions
	mappings := groupMappings(n)
	gctx, cancel := context.WithTimeout(ctx, streams.SetUpTimeout)
	defer cancel()
	in, err := lookupStream(gctx, g.js, g.log, "scale-out: the group's stream", g.inStream)
	if err != nil {
		return err
	}
	_, _, err = ensure.Open(gctx, "scale-out: consumer group bucket "+pcgroupsBucket, func(ctx context.Context) (jetstream.KeyValue, error) {
		return g.js.KeyValue(ctx, pcgroupsBucket)
	}, func(ctx context.Context) (jetstream.KeyValue, error) {
		// pcgroups' own configuration of the bucket (CreateStatic).
		return g.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: pcgroupsBucket, Replicas: in.CachedInfo().Config.Replicas,
			Storage: jetstream.FileStorage})
	}, ensure.Options{Logger: g.log})
	if err != nil {
		return err
	}
	// Only a group of bucketLimitPartitions or more can need it. In the
	// background, bounded on its own: instances starting together update
	// the stream together, and the server may leave one of those updates
	// unanswered (every round of a 3-instance start waited out the bound
	// in one instance when this ran in line).
	if n >= bucketLimitPartitions {
		go g.raiseBucketLimit(context.WithoutCancel(gctx))
	}
	// A request the cluster leaves unanswered (a leader being elected) is
	// asked again, each with groupRequestTimeout. Anything else pcgroups
	// says (an invalid or mismatched group) no retry changes.
	err = retry.Do(gctx, "consumer group", func() error {
		rctx, cancel := context.WithTimeout(gctx, groupRequestTimeout)
		defer cancel()
		_, err := pcgroups.CreateStatic(rctx, g.js, g.inStream, g.name, uint(n), nil, nil, mappings)
		var api *jetstream.APIError
		if err != nil && !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) &&
			!errors.Is(err, context.DeadlineExceeded) && !errors.As(err, &api) {
			return retry.MarkPermanent(err)
		}
		return err
	}, retry.Options{OnRetry: func(attempt int, err error) {
		if attempt == 1 || attempt%10 == 0 {
			g.log.Warn("start-up: waiting for the server", "step", "scale-out: consumer group "+g.name, "attempt", attempt, "why", err)
		}
	}})
	if err != nil {
		return fmt.Errorf("scale-out: static consumer group %s on %s with %d partitions: %w", g.name, g.inStream, n, err)
	}
	return nil
}

// pcgroupsBucket is the key-value bucket in which pcgroups keeps static
// consumer groups.
const pcgroupsBucket = "static-consumer-groups"

// pcgroupsBucketConsumers is the consumer limit the group gives
// pcgroupsBucket's stream. Every member an instance consumes watches the
// group's key there (pcgroups.StaticConsume), and every live instance
// consumes every partition's member (docs/scale-out.md §4.2): instances
// x partitions watchers, which passed nats-server 2.15's default of
// 1,000 consumers a stream at 64 partitions and 16 instances.
const pcgroupsBucketConsumers = 1_000_000

// bucketLimitPartitions is the fewest partitions at which a group raises
// pcgroupsBucket's consumer limit: the bucket holds partitions x
// instances watchers, and with fewer partitions than this, passing the
// server's default of 1,000 would take more instances than there are
// partitions for them to own.
const bucketLimitPartitions = 32

// raiseBucketLimit raises pcgroupsBucket's consumer limit to
// pcgroupsBucketConsumers (raiseConsumerLimit) within 2 x
// groupRequestTimeout, and warns when the limit is still lower after a
// failure (another instance's update may have answered for it).
func (g *Group) raiseBucketLimit(ctx context.Context) {
	stream := "KV_" + pcgroupsBucket
	rctx, cancel := context.WithTimeout(ctx, 2*groupRequestTimeout)
	defer cancel()
	err := raiseConsumerLimit(rctx, g.js, stream, pcgroupsBucketConsumers)
	if err == nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, groupRequestTimeout)
	defer cancel()
	if st, serr := g.js.Stream(cctx, stream); serr == nil && st.CachedInfo().Config.MaxConsumers >= pcgroupsBucketConsumers {
		return
	}
	// An older server that cannot change the limit: members past it are
	// retried, as before.
	g.log.Warn("scale-out: cannot raise the consumer group bucket's consumer limit; a large group's members may be refused",
		"stream", stream, "want", pcgroupsBucketConsumers, "err", err)
}

// raiseConsumerLimit makes stream allow at least want consumers, and
// leaves a stream that does as it is.
func raiseConsumerLimit(ctx context.Context, js jetstream.JetStream, stream string, want int) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	cfg := st.CachedInfo().Config
	if cfg.MaxConsumers >= want {
		return nil
	}
	cfg.MaxConsumers = want
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("set max_consumers of stream %s to %d: %w", stream, want, err)
	}
	return nil
}

// groupRequestTimeout bounds one call of pcgroups at start and one join of
// a member (its few requests together): far above what a cluster that
// answers takes, and short enough that a request it leaves unanswered
// costs a partition little of its first owner's start.
const groupRequestTimeout = 2 * time.Second

// lookupStream returns stream name, asking again while the cluster leaves
// the lookup unanswered (a stream another instance has just created has no
// leader yet), for up to streams.SetUpTimeout; what names it in errors and
// in the logs of log (nil: none).
func lookupStream(ctx context.Context, js jetstream.JetStream, log *slog.Logger, what, name string) (jetstream.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, streams.SetUpTimeout)
	defer cancel()
	st, _, err := ensure.Open(ctx, what+" "+name, func(ctx context.Context) (jetstream.Stream, error) {
		return js.Stream(ctx, name)
	}, nil, ensure.Options{Logger: log})
	return st, err
}

// checkTransform checks that the input stream's subject transform puts
// each key's partition first, as o.Transform says.
func checkTransform(ctx context.Context, js jetstream.JetStream, o Options) error {
	name := o.InputStream
	in, err := lookupStream(ctx, js, nil, "scale-out: input stream", name)
	if err != nil {
		return err
	}
	src, dest := o.Transform.Source, o.Transform.Destination
	if tr := in.CachedInfo().Config.SubjectTransform; tr == nil || tr.Source != src || tr.Destination != dest {
		have := "none"
		if tr != nil {
			have = fmt.Sprintf("%q -> %q", tr.Source, tr.Destination)
		}
		return finding.WithFix(fmt.Errorf("scale-out: input stream %s has subject transform %s, want %q -> %q (%d partitions); "+
			"edit the stream, create it with nats.create_streams, or set scale_out.route always",
			name, have, src, dest, o.Partitions),
			fmt.Sprintf("nats stream edit %s --transform-source '%s' --transform-destination '%s' --force", name, src, dest))
	}
	return nil
}

// setUpRoute prepares the route step of o.Route: the group consumes the
// routed stream, which must keep the route step's guarantee
// (route.CheckStream), and Run routes the input into it.
func (g *Group) setUpRoute(ctx context.Context, o Options) error {
	ro := *o.Route
	name := ro.RoutedStream
	st, err := lookupStream(ctx, g.js, g.log, "scale-out: routed stream (scale_out.routed_stream)", name)
	if err != nil {
		return err
	}
	if err := route.CheckStream(st.CachedInfo().Config, ro.RoutedSubject, ro.Partitions, ro.AckWait, ro.RestartMargin); err != nil {
		return fmt.Errorf("scale-out: %w", err)
	}
	g.inStream = name
	ro.Conn = o.Conn
	ro.Group = g.name
	ro.Key = o.Key
	ro.BundleMax = o.BundleMax
	ro.BundleForm = func() int { return int(g.bundles.Load()) }
	ro.ShutdownTimeout = o.ShutdownTimeout
	ro.Registry = o.Registry
	ro.Logger, ro.Logs = g.log, g.logs
	ro.Reporter = o.Reporter
	ro.PartitionKey = o.PartitionKey
	g.routed = &ro
	if err := g.routed.Validate(); err != nil {
		return fmt.Errorf("scale-out: %w", err)
	}
	g.log.Info("scale-out: the route step partitions the input", "why", o.RouteWhy, "routed_stream", name,
		"routed_subjects", route.Subject(0, ro.RoutedSubject, "<input subject>"), "route_consumer", route.ConsumerName(g.name))
	return nil
}

// groupMappings is the static consumer group's membership: member p<i>
// consumes partition i.
func groupMappings(n int) []pcgroups.MemberMapping {
	mappings := make([]pcgroups.MemberMapping, n)
	for i := range mappings {
		mappings[i] = pcgroups.MemberMapping{Member: layout.Member(i), Partitions: []int{i}}
	}
	return mappings
}
