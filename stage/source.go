package stage

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/internal/ownership"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// source is where the stage's messages come from: the single instance's
// durable consumer (singleSource) or this instance's part in a scale-out
// group (groupSource). The stage reads the same with either: a source
// hands it decoded arrivals (intake) and answers what differs between
// the two, so that Run, dispatch, the dead letters, the totals and the
// streams set-up never ask which one it is. sourceFor is the one place
// that chooses.
type source interface {
	// streams adapts streams, the input, output and dead-letter streams
	// in that order as StreamsToCreate makes them for one instance, to
	// this source, given the derived window w.
	streams(cfg config.Config, w window.Window, streams []StreamToCreate) ([]StreamToCreate, error)
	// bind binds (or makes) the consumer the source reads and returns the
	// settings the stage takes its redelivery limits from.
	bind(ctx context.Context, s *Stage) (jetstream.ConsumerConfig, error)
	// checkConsumer is bind for Check: it only reads. in is the input
	// stream, nil when it does not exist. It returns what bind would
	// return, and what it finds.
	checkConsumer(ctx context.Context, in jetstream.Stream) (jetstream.ConsumerConfig, []finding.Finding)
	// check runs, read-only for Check, the checks open makes, given the
	// window w and whether the output would be published as atomic
	// batches.
	check(ctx context.Context, js jetstream.JetStream, w window.Window, atomic bool) []finding.Finding
	// open prepares the source once the stage knows how it publishes;
	// its metrics go on reg.
	open(ctx context.Context, s *Stage, reg prometheus.Registerer) error
	// prepare readies what the partitions need once the store is open,
	// before any batch is judged: a single instance restores every
	// partition from the output after its cursor (docs/state.md, "One
	// recovery path"); a group's partitions restore as they are taken.
	prepare(ctx context.Context) error
	// queue returns the channel partition's worker reads from, fed by
	// ch (the stage's queue of the partition).
	queue(ch chan item, ackWait time.Duration) <-chan item
	// run consumes until ctx is done, handing every message to in.
	run(ctx context.Context, in *intake)
	// finish releases what the source holds once the workers have
	// finished; Run calls it last.
	finish()
	// backlog reads the input backlog of what this instance judges.
	backlog(ctx context.Context) (inputBacklog, error)
	// pendingFloors reads from the servers, for each partition this
	// instance judges, the input time of the oldest message it may still
	// be handed again (delivered before and not acknowledged): floor(p)
	// with ok false means none. Expiry never passes it (runExpiry).
	pendingFloors(ctx context.Context) (floor func(p int) (time.Time, bool), err error)
	// owner returns the ownership of partition p.
	owner(p *state.Partition) ownership.Owner
	// inputOf returns where the input of msg, a message of stream, is when
	// that is not msg itself (a copy the source made of it); ok false
	// means msg is its own input.
	inputOf(msg jetstream.Msg, stream string) (subject, inStream string, seq uint64, ok bool)
	// copyHeader reports whether header k of a message the source decoded
	// (an arrival with a subject) was added by the source to its copy
	// alone, and is left out of the forwarded copy.
	copyHeader(k string) bool
	// maxEventTimeAhead is how far ahead of the clock a total's event time
	// may be; ok false means any.
	maxEventTimeAhead() (d time.Duration, ok bool)
	// deadLetterFenced handles dead letters the server refused because
	// the dead-letter fence of partition p, taken under pin, moved.
	deadLetterFenced(p int, pin string)
	// holds reports whether this instance owns partition p now; p -1,
	// the partition of a key no partition holds, is owned only by a
	// single instance, which owns every partition.
	holds(p int) bool
	// confirms reports whether this instance owns partition p now, as
	// holds does, and, in a group, still holds its fence as the output
	// stream's leader has it: what an operator's answer claims
	// (Stage.coverage).
	confirms(ctx context.Context, p int) bool
	// keeps reports whether this instance keeps partition p's state up to
	// date, so that expiry runs on it: it owns p, or is one of its warm
	// standbys (docs/scale-out.md §4.4).
	keeps(p int) bool
}

// sourceFor returns the source of cfg, not yet bound.
func sourceFor(cfg config.Config) source {
	if cfg.ScaleOut.Enabled {
		return &groupSource{cfg: cfg}
	}
	return &singleSource{cfg: cfg}
}

// arrival is one message a source hands the stage, decoded as far as the
// source knows it.
type arrival struct {
	msg jetstream.Msg
	// p is the partition the message was delivered for, or -1: the
	// partition of its key (or group).
	p int
	// pin is the pin it was delivered under ("" for none).
	pin string
	// key, subject and at are what a copy's source recorded of its input:
	// the key, the input subject and the input's stream time. A nil key
	// means the stage reads the key from msg itself.
	key     []byte
	subject string
	at      time.Time
	// undecodable, when not "", is why the source could not decode the
	// message: it is dead-lettered (not_routed) once its limits are
	// checked.
	undecodable string
}

// intake is what a source hands its messages to: the stage's partition
// queues and its dead-letter queue.
type intake struct {
	s     *Stage
	parts []chan item
	dlq   chan<- deadletter.Letter
}

// reject dead-letters msg as not routed, with detail, before any other
// check: the source cannot even tell which messages it holds.
func (in *intake) reject(msg jetstream.Msg, detail string) {
	in.dlq <- deadletter.Letter{Msg: msg, Reason: deadletter.ReasonNotRouted, Detail: detail}
}

// deliver judges what can be judged of a without state (limits, key,
// version) and routes it to its partition: a.p, or the partition of its
// key (or group) when a.p is -1. It waits while that partition's queue is full.
func (in *intake) deliver(a arrival) {
	s, msg := in.s, a.msg
	data := msg.Data()
	md, mdErr := msg.Metadata() // parsed once: its delivery count and its input time
	if s.maxDeliver > 0 && mdErr == nil && md.NumDelivered >= uint64(s.maxDeliver) {
		in.dlq <- deadletter.Letter{Msg: msg, Reason: deadletter.ReasonMaxDeliver,
			Detail: fmt.Sprintf("delivery %d of at most %d: dead-lettered so the server cannot drop it", md.NumDelivered, s.maxDeliver)}
		return
	}
	if limit := int(s.cfg.Pipeline.MaxMessageBytes); len(data) > limit {
		in.dlq <- deadletter.Letter{Msg: msg, Reason: deadletter.ReasonOversized,
			Detail: fmt.Sprintf("payload is %d bytes, pipeline.max_message_bytes is %d", len(data), limit)}
		return
	}
	if a.undecodable != "" {
		in.dlq <- deadletter.Letter{Msg: msg, Reason: deadletter.ReasonNotRouted, Detail: a.undecodable}
		return
	}
	at := a.at
	if at.IsZero() {
		if mdErr != nil {
			in.dlq <- deadletter.Letter{Msg: msg, Reason: deadletter.ReasonNotRouted,
				Detail: "no input stream timestamp, so no input time to judge it at: " + mdErr.Error()}
			return
		}
		at = md.Timestamp
	}
	if s.inputTimeHook != nil {
		at = s.inputTimeHook(msg, at)
	}
	key, subject := a.key, a.subject
	if key == nil {
		var err error
		if key, err = s.keyFn.Key(msg.Subject(), msg.Headers(), data); err != nil {
			reason, detail := deadletter.KeyReason(err, deadletter.ReasonNoKey)
			in.dlq <- deadletter.Letter{Msg: msg, Reason: reason, Detail: detail}
			return
		}
	}
	if subject == "" {
		subject = msg.Subject()
	}
	var version uint64
	if s.version != nil {
		var err error
		if version, err = s.version.Version(msg.Subject(), msg.Headers(), data); err != nil {
			reason, detail := deadletter.KeyReason(err, deadletter.ReasonBadVersion)
			in.dlq <- deadletter.Letter{Msg: msg, Reason: reason, Detail: detail}
			return
		}
	}
	route := key
	var tot state.Contribution
	if s.totals != nil {
		// The group routes: every copy of a key carries the same group.
		var dl *deadletter.Letter
		if tot, dl = s.totals.extract(msg, subject, data, at); dl != nil {
			in.dlq <- *dl
			return
		}
		route = []byte(tot.Group)
	}
	p := a.p
	if p < 0 {
		p = state.PartitionOf(route, len(in.parts))
	}
	in.parts[p] <- item{msg: msg, key: key, fp: fingerprint(data), tot: tot, pin: a.pin, subject: a.subject,
		version: version, versioned: s.version != nil, at: at}
}

// offer queues a, an input whose key a.key the source already read and
// checked the size of, for partition a.p without waiting; the input
// itself, not a copy, is judged and acked, with its version as deliver
// reads it. It reports false, taking nothing, when the partition's queue
// is full, or when the version or the totals cannot be read (its dead
// letter would wait on the dead-letter queue): the source then hands it on
// another way.
func (in *intake) offer(a arrival) bool {
	s, msg := in.s, a.msg
	md, err := msg.Metadata()
	if err != nil {
		return false
	}
	it := item{msg: msg, key: bytes.Clone(a.key), fp: fingerprint(msg.Data()), pin: a.pin, at: md.Timestamp}
	if s.inputTimeHook != nil {
		it.at = s.inputTimeHook(msg, it.at)
	}
	if s.version != nil {
		v, err := s.version.Version(msg.Subject(), msg.Headers(), msg.Data())
		if err != nil {
			return false
		}
		it.version, it.versioned = v, true
	}
	if s.totals != nil {
		var dl *deadletter.Letter
		if it.tot, dl = s.totals.extract(msg, msg.Subject(), msg.Data(), it.at); dl != nil {
			return false
		}
	}
	select {
	case in.parts[a.p] <- it:
		return true
	default:
		return false
	}
}
