package stage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/admin"
	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/internal/ownership"
	"github.com/dedupe-stage/dedupe-stage/internal/pending"
	"github.com/dedupe-stage/dedupe-stage/internal/pull"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// singleSource is the source of one instance alone: the durable pull
// consumer on the input stream. It owns every partition, and its messages
// are their own inputs.
type singleSource struct {
	cfg  config.Config
	s    *Stage
	cons jetstream.Consumer
}

// streams implements source: the streams as they are.
func (*singleSource) streams(_ config.Config, _ window.Window, streams []StreamToCreate) ([]StreamToCreate, error) {
	return streams, nil
}

// bind implements source: it binds the durable consumer, creating it when
// it is missing, and has the stage's health follow the fetches from it
// (CompFetch).
func (src *singleSource) bind(ctx context.Context, s *Stage) (jetstream.ConsumerConfig, error) {
	src.s = s
	var err error
	if src.cons, err = ensureConsumer(ctx, s.js, src.cfg.Input, s.log); err != nil {
		return jetstream.ConsumerConfig{}, err
	}
	in := src.cfg.Input
	s.status.watchPulls("CONSUMER.MSG.NEXT."+in.Stream+"."+in.Consumer, fmt.Sprintf("consumer %s on stream %s", in.Consumer, in.Stream))
	return src.cons.CachedInfo().Config, nil
}

// checkConsumer implements source: the durable consumer, or the one bind
// would create.
func (src *singleSource) checkConsumer(ctx context.Context, in jetstream.Stream) (jetstream.ConsumerConfig, []finding.Finding) {
	cfg := src.cfg
	consumerCfg := memberConsumer(cfg.Input)
	if in == nil {
		return consumerCfg, nil
	}
	c, err := in.Consumer(ctx, cfg.Input.Consumer)
	switch {
	case err == nil:
		return c.CachedInfo().Config, nil
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		consumerCfg = ConsumerToCreate(cfg.Input)
		if f, ok := createRefused(ctx, in, consumerCfg); ok {
			return consumerCfg, []finding.Finding{f}
		}
		return consumerCfg, []finding.Finding{{Check: "consumer", Severity: finding.Info,
			Message: fmt.Sprintf("consumer %s on stream %s does not exist; run creates it (durable, pull, ack_wait %v, max_ack_pending %d, max_deliver %d)",
				cfg.Input.Consumer, cfg.Input.Stream, consumerCfg.AckWait, consumerCfg.MaxAckPending, consumerCfg.MaxDeliver)}}
	default:
		return consumerCfg, []finding.Finding{finding.FromError("consumer", finding.Error,
			fmt.Errorf("look up consumer %s on %s: %w", cfg.Input.Consumer, cfg.Input.Stream, err))}
	}
}

// createRefused returns the finding when the server would refuse to
// create cc on the input stream in: on a work-queue stream, a filter that
// another consumer's overlaps (or two without a filter); and a warning
// when cc's filter subject matches none of the stream's subjects, so that
// the consumer would receive nothing. ok is false when there is neither.
func createRefused(ctx context.Context, in jetstream.Stream, cc jetstream.ConsumerConfig) (_ finding.Finding, ok bool) {
	sc := in.CachedInfo().Config
	intro := fmt.Sprintf("consumer %s on stream %s does not exist, and ", cc.Durable, sc.Name)
	f := cc.FilterSubject
	if f != "" && len(sc.Subjects) > 0 && !slices.ContainsFunc(sc.Subjects, func(s string) bool { return server.SubjectsCollide(f, s) }) {
		return finding.Finding{Check: "consumer", Severity: finding.Warning,
			Message: intro + fmt.Sprintf("run would create it with filter subject %q (input.filter_subject), which matches none of the stream's subjects %v: it would receive nothing", f, sc.Subjects)}, true
	}
	if sc.Retention != jetstream.WorkQueuePolicy {
		return finding.Finding{}, false
	}
	lister := in.ListConsumers(ctx)
	var infos []*jetstream.ConsumerInfo
	for ci := range lister.Info() {
		infos = append(infos, ci)
	}
	for _, ci := range infos {
		other := ci.Config.FilterSubjects
		if ci.Config.FilterSubject != "" {
			other = append(other, ci.Config.FilterSubject)
		}
		if f == "" || len(other) == 0 || slices.ContainsFunc(other, func(o string) bool { return server.SubjectsCollide(f, o) }) {
			return finding.Finding{Check: "consumer", Severity: finding.Error,
				Message: intro + fmt.Sprintf("the server would refuse to create it: the stream is a workqueue stream, and consumer %s already takes %v of it (a work queue gives each subject to one consumer); "+
					"use that consumer (input.consumer) or give input.filter_subject a subject no other consumer takes", ci.Name, orAll(other))}, true
		}
	}
	return finding.Finding{}, false
}

// orAll is a consumer's filter subjects, or "every subject" without one.
func orAll(filters []string) any {
	if len(filters) == 0 {
		return "every subject"
	}
	return filters
}

// check implements source: the output stream holds the partitions'
// key-state subjects, as the restore at start requires
// (checkKeyStateSubjects).
func (src *singleSource) check(ctx context.Context, js jetstream.JetStream, _ window.Window, _ bool) []finding.Finding {
	cfg := src.cfg
	st, err := js.Stream(ctx, cfg.Output.Stream)
	if err != nil {
		return nil // a missing output stream is the streams check's finding
	}
	if err := checkKeyStateSubjects(st.CachedInfo().Config, cfg.Output.SubjectPrefix, cfg.State.Partitions); err != nil {
		return []finding.Finding{finding.FromError("output_subjects", finding.Error, err)}
	}
	return nil
}

// open implements source: there is nothing more to prepare.
func (*singleSource) open(context.Context, *Stage, prometheus.Registerer) error { return nil }

// prepare implements source: it restores every partition from the output
// stream after its cursor (restore), as a group's new owner of a
// partition does, before any batch is judged.
func (src *singleSource) prepare(ctx context.Context) error {
	return src.restore(ctx)
}

// queue implements source: the worker reads the partition's queue itself.
func (*singleSource) queue(ch chan item, _ time.Duration) <-chan item { return ch }

// Fetch health: the server sends an idle heartbeat on each pull request
// every fetchHeartbeat, and a pull subscription that misses two ends with
// jetstream.ErrNoHeartbeat. One that has run for fetchProven without an
// error has had its pulls answered, so fetching works although no message
// came.
const (
	fetchHeartbeat = 5 * time.Second
	fetchProven    = 3 * fetchHeartbeat
)

// run implements source: it pulls messages and hands them to in until ctx
// is done. A broken subscription (consumer deleted, server restarted) is
// re-made with backoff; each failure is reported to the stage's health
// (CompFetch), and the first message, or fetchProven without an error,
// recovers it.
func (src *singleSource) run(ctx context.Context, in *intake) {
	s, cfg := src.s, src.cfg
	s.log.Info("judging messages", "stream", cfg.Input.Stream, "consumer", cfg.Input.Consumer,
		"output_stream", cfg.Output.Stream, "output_subjects", cfg.Output.Subject("<input subject>"))
	o := pull.Options{
		MaxMessages: min(cfg.Input.MaxAckPending, max(cfg.Pipeline.BatchSize*len(in.parts), 256)),
		AckWait:     s.ackWait,
		Logger:      s.log,
		Conn:        s.nc,
		Heartbeat:   fetchHeartbeat,
		Failed:      src.fetchFailed,
		Subscribed: func() (func(), func()) {
			p := newFetchProof(src.fetchWorks)
			return p.works, p.end
		},
	}
	pull.Run(ctx, src.cons, o, func(msg jetstream.Msg) { in.deliver(arrival{msg: msg, p: -1}) })
}

// fetchFailed reports a failed pull subscription to the stage's health:
// at once when the server answered that the consumer is gone, else as one
// failed attempt.
func (src *singleSource) fetchFailed(err error) {
	err = fmt.Errorf("consumer %s on stream %s: %w", src.cfg.Input.Consumer, src.cfg.Input.Stream, err)
	if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
		src.s.status.failedNow(CompFetch, err)
		return
	}
	src.s.status.Failed(CompFetch, err)
}

// fetchWorks reports a working pull subscription to the stage's health.
func (src *singleSource) fetchWorks() { src.s.status.Succeeded(CompFetch, false) }

// fetchProof reports, once, that a pull subscription works: at its first
// message, or fetchProven after it started when it has not ended by then.
type fetchProof struct {
	mu     sync.Mutex
	done   atomic.Bool // reported, or ended
	timer  *time.Timer
	report func()
}

// newFetchProof starts the proof of a pull subscription that has just
// started; report is called at most once.
func newFetchProof(report func()) *fetchProof {
	p := &fetchProof{report: report}
	p.timer = time.AfterFunc(fetchProven, p.works)
	return p
}

// works reports the subscription working, unless it was reported or ended.
func (p *fetchProof) works() {
	if p.done.Load() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done.CompareAndSwap(false, true) {
		p.report()
	}
}

// end stops the proof: the subscription ended, and a report of it working
// can no longer come after its failure is reported.
func (p *fetchProof) end() {
	p.timer.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done.Store(true)
}

// finish implements source: every commit stored its partition's cursor,
// so there is nothing to store at stop.
func (*singleSource) finish() {}

// backlog implements source: the input consumer's backlog. A consumer
// the server no longer has fails CompFetch at once.
func (src *singleSource) backlog(ctx context.Context) (inputBacklog, error) {
	info, err := src.cons.Info(ctx)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		src.fetchFailed(err)
	}
	if err != nil {
		return inputBacklog{}, err
	}
	return inputBacklog{total: admin.Backlog{Pending: info.NumPending, AckPending: uint64(info.NumAckPending)}}, nil
}

// pendingFloors implements source: the durable consumer's first
// unacknowledged message, for every partition.
func (src *singleSource) pendingFloors(ctx context.Context) (func(int) (time.Time, bool), error) {
	f, err := pending.ConsumerFloor(ctx, src.s.js, src.cfg.Input.Stream, src.cfg.Input.Consumer)
	if err != nil {
		return nil, err
	}
	return func(int) (time.Time, bool) { return f, !f.IsZero() }, nil
}

// owner implements source: every partition is this instance's.
func (src *singleSource) owner(p *state.Partition) ownership.Owner {
	return soleOwner{s: src.s, p: p.Index()}
}

// inputOf implements source: every message is its own input.
func (*singleSource) inputOf(jetstream.Msg, string) (string, string, uint64, bool) {
	return "", "", 0, false
}

// copyHeader implements source: the source adds no header.
func (*singleSource) copyHeader(string) bool { return false }

// maxEventTimeAhead implements source: any event time is taken.
func (*singleSource) maxEventTimeAhead() (time.Duration, bool) { return 0, false }

// deadLetterFenced implements source: dead letters are not fenced, so
// none is refused for a fence.
func (*singleSource) deadLetterFenced(int, string) {}

// holds implements source: a single instance owns every partition.
func (*singleSource) holds(int) bool { return true }

// confirms implements source: a single instance owns every partition.
func (*singleSource) confirms(context.Context, int) bool { return true }

// keeps implements source: a single instance keeps every partition.
func (*singleSource) keeps(int) bool { return true }
