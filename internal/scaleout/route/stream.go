package route

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/streams"
)

// ErrRoutedStream wraps every error of CheckStream: the routed stream
// cannot keep the route step's guarantee.
var ErrRoutedStream = errors.New("route: routed stream unfit")

// ConsumerName returns the name of the route step's one shared durable
// consumer on the input stream: <group>-route.
func ConsumerName(group string) string { return group + "-route" }

// Subject returns the subject a message of input subject inputSubject is
// routed to in partition p: <p>.<routedSubject>.<inputSubject>. The
// partition is the first token, as a static pcgroups group reads it.
func Subject(p int, routedSubject, inputSubject string) string {
	return strconv.Itoa(p) + "." + routedSubject + "." + inputSubject
}

// SplitSubject is the inverse of Subject: it returns the partition and the
// input subject of a routed subject, and false when subject is not
// <p>.<routedSubject>.<input subject>.
func SplitSubject(routedSubject, subject string) (p int, inputSubject string, ok bool) {
	first, rest, found := strings.Cut(subject, ".")
	if !found {
		return 0, "", false
	}
	p, err := strconv.Atoi(first)
	if err != nil || p < 0 {
		return 0, "", false
	}
	inputSubject, ok = strings.CutPrefix(rest, routedSubject+".")
	if !ok || inputSubject == "" {
		return 0, "", false
	}
	return p, inputSubject, true
}

// splitRouted returns the partition (-1 when the subject had its
// partition token stripped) and the input subject of a routed subject.
func splitRouted(routedSubject, subject string) (p int, inputSubject string, ok bool) {
	if inputSubject, ok = strings.CutPrefix(subject, routedSubject+"."); ok && inputSubject != "" {
		return -1, inputSubject, true
	}
	return SplitSubject(routedSubject, subject)
}

// parseMsgID reads the input stream and sequence from a routed copy's id
// (MsgID).
func parseMsgID(id string) (stream string, seq uint64, err error) {
	rest, ok := strings.CutPrefix(id, "route:")
	i := strings.LastIndexByte(rest, ':')
	if !ok || i <= 0 {
		return "", 0, fmt.Errorf("route: %s %q is not route:<stream>:<sequence>", nats.MsgIdHdr, id)
	}
	seq, err = strconv.ParseUint(rest[i+1:], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("route: %s %q: sequence: %w", nats.MsgIdHdr, id, err)
	}
	return rest[:i], seq, nil
}

// InputOf returns where the input message a message of the routed stream
// copies is: the input subject, read from the routed subject (with or
// without its partition token), and the input stream and sequence, read
// from HeaderInputStream and HeaderInputSequence or, on a copy routed
// without them, from its Nats-Msg-Id (MsgID). Unlike OriginOf it needs
// neither HeaderKey nor the Nats-Msg-Id that the stage replaces on its
// forwarded copy, so it serves a routed message's dead letter at any
// step. ok is false when the message does not say.
func InputOf(routedSubject, subject string, h nats.Header) (inputSubject, stream string, seq uint64, ok bool) {
	if _, inputSubject, ok = splitRouted(routedSubject, subject); !ok {
		return "", "", 0, false
	}
	if stream = h.Get(HeaderInputStream); stream != "" {
		seq, err := strconv.ParseUint(h.Get(HeaderInputSequence), 10, 64)
		return inputSubject, stream, seq, err == nil
	}
	stream, seq, err := parseMsgID(h.Get(nats.MsgIdHdr))
	return inputSubject, stream, seq, err == nil
}

// MsgID returns the Nats-Msg-Id of the routed copy of the input message at
// sequence seq of stream: route:<stream>:<seq>. It is the same on every
// delivery and in every instance, so the routed stream's duplicate window
// drops a copy routed again after a redelivery.
func MsgID(stream string, seq uint64) string {
	return "route:" + stream + ":" + strconv.FormatUint(seq, 10)
}

// InputTime reads HeaderInputTime of a routed message: the input stream's
// timestamp of the original, RFC 3339 with nanoseconds, in UTC.
func InputTime(h nats.Header) (time.Time, error) {
	v := h.Get(HeaderInputTime)
	if v == "" {
		return time.Time{}, fmt.Errorf("route: header %s absent", HeaderInputTime)
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("route: header %s: %w", HeaderInputTime, err)
	}
	return t, nil
}

// formatInputTime is the text of HeaderInputTime (InputTime reads it).
func formatInputTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// StreamSubjects returns the routed stream's subjects, one per partition:
// <p>.<routedSubject>.> for p in 0..partitions-1. A single
// *.<routedSubject>.> is not possible: nats-server refuses a stream whose
// subjects overlap its own API ($JSC.> among them) unless it is no-ack, and
// a leading wildcard overlaps them.
func StreamSubjects(routedSubject string, partitions int) []string {
	out := make([]string, partitions)
	for p := range out {
		out[p] = strconv.Itoa(p) + "." + routedSubject + ".>"
	}
	return out
}

// StreamConfig returns the configuration to create the routed stream with,
// the one place that decides it (why each setting: docs/scale-out.md, "Code
// notes"): a work queue on StreamSubjects, the duplicate window of the route
// consumer's ackWait, file storage, replicas (0 means 1) and atomic publish.
// CheckStream accepts it.
func StreamConfig(name, routedSubject string, partitions, replicas int, ackWait, restartMargin time.Duration) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        name,
		Description: "dedupe-stage route step: input messages under their partition <p>." + routedSubject + ".<input subject>",
		Subjects:    StreamSubjects(routedSubject, partitions),
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
		Duplicates:  streams.DuplicateWindow(ackWait, restartMargin),

		AllowAtomicPublish: true,
	}
}

// CheckStream reports whether sc, the routed stream as the server has it,
// keeps the route step's guarantee: work-queue retention, subjects that
// hold StreamSubjects(routedSubject, partitions), and a duplicate window of at least
// streams.RequiredDuplicateWindow(ackWait, nil, restartMargin): the
// shortest that drops a copy routed again after a redelivery. Errors wrap
// ErrRoutedStream and name the stream, the field and the values.
func CheckStream(sc jetstream.StreamConfig, routedSubject string, partitions int, ackWait, restartMargin time.Duration) error {
	var errs []error
	if sc.Retention != jetstream.WorkQueuePolicy {
		errs = append(errs, fmt.Errorf("%w: stream %s has retention %s, want workqueue (each routed message is consumed once by its partition's owner)",
			ErrRoutedStream, sc.Name, sc.Retention))
	}
	var missing []string
	for _, want := range StreamSubjects(routedSubject, partitions) {
		if !slices.Contains(sc.Subjects, want) {
			missing = append(missing, want)
		}
	}
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("%w: stream %s has subjects %v, and lacks %q of the %d partitions", ErrRoutedStream, sc.Name, sc.Subjects, missing, partitions))
	}
	if need := streams.RequiredDuplicateWindow(ackWait, nil, restartMargin); sc.Duplicates < need {
		fix := fmt.Sprintf("nats stream edit %s --dupe-window %v --force", sc.Name, streams.DuplicateWindow(ackWait, restartMargin))
		errs = append(errs, finding.WithFix(fmt.Errorf("%w: stream %s has a duplicate window of %v, but an input message can be routed again %v after its first routing (route ack_wait %v plus restart margin %v); raise it (%s)",
			ErrRoutedStream, sc.Name, sc.Duplicates, need, ackWait, restartMargin, fix), fix))
	}
	return errors.Join(errs...)
}

// Origin is what a routed message says about the input message it copies.
type Origin struct {
	// Partition is the partition the route step chose; -1 when the
	// subject had its partition token stripped (as a pcgroups consumer
	// hands it over).
	Partition int
	// Subject, Stream and Sequence locate the input message.
	Subject  string
	Stream   string
	Sequence uint64
	// Key is HeaderKey: the key the route step extracted.
	Key []byte
	// Time is HeaderInputTime: the input stream's timestamp.
	Time time.Time
}

// OriginOf reads the origin of a routed message from its subject (with or
// without the leading partition token) and headers. It fails when the
// message was not written by the route step under routedSubject.
func OriginOf(routedSubject, subject string, h nats.Header) (Origin, error) {
	o := Origin{}
	var ok bool
	if o.Partition, o.Subject, ok = splitRouted(routedSubject, subject); !ok {
		return Origin{}, fmt.Errorf("route: subject %q is not [<p>.]%s.<input subject>", subject, routedSubject)
	}
	var err error
	if o.Stream, o.Sequence, err = parseMsgID(h.Get(nats.MsgIdHdr)); err != nil {
		return Origin{}, err
	}
	if o.Key = []byte(h.Get(HeaderKey)); len(o.Key) == 0 {
		return Origin{}, fmt.Errorf("route: header %s absent", HeaderKey)
	}
	if o.Time, err = InputTime(h); err != nil {
		return Origin{}, err
	}
	return o, nil
}

// OriginOfMsg returns the origin of msg, a message of the routed stream:
// a part of a form-2 bundle (Unbundle) carries it as fields; any other
// message's is read from its subject and headers (OriginOf). It fails
// when the message was not written by the route step under routedSubject.
func OriginOfMsg(routedSubject string, msg jetstream.Msg) (Origin, error) {
	p, ok := msg.(*part)
	if !ok || !p.origin {
		return OriginOf(routedSubject, msg.Subject(), msg.Headers())
	}
	o := Origin{Stream: p.stream, Sequence: p.seq, Key: []byte(p.key), Time: time.Unix(0, p.at).UTC()}
	if o.Partition, o.Subject, ok = splitRouted(routedSubject, p.subject); !ok {
		return Origin{}, fmt.Errorf("route: subject %q is not [<p>.]%s.<input subject>", p.subject, routedSubject)
	}
	if len(o.Key) == 0 {
		return Origin{}, errors.New("route: a bundle's entry without a key")
	}
	return o, nil
}

// InputOfMsg is InputOf for msg, a message of the routed stream, a part of
// a form-2 bundle included (its input stream and sequence are fields).
func InputOfMsg(routedSubject string, msg jetstream.Msg) (inputSubject, stream string, seq uint64, ok bool) {
	p, isPart := msg.(*part)
	if !isPart || !p.origin {
		return InputOf(routedSubject, msg.Subject(), msg.Headers())
	}
	if _, inputSubject, ok = splitRouted(routedSubject, p.subject); !ok {
		return "", "", 0, false
	}
	return inputSubject, p.stream, p.seq, true
}

// IsCopyHeader reports whether k is a header the route step adds to a
// routed copy alone (copyHeader): HeaderKey, HeaderInputTime,
// HeaderOriginalMsgID, HeaderInputStream or HeaderInputSequence. The stage
// leaves them out of its forwarded copy, as a form-2 bundle's parts and
// inputs judged where they arrive never have them.
func IsCopyHeader(k string) bool {
	switch k {
	case HeaderKey, HeaderInputTime, HeaderOriginalMsgID, HeaderInputStream, HeaderInputSequence:
		return true
	}
	return false
}

// copyHeader returns the headers of the routed copy of an input of stream
// at seq, with headers in, key and time at: in's, its publish directives
// and Nats-Msg-Id left out, and HeaderOriginalMsgID (when in has an id),
// the copy's Nats-Msg-Id (MsgID), HeaderKey, HeaderInputTime,
// HeaderInputStream and HeaderInputSequence.
func copyHeader(in nats.Header, key, stream string, seq uint64, at time.Time) nats.Header {
	h := make(nats.Header, len(in)+6)
	for k, v := range in {
		if forward.IsDirective(k) || k == jetstream.MsgIDHeader {
			continue
		}
		h[k] = v
	}
	// The added headers' values share one array: one allocation, not six.
	vs := make([]string, 0, 6)
	set := func(k, v string) {
		vs = append(vs, v)
		h[k] = vs[len(vs)-1 : len(vs) : len(vs)]
	}
	if id := in.Get(jetstream.MsgIDHeader); id != "" {
		set(HeaderOriginalMsgID, id)
	}
	set(jetstream.MsgIDHeader, MsgID(stream, seq))
	set(HeaderKey, key)
	set(HeaderInputTime, formatInputTime(at))
	set(HeaderInputStream, stream)
	set(HeaderInputSequence, strconv.FormatUint(seq, 10))
	return h
}
