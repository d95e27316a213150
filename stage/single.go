package stage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
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
	wm   *watermark // the store's watermark, set by prepare
}

// streams implements source: the streams as they are.
func (*singleSource) streams(_ config.Config, _ window.Window, streams []StreamToCreate) ([]StreamToCreate, error) {
	return streams, nil
}

// bind implements source: it binds the durable consumer, creating it when
// it is missing.
func (src *singleSource) bind(ctx context.Context, s *Stage) (jetstream.ConsumerConfig, error) {
	src.s = s
	var err error
	if src.cons, err = ensureConsumer(ctx, s.js, src.cfg.Input, s.log); err != nil {
		return jetstream.ConsumerConfig{}, err
	}
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
		consumerCfg = consumerToCreate(cfg.Input)
		return consumerCfg, []finding.Finding{{Check: "consumer", Severity: finding.Info,
			Message: fmt.Sprintf("consumer %s on stream %s does not exist; run creates it (durable, pull, ack_wait %v, max_ack_pending %d, max_deliver %d)",
				cfg.Input.Consumer, cfg.Input.Stream, consumerCfg.AckWait, consumerCfg.MaxAckPending, consumerCfg.MaxDeliver)}}
	default:
		return consumerCfg, []finding.Finding{finding.FromError("consumer", finding.Error,
			fmt.Errorf("look up consumer %s on %s: %w", cfg.Input.Consumer, cfg.Input.Stream, err))}
	}
}

// check implements source: the consumer is all there is to check.
func (*singleSource) check(context.Context, jetstream.JetStream, window.Window, bool) []finding.Finding {
	return nil
}

// open implements source: there is nothing more to prepare.
func (*singleSource) open(context.Context, *Stage, prometheus.Registerer) error { return nil }

// prepare implements source: it reads the output back after the store's
// watermark (readBack) and tracks the watermark from where it ends. With
// totals on, each forward carries its contribution (soleOwner.Annotate),
// which the restore adds with its key (docs/state.md, "The watermark").
func (src *singleSource) prepare(ctx context.Context) error {
	start, err := src.readBack(ctx)
	if err != nil {
		return err
	}
	src.wm = newWatermark(src.s.store.Partitions(), start)
	return nil
}

// queue implements source: the worker reads the partition's queue itself.
func (*singleSource) queue(ch chan item, _ time.Duration) <-chan item { return ch }

// run implements source: it pulls messages and hands them to in until ctx
// is done. A broken subscription (consumer deleted, server restarted) is
// re-made with backoff.
func (src *singleSource) run(ctx context.Context, in *intake) {
	s, cfg := src.s, src.cfg
	s.log.Info("judging messages", "stream", cfg.Input.Stream, "consumer", cfg.Input.Consumer,
		"output_stream", cfg.Output.Stream, "output_subjects", cfg.Output.Subject("<input subject>"))
	pull := min(cfg.Input.MaxAckPending, max(cfg.Pipeline.BatchSize*len(in.parts), 256))
	b := retry.NewBackoff()
	for ctx.Err() == nil {
		iter, err := src.cons.Messages(jetstream.PullMaxMessages(pull))
		if err != nil {
			s.log.Warn("pull subscription failed, retrying", "err", err)
			b.Wait(ctx)
			continue
		}
		stop := context.AfterFunc(ctx, iter.Drain)
		for {
			msg, err := iter.Next()
			if err != nil {
				if !errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() == nil {
					s.log.Warn("pull subscription ended, re-subscribing", "err", err)
				}
				break
			}
			b.Reset()
			in.deliver(arrival{msg: msg, p: -1})
		}
		stop()
		iter.Stop()
		if ctx.Err() == nil {
			b.Wait(ctx)
		}
	}
}

// finish implements source: once every batch is committed, it stores the
// watermark as it stands, which the last commits may have left behind
// (each stores the value it saw, and they land in any order), so that the
// next start reads nothing back.
func (src *singleSource) finish() {
	if w, ok := src.wm.settled(); ok {
		if err := src.s.store.SetWatermark(w); err != nil {
			src.s.log.Warn("could not store the watermark at stop; the next start reads back more of the output", "err", err)
		}
	}
}

// backlog implements source: the input consumer's backlog.
func (src *singleSource) backlog(ctx context.Context) (pending, ackPending uint64, err error) {
	info, err := src.cons.Info(ctx)
	if err != nil {
		return 0, 0, err
	}
	return info.NumPending, uint64(info.NumAckPending), nil
}

// owner implements source: every partition is this instance's.
func (src *singleSource) owner(p *state.Partition) ownership {
	return soleOwner{p: p.Index(), wm: src.wm}
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
