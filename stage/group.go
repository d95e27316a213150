package stage

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/route"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// The stage's side of scale-out (docs/scale-out.md): internal/scaleout is
// this instance's part in the group; the stage hands it what it delivers
// and asks each partition's scaleout.Owner before judging a batch.

// ErrChangelog means the output stream does not keep what a new owner of
// a partition restores it from; New refuses to start on a stream
// configured so. See scaleout.ErrChangelog.
var ErrChangelog = scaleout.ErrChangelog

// ErrControlSubjects means the output or dead-letter stream has no
// subjects for the partitions' fences; New refuses to start. See
// scaleout.ErrControlSubjects.
var ErrControlSubjects = scaleout.ErrControlSubjects

// setUpGroup prepares this instance's part in the scale-out group
// (scaleout.New checks the streams and creates the consumer group); Run
// joins it.
func (s *Stage) setUpGroup(ctx context.Context, reg prometheus.Registerer) error {
	cfg := s.cfg
	o := scaleout.Options{Config: cfg, Conn: s.nc, JS: s.js, Window: s.win.W, Clock: s.clock, Key: s.keyFn,
		AtomicOutput: s.atomicOutput, ShutdownTimeout: s.shutdownTimeout, Registry: reg,
		Logger: s.log, Logs: s.logs, Reporter: s.status, Restoring: s.status.setRestoring}
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
	s.group = g
	s.health = newGroupHealth(reg, cfg, s.js, s.logs)
	return nil
}

// routed reports whether the group consumes the routed stream, whose
// messages the route step wrote; subject is its subject prefix.
func (s *Stage) routed() (stream, subject string, ok bool) {
	if s.group == nil {
		return "", "", false
	}
	return s.group.Route()
}

// dispatchRouted is dispatch for a message of the routed stream, which the
// route step already checked: its key and input subject come from what the
// route step wrote (route.OriginOfMsg), not derived again.
func (s *Stage) dispatchRouted(msg jetstream.Msg, p int, routedSubject string, parts []chan item, dlq chan<- deadLetter) {
	o, err := route.OriginOfMsg(routedSubject, msg)
	if err != nil {
		dlq <- deadLetter{msg: msg, reason: deadletter.ReasonNotRouted,
			detail: "in the routed stream, but not written by the route step: " + err.Error()}
		return
	}
	it := item{msg: msg, key: o.Key, fp: fingerprint(msg.Data()), pin: msg.Headers().Get(scaleout.HeaderPinID), subject: o.Subject}
	if s.totals != nil {
		var dl *deadLetter
		if it.tot, dl = s.totals.extract(msg, o.Subject, msg.Data(), o.Time); dl != nil {
			dlq <- *dl
			return
		}
	}
	parts[p] <- it
}

// dispatchLocal is dispatch for an input the route step hands to this
// instance, which owns its partition p (scaleout.Group.Run's local):
// the route step extracted key, and checked the size; the input itself,
// not a copy, is judged and acked. It reports false, taking nothing, when
// the partition's queue is full, or when the totals cannot read the input
// (its dead letter would wait on the dead-letter queue): the route step
// then routes a copy, which the member path judges or dead-letters.
func (s *Stage) dispatchLocal(msg jetstream.Msg, p int, key []byte, parts []chan item) bool {
	it := item{msg: msg, key: bytes.Clone(key), fp: fingerprint(msg.Data()), pin: scaleout.LocalPin}
	if s.totals != nil {
		var dl *deadLetter
		if it.tot, dl = s.totals.extract(msg, msg.Subject(), msg.Data(), time.Time{}); dl != nil {
			return false
		}
	}
	select {
	case parts[p] <- it:
		return true
	default:
		return false
	}
}
