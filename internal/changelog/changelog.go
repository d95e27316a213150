package changelog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/retry"
)

// Headers a forwarded message carries so that it can be read back as a
// record.
const (
	// HeaderFirstSeen is the key's first-seen time, decided once at judge
	// time: Unix nanoseconds, in decimal.
	HeaderFirstSeen = "Dedupe-First-Seen"
	// HeaderFingerprint is the payload fingerprint stored with the key: 16
	// lowercase hexadecimal digits of the uint64.
	HeaderFingerprint = "Dedupe-Fingerprint"
	// HeaderGroup is the group of the total the forward added to, when
	// totals are on (AnnotateTotal).
	HeaderGroup = "Dedupe-Group"
	// HeaderBucket is the start of that total's time bucket: Unix seconds,
	// in decimal.
	HeaderBucket = "Dedupe-Bucket"
	// HeaderValue is what the forward added to that total: a decimal
	// integer >= 0.
	HeaderValue = "Dedupe-Value"
	// HeaderKey is the key of a forward whose Nats-Msg-Id is not the key
	// alone (with key.version, VersionedID), and of a key-state record.
	HeaderKey = "Dedupe-Key"
	// HeaderVersion is a versioned forward's version, in decimal.
	HeaderVersion = "Dedupe-Version"
)

// Record is one partition record read back from the changelog: a key, as
// the partition stores it, and what its forward added to a total.
type Record struct {
	// Key is the dedupe key (the message's Nats-Msg-Id).
	Key []byte
	// FirstSeen is the key's first-seen time, decided at judge time.
	FirstSeen time.Time
	// Fingerprint is the payload fingerprint stored with the key.
	Fingerprint uint64
	// Group is the group of the total the forward added Value to, in the
	// bucket starting at Bucket; "" when the forward added to no total.
	Group string
	// Bucket is the start of the total's time bucket, in UTC.
	Bucket time.Time
	// Value is what the forward added to the total.
	Value int64
	// Version is the key's version when HasVersion (key.version).
	Version uint64
	// HasVersion is true when the forward carried a version.
	HasVersion bool
	// WindowStart, on a key-state record (DecodeKeyState), is where a
	// repeat moved the key's window to: a refresh's, or the forgotten
	// record's when a repeat had moved it. Zero on a forward.
	WindowStart time.Time
	// Forgotten, on a forget (DecodeKeyState), is when the key was
	// forgotten; the rest is the key's record as the forget found it. Zero
	// otherwise.
	Forgotten time.Time
	// OutputSeq is the output stream sequence of the key's forward: a
	// forward's own sequence (Restore sets it), or a key-state record's
	// HeaderOutputSeq; 0 when unknown.
	OutputSeq uint64
}

// ErrNotARecord means a message read from a partition's subjects does not
// carry a record: no Nats-Msg-Id, or a missing or malformed
// HeaderFirstSeen or HeaderFingerprint, or a malformed contribution to a
// total. Decode's errors wrap it and are permanent (retry.IsPermanent):
// reading the message again gives the same answer.
var ErrNotARecord = errors.New("changelog: message is not a partition record")

// Annotate sets the record headers on h (a forward's headers): firstSeen
// and fingerprint, as Decode reads them back. The key travels as the
// message's Nats-Msg-Id, which the caller sets.
func Annotate(h nats.Header, firstSeen time.Time, fingerprint uint64) {
	h.Set(HeaderFirstSeen, strconv.FormatInt(firstSeen.UnixNano(), 10))
	h.Set(HeaderFingerprint, fmt.Sprintf("%016x", fingerprint))
}

// AnnotateFirstSeen sets the record headers on h, the headers of a forward
// whose body is its input's, as unchanged as the fingerprint was taken
// from: HeaderFirstSeen alone. The record's fingerprint is its body's
// (Fingerprint), which DecodeForward computes, so the forward does not
// carry HeaderFingerprint: every byte of a forward is stored twice by an
// atomic batch, and under an fsync per message those bytes cost events/s
// (bench/RESULTS.md, "events/s under fsync, before and after the input
// clock").
func AnnotateFirstSeen(h nats.Header, firstSeen time.Time) {
	h[HeaderFirstSeen] = []string{strconv.FormatInt(firstSeen.UnixNano(), 10)}
}

// AnnotateTotal sets the headers of what a forward added to a total on h:
// value to the total of group in the bucket starting at bucket (a whole
// number of seconds). group must be a valid header value (no control
// characters), as a total's group is (sink.CheckGroup).
func AnnotateTotal(h nats.Header, group string, bucket time.Time, value int64) {
	h.Set(HeaderGroup, group)
	h.Set(HeaderBucket, strconv.FormatInt(bucket.Unix(), 10))
	h.Set(HeaderValue, strconv.FormatInt(value, 10))
}

// Decode reads the record m, a forward, carries (see DecodeForward).
func Decode(m jetstream.Msg) (Record, error) {
	return DecodeForward(m.Headers(), m.Data())
}

// DecodeHeader reads a record from a message's headers: the key from
// Nats-Msg-Id (KeyOf; with key.version, HeaderKey and HeaderVersion), the
// first-seen time and the fingerprint from the headers Annotate sets, and
// the contribution from those AnnotateTotal sets when HeaderGroup is
// present. It returns an error wrapping ErrNotARecord, permanent, when one
// of them is missing or malformed.
func DecodeHeader(h nats.Header) (Record, error) {
	return decodeHeader(h, nil, false)
}

// DecodeForward reads the record a forward with headers h and body data
// carries: DecodeHeader, except that a forward without HeaderFingerprint
// (AnnotateFirstSeen) has the fingerprint of its body, data.
func DecodeForward(h nats.Header, data []byte) (Record, error) {
	return decodeHeader(h, data, true)
}

// decodeHeader is DecodeHeader; with fromBody, a missing HeaderFingerprint
// is data's fingerprint.
func decodeHeader(h nats.Header, data []byte, fromBody bool) (Record, error) {
	key, version, versioned, err := ForwardKey(h)
	if err != nil {
		return Record{}, err
	}
	r, err := decodeRecord(h, key, data, fromBody)
	if err != nil {
		return r, err
	}
	r.Version, r.HasVersion = version, versioned
	if r.Group, r.Bucket, r.Value, err = DecodeTotal(h); err != nil {
		return Record{}, err
	}
	return r, nil
}

// DecodeTotal reads what a forward with headers h added to a total, from
// the headers AnnotateTotal sets: group "" (and no error) when h has no
// HeaderGroup. It returns an error wrapping ErrNotARecord, permanent, when
// HeaderGroup is empty or HeaderBucket or HeaderValue is missing or
// malformed.
func DecodeTotal(h nats.Header) (group string, bucket time.Time, value int64, err error) {
	vals := h.Values(HeaderGroup)
	if len(vals) == 0 {
		return "", time.Time{}, 0, nil
	}
	if vals[0] == "" {
		_, err := notARecord("empty %s", HeaderGroup)
		return "", time.Time{}, 0, err
	}
	b := h.Get(HeaderBucket)
	secs, err := strconv.ParseInt(b, 10, 64)
	if err != nil {
		_, err := notARecord("%s %q is not Unix seconds", HeaderBucket, b)
		return "", time.Time{}, 0, err
	}
	val := h.Get(HeaderValue)
	n, err := strconv.ParseInt(val, 10, 64)
	if err != nil || n < 0 {
		_, err := notARecord("%s %q is not an integer >= 0", HeaderValue, val)
		return "", time.Time{}, 0, err
	}
	return vals[0], time.Unix(secs, 0).UTC(), n, nil
}

// ForwardKey returns the key of a forward with headers h, and its version
// when versioned: from its Nats-Msg-Id (KeyOf), or with key.version from
// HeaderKey and HeaderVersion when the id is their VersionedID. It returns
// an error wrapping ErrNotARecord, permanent, when h has no Nats-Msg-Id or
// one KeyOf cannot read.
func ForwardKey(h nats.Header) (key string, version uint64, versioned bool, err error) {
	id := h.Get(jetstream.MsgIDHeader)
	if id == "" {
		_, err := notARecord("no %s", jetstream.MsgIDHeader)
		return "", 0, false, err
	}
	id, ok := KeyOf(h, id)
	if !ok || id == "" {
		_, err := notARecord("%s %q does not end in %s %q", jetstream.MsgIDHeader, h.Get(jetstream.MsgIDHeader), HeaderForgotten, h.Get(HeaderForgotten))
		return "", 0, false, err
	}
	key, version, versioned = versionOf(h, id)
	return key, version, versioned, nil
}

// notARecord returns a permanent error wrapping ErrNotARecord.
func notARecord(format string, args ...any) (Record, error) {
	return Record{}, retry.MarkPermanent(fmt.Errorf("%w: "+format, append([]any{ErrNotARecord}, args...)...))
}

// decodeRecord reads key's record from the headers Annotate sets; with
// fromBody, from those AnnotateFirstSeen sets too, the fingerprint then
// data's.
func decodeRecord(h nats.Header, key string, data []byte, fromBody bool) (Record, error) {
	fs := h.Get(HeaderFirstSeen)
	ns, err := strconv.ParseInt(fs, 10, 64)
	if err != nil || ns <= 0 {
		return notARecord("%s %q is not positive Unix nanoseconds", HeaderFirstSeen, fs)
	}
	if fromBody && len(h.Values(HeaderFingerprint)) == 0 {
		return Record{Key: []byte(key), FirstSeen: time.Unix(0, ns), Fingerprint: Fingerprint(data)}, nil
	}
	fp := h.Get(HeaderFingerprint)
	v, err := strconv.ParseUint(fp, 16, 64)
	if err != nil || len(fp) != 16 {
		return notARecord("%s %q is not 16 hexadecimal digits", HeaderFingerprint, fp)
	}
	return Record{Key: []byte(key), FirstSeen: time.Unix(0, ns), Fingerprint: v}, nil
}

// VersionedID returns the Nats-Msg-Id of a forward of key at version:
// "<key>:v<version>", so that the output stream's duplicate window tells
// the versions of a key apart. Such a forward also carries HeaderKey and
// HeaderVersion (AnnotateVersion).
func VersionedID(key string, version uint64) string {
	return key + ":v" + strconv.FormatUint(version, 10)
}

// AnnotateVersion sets HeaderKey and HeaderVersion on h, the headers of a
// forward whose id is VersionedID(key, version).
func AnnotateVersion(h nats.Header, key string, version uint64) {
	h.Set(HeaderKey, key)
	h.Set(HeaderVersion, strconv.FormatUint(version, 10))
}

// versionOf returns the key and version of a forward with id (its
// Nats-Msg-Id without a forget's suffix) and headers h: those of
// HeaderKey and HeaderVersion when id is their VersionedID, else id and
// no version. A message's own headers of these names, on a forward
// without key.version, leave its id the key.
func versionOf(h nats.Header, id string) (key string, version uint64, ok bool) {
	key, vs := h.Get(HeaderKey), h.Get(HeaderVersion)
	if key == "" || vs == "" {
		return id, 0, false
	}
	v, err := strconv.ParseUint(vs, 10, 64)
	if err != nil || VersionedID(key, v) != id {
		return id, 0, false
	}
	return key, v, true
}

// ControlRoot is the first token of every control record's subject.
const ControlRoot = "_dedupe"

// ControlSubjects returns the subjects of the control records (fences,
// key-state records) of a stream whose messages are under prefix:
// "_dedupe.<prefix>.>". An output or dead-letter stream with fences holds
// them beside "<prefix>.>".
func ControlSubjects(prefix string) string { return ControlRoot + "." + prefix + ".>" }

// FenceSubject returns partition p's fence subject in an output stream
// whose forwarded messages are under outputPrefix:
// "_dedupe.<outputPrefix>.fence.<p>".
func FenceSubject(outputPrefix string, p int) string {
	return ControlRoot + "." + outputPrefix + ".fence." + strconv.Itoa(p)
}

// PartitionSubject returns the output subject of a message of partition p
// that arrived on inputSubject: "<outputPrefix>.<p>.<inputSubject>".
func PartitionSubject(outputPrefix string, p int, inputSubject string) string {
	return outputPrefix + "." + strconv.Itoa(p) + "." + inputSubject
}

// PartitionFilter returns the subject filter that matches every
// PartitionSubject of partition p and nothing else: "<outputPrefix>.<p>.>".
// It matches no fence subject.
func PartitionFilter(outputPrefix string, p int) string {
	return outputPrefix + "." + strconv.Itoa(p) + ".>"
}

// takeAttempts bounds how often Take writes the fence when other writers
// keep moving it between its read and its write.
const takeAttempts = 10

// fenceBody is the payload of a fence message, for people reading the
// stream.
type fenceBody struct {
	Instance string    `json:"instance"`
	Time     time.Time `json:"time"`
}

// Take takes a partition's fence for instance: it publishes a fence message
// on fenceSubject expecting the subject's last sequence (0 when none) and
// returns the new one; from then on the server refuses every publish that
// expects an earlier fence. A race with another writer (10071) is tried
// again up to 10 times, then gives an error for which retry.IsFenced is
// true; transient failures are retried for StepBound at most.
func Take(ctx context.Context, js jetstream.JetStream, stream, fenceSubject, instance string) (uint64, error) {
	ctx, cancel := boundStep(ctx)
	defer cancel()
	var st jetstream.Stream
	err := retry.Do(ctx, "fence", func() error {
		ctx, cancel := Request(ctx)
		defer cancel()
		var err error
		st, err = js.Stream(ctx, stream)
		return err
	}, retry.Options{})
	if err != nil {
		return 0, fmt.Errorf("changelog: take %s: stream %s: %w", fenceSubject, stream, err)
	}
	var raced error
	for range takeAttempts {
		var last uint64
		err := retry.Do(ctx, "fence", func() error {
			ctx, cancel := Request(ctx)
			defer cancel()
			m, err := st.GetLastMsgForSubject(ctx, fenceSubject)
			switch {
			case errors.Is(err, jetstream.ErrMsgNotFound):
				last = 0
				return nil
			case err != nil:
				return err
			}
			last = m.Sequence
			return nil
		}, retry.Options{})
		if err != nil {
			return 0, fmt.Errorf("changelog: take %s: read its last message: %w", fenceSubject, err)
		}
		body, err := json.Marshal(fenceBody{Instance: instance, Time: time.Now().UTC()})
		if err != nil {
			return 0, fmt.Errorf("changelog: take %s: %w", fenceSubject, err)
		}
		var seq uint64
		err = retry.Do(ctx, "fence", func() error {
			ctx, cancel := Request(ctx)
			defer cancel()
			m := &nats.Msg{Subject: fenceSubject, Data: body, Header: nats.Header{
				jetstream.ExpectedLastSubjSeqHeader:     {strconv.FormatUint(last, 10)},
				jetstream.ExpectedLastSubjSeqSubjHeader: {fenceSubject},
			}}
			ack, err := js.PublishMsg(ctx, m)
			if err == nil {
				seq = ack.Sequence
			}
			return err
		}, retry.Options{})
		switch {
		case err == nil:
			return seq, nil
		case retry.IsFenced(err):
			// Another writer (or a retried write of ours that did land)
			// moved the fence since the read: read it again.
			raced = err
			continue
		}
		return 0, fmt.Errorf("changelog: take %s expecting sequence %d: %w", fenceSubject, last, err)
	}
	return 0, fmt.Errorf("changelog: take %s: the fence moved under each of %d attempts: %w", fenceSubject, takeAttempts, raced)
}

// StepBound is how long one step of a takeover retries transient
// failures before it gives up with the last one: reading the output
// stream (StreamState), writing a fence (Take, Refresh) and opening a
// restore's reader. A step that gives up fails the takeover (or the
// refresh) with a transient error; its batch stays unacked and comes
// back, and the partition's next batch tries again. So no step holds a
// partition's worker, and with it the messages the worker keeps in
// progress, for longer than this, whatever the cluster does.
const StepBound = 30 * time.Second

// stepBound is StepBound (a variable for the package's tests).
var stepBound = StepBound

// boundStep returns ctx bounded by stepBound, for one step's retries.
func boundStep(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, stepBound)
}

// RequestTimeout bounds one request of a step (one attempt of its retry
// loop), as nats.go's JetStream API bounds a request whose context has no
// deadline: a request or its answer lost with a connection that died mid
// write gets no answer ever, and without this it held its step's whole
// StepBound in one attempt (a takeover's snapshot lookup, bounded only by
// the snapshot transfer's hour, held its partition that long).
const RequestTimeout = 5 * time.Second

// Request returns ctx bounded by RequestTimeout, for one request.
func Request(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, RequestTimeout)
}

// StreamState reads stream's configuration and state, as a takeover does
// before it takes a fence: transient failures are retried for StepBound
// at most.
func StreamState(ctx context.Context, js jetstream.JetStream, stream string) (*jetstream.StreamInfo, error) {
	ctx, cancel := boundStep(ctx)
	defer cancel()
	var info *jetstream.StreamInfo
	err := retry.Do(ctx, "fence", func() error {
		ctx, cancel := Request(ctx)
		defer cancel()
		st, err := js.Stream(ctx, stream)
		if err == nil {
			info = st.CachedInfo()
		}
		return err
	}, retry.Options{})
	if err != nil {
		return nil, fmt.Errorf("changelog: read stream %s: %w", stream, err)
	}
	return info, nil
}

// restoreBuffer is how many messages Restore's reader asks for at once.
const restoreBuffer = 4096

// RestoreReopenAfter is how long Restore's reader may deliver nothing
// before Restore replaces it with a new one: well under the pin's TTL
// (10 s by default), which a takeover after detection must beat. A
// replacement costs a consumer's create and delete; a reader that is
// merely slow loses nothing by it.
const RestoreReopenAfter = 3 * time.Second

// How long Restore waits (variables for the package's tests).
var (
	// restoreIdle is how long one wait for the next message lasts.
	restoreIdle = 2 * time.Second
	// restoreReopen is how long a reader may deliver nothing before
	// Restore opens a new one from the message after the last it read.
	restoreReopen = RestoreReopenAfter
	// restoreStall is how long Restore waits with no message at all
	// before it gives up with a transient error, so that a lost consumer
	// never holds a takeover forever.
	restoreStall = 30 * time.Second
)

// RestoreStats is what a Restore did.
type RestoreStats struct {
	// Records is how many records Restore passed to its fn.
	Records int
	// Reopens is how many times a reader that delivered nothing for
	// restoreReopen was replaced by a new one.
	Reopens int
	// Skipped is how many messages that carry no record were skipped
	// (Span.SkipForeign).
	Skipped int
}

// firstSince returns the sequence of the first message of stream stored
// at or after since (one past the last when there is none): every record,
// on any subject, stored at or after since is at or after it. A consumer
// of no filter, delivering by start time, starts there (its delivered
// stream sequence is one less before it delivers anything); the server
// finds it by time alone. A consumer filtered on a partition's wildcard
// would start at the partition's first record instead, but the server
// starts it with a pass over every subject the filter matches, which at
// 10M subjects outlasted every attempt; and nats-server 2.15 starts a
// consumer of several filters by time at the first message of whichever
// filter begins after that time, skipping the others' records in between.
// The consumer runs on any replica: one that is behind answers an earlier
// sequence (the next one it would store), from which the restore reads
// more, never less.
func firstSince(ctx context.Context, js jetstream.JetStream, stream string, since time.Time) (uint64, error) {
	ctx, cancel := boundStep(ctx)
	defer cancel()
	var from uint64
	err := retry.Do(ctx, "restore", func() error {
		ctx, cancel := Request(ctx)
		defer cancel()
		c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since})
		if err != nil {
			return err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		from = info.Delivered.Stream + 1
		_ = js.DeleteConsumer(ctx, stream, info.Name) // else it lingers for its inactive threshold
		return nil
	}, retry.Options{})
	return from, err
}

// startSince returns the sequence at which a restore of the records on
// filters stored at or after since starts: the stream's first message
// stored at or after since (firstSince), whatever its subject.
func startSince(ctx context.Context, js jetstream.JetStream, stream string, filters []string, since time.Time) (uint64, error) {
	from, err := firstSince(ctx, js, stream, since)
	if err != nil {
		return 0, fmt.Errorf("changelog: restore %s from stream %s: %w", strings.Join(filters, ","), stream, err)
	}
	return from, nil
}

// Span is what a restore reads: the records of one partition of a group,
// or of every partition of a single instance, from a sequence (or a time)
// up to and including a sequence the read must reach.
type Span struct {
	// Stream is the output stream.
	Stream string
	// Forwards are the subjects of the forwards to read: a group
	// partition's PartitionFilter, or a single instance's output subjects.
	Forwards []string
	// KeyState is the subject of the key-state records to read
	// (KeyStateSubject, or KeyStateSubjects for every partition); "" for
	// none.
	KeyState string
	// Fence is the partition's fence subject; "" for none. Fence messages
	// are not records: the one at UpTo ends the read.
	Fence string
	// From is the first sequence to read; 0 means from the first message
	// stored at or after Since, or with Since zero, from the start.
	From uint64
	// Since is where a read without From starts.
	Since time.Time
	// UpTo is the last sequence to read: the caller's fence, or the last
	// message on the subjects read. The read ends only at a message at or
	// past it, since the reader's replica may be catching up.
	UpTo uint64
	// SkipForeign makes a message that carries no record (another
	// producer's on the same subjects) skipped and counted
	// (RestoreStats.Skipped) instead of ending the read with an error; a
	// group's partition subjects hold records alone.
	SkipForeign bool
	// ReadAllUnder, when not 0, makes a read from From of fewer than this
	// many sequences (to UpTo) read every subject of the stream and leave
	// out the messages on others itself: the server starts a filtered
	// reader with a pass over the stream's subjects that match its
	// filters, which in a stream of many subjects costs more than reading
	// a short span whole (ReadAllUnderFor). 0: always filtered.
	ReadAllUnder uint64
}

// subjectsPerMessage is how many of a stream's subjects the server's
// pass at the start of a filtered reader goes through in the time an
// unfiltered reader takes to deliver one message: the pass took 70-500
// ms over a million subjects under one wildcard, a message 4-8 µs
// (nats-server 2.15, one server, file storage; the takeover figures are
// in bench/RESULTS.md, "Warm standbys").
const subjectsPerMessage = 64

// ReadAllUnderFor returns the Span.ReadAllUnder of a read of a stream that
// holds subjects subjects: below it, reading every message of the span
// costs less than the pass over the subjects a filtered reader starts
// with.
func ReadAllUnderFor(subjects uint64) uint64 { return subjects / subjectsPerMessage }

// reads reports whether subject is one sp reads: a forward's, its fence's
// or its key-state records'.
func (sp *Span) reads(subject string) bool {
	if subject == sp.Fence || (sp.KeyState != "" && SubjectMatches(sp.KeyState, subject)) {
		return true
	}
	for _, f := range sp.Forwards {
		if SubjectMatches(f, subject) {
			return true
		}
	}
	return false
}

// Restore reads partition records back from stream on filter, and the
// partition's key-state records on keySubject (KeyStateSubject; "" for
// none), from sequence from (else from the first stored at or after
// since, else all), up to and including upTo, the caller's fence on
// fenceSubject, passing each to fn with its stream sequence, in stream
// order: Read of one group partition's Span.
func Restore(ctx context.Context, js jetstream.JetStream, stream, filter, fenceSubject, keySubject string, from uint64, since time.Time, upTo uint64,
	fn func(r Record, seq uint64) error) (RestoreStats, error) {
	sp := Span{Stream: stream, Forwards: []string{filter}, KeyState: keySubject, Fence: fenceSubject, From: from, Since: since, UpTo: upTo}
	return Read(ctx, js, sp, func(r Record, _ string, seq uint64) error { return fn(r, seq) })
}

// Read reads the records of sp back, passing each to fn with its subject
// and stream sequence, in stream order (a key-state record has
// WindowStart or Forgotten set). It is the one restore of both modes: a
// group's new owner of a partition, and a single instance at start. It
// ends only at a message at or past sp.UpTo, as the reader's replica may
// be catching up (docs/scale-out.md, "Code notes"); a message that is no
// record (unless sp.SkipForeign) or fn's error ends it permanently, a
// stall transiently.
func Read(ctx context.Context, js jetstream.JetStream, sp Span, fn func(r Record, subject string, seq uint64) error) (RestoreStats, error) {
	var st RestoreStats
	from, upTo := sp.From, sp.UpTo
	if upTo == 0 || from > upTo {
		return st, nil
	}
	if from == 0 && !sp.Since.IsZero() {
		filters := append([]string(nil), sp.Forwards...)
		if sp.KeyState != "" {
			filters = append(filters, sp.KeyState)
		}
		var err error
		if from, err = startSince(ctx, js, sp.Stream, filters, sp.Since); err != nil {
			return st, err
		}
		if from > upTo {
			return st, nil
		}
	}
	rd := &reader{ctx: ctx, js: js, sp: sp}
	pending, err := rd.open(from)
	if err != nil {
		return st, err
	}
	defer rd.close()
	// Done at UpTo: every record at or below it was stored before it, so
	// the reader's replica delivers them all before it. A quiet spell
	// proves nothing (the replica may be catching up, or the server sent
	// messages a loaded client has not read yet), so it only waits on,
	// with a new reader after restoreReopen; one past restoreStall ends the
	// restore with a transient error, and it is tried again.
	var read uint64
	last := max(from, 1) - 1 // the stream sequence of the last message read
	heard := time.Now()
	for {
		m, err := rd.it.Next(jetstream.NextMaxWait(restoreIdle))
		if errors.Is(err, nats.ErrTimeout) {
			if err := rd.quiet(time.Since(heard), last+1, read, pending, &st); err != nil {
				return st, err
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return st, fmt.Errorf("changelog: restore %s: %d records read: %w", rd.name(), st.Records, ctx.Err())
			}
			return st, fmt.Errorf("changelog: restore %s: %d records read: %w", rd.name(), st.Records, err)
		}
		heard = time.Now()
		md, err := m.Metadata()
		if err != nil {
			return st, fmt.Errorf("changelog: restore %s: %w", rd.name(), err)
		}
		seq := md.Sequence.Stream
		if seq <= last {
			continue // read again after the ordered consumer was reset
		}
		last = seq
		read++
		if done, err := rd.deliver(m, md, seq, upTo, fn, &st); done || err != nil {
			return st, err
		}
	}
}

// deliver passes the message m at sequence seq to fn when it is a record
// at or below upTo, and reports whether the restore is done: at upTo, or
// past it. Fence messages below upTo are earlier owners'.
func (r *reader) deliver(m jetstream.Msg, md *jetstream.MsgMetadata, seq, upTo uint64, fn func(r Record, subject string, seq uint64) error, st *RestoreStats) (done bool, err error) {
	if seq > upTo {
		return true, nil
	}
	subject := m.Subject()
	if r.all && !r.sp.reads(subject) {
		return seq == upTo, nil // another partition's, read with the span
	}
	if subject == r.sp.Fence {
		return seq == upTo, nil
	}
	keyState := r.sp.KeyState != "" && SubjectMatches(r.sp.KeyState, subject)
	var rec Record
	if keyState {
		rec, err = DecodeKeyState(m.Headers())
	} else {
		rec, err = decodeForward(m, md)
	}
	switch {
	case err != nil && r.sp.SkipForeign:
		st.Skipped++
		return seq == upTo, nil
	case err != nil:
		return true, fmt.Errorf("changelog: restore %s: sequence %d: %w", r.name(), seq, err)
	}
	if rec.OutputSeq == 0 && !keyState {
		rec.OutputSeq = seq // a forward: the key's forward is this message
	}
	if err := fn(rec, subject, seq); err != nil {
		return true, fmt.Errorf("changelog: restore %s: sequence %d: %w", r.name(), seq, err)
	}
	st.Records++
	return seq == upTo, nil
}

// decodeForward reads the record a forward carries (DecodeHeader). A
// forward written before forwards carried their record (one instance's,
// without HeaderFirstSeen) is read as such a forward was: its stored time
// as its first-seen time and the fingerprint of its body, which is the
// input's.
func decodeForward(m jetstream.Msg, md *jetstream.MsgMetadata) (Record, error) {
	h := m.Headers()
	if h.Get(HeaderFirstSeen) != "" {
		return DecodeForward(h, m.Data())
	}
	key, version, versioned, err := ForwardKey(h)
	if err != nil {
		return Record{}, err
	}
	r := Record{Key: []byte(key), FirstSeen: md.Timestamp, Fingerprint: Fingerprint(m.Data()), Version: version, HasVersion: versioned}
	if r.Group, r.Bucket, r.Value, err = DecodeTotal(h); err != nil {
		return Record{}, err
	}
	return r, nil
}

// Fingerprint is the payload fingerprint stored with a key: the xxhash64
// of the input's body, which its forward carries unchanged.
func Fingerprint(data []byte) uint64 { return xxhash.Sum64(data) }

// SubjectMatches reports whether subject matches filter, a subject with
// NATS wildcards ("*" one token, ">" the rest).
func SubjectMatches(filter, subject string) bool {
	for {
		ft, frest, fmore := strings.Cut(filter, ".")
		st, srest, smore := strings.Cut(subject, ".")
		switch {
		case ft == ">":
			return true
		case ft != "*" && ft != st:
			return false
		case !fmore || !smore:
			return !fmore && !smore
		}
		filter, subject = frest, srest
	}
}

// reader is Restore's reader of one partition, which Restore replaces when
// it falls silent.
type reader struct {
	ctx context.Context
	js  jetstream.JetStream
	sp  Span

	it     jetstream.MessagesContext // nil when closed
	all    bool                      // it reads every subject (Span.ReadAllUnder)
	stop   func() bool               // ends the ctx.Done hook that stops it
	remove func()                    // deletes its consumer
	opened time.Time
}

// open opens a reader from sequence from (restoreReader) and returns how
// many messages it had pending.
func (r *reader) open(from uint64) (uint64, error) {
	all := r.sp.ReadAllUnder > 0 && from > 0 && from <= r.sp.UpTo && r.sp.UpTo-from+1 < r.sp.ReadAllUnder
	it, pending, remove, err := restoreReader(r.ctx, r.js, r.sp, from, all)
	if err != nil {
		return 0, err
	}
	r.all = all
	r.it, r.stop, r.remove, r.opened = it, context.AfterFunc(r.ctx, it.Stop), remove, time.Now()
	return pending, nil
}

// quiet handles a wait that brought no message, quiet long after the last
// one: past restoreStall it gives up with a transient error; past
// restoreReopen, with the reader open as long, it replaces the reader by
// one from sequence next. read and pending are for the error.
func (r *reader) quiet(quiet time.Duration, next, read, pending uint64, st *RestoreStats) error {
	if quiet > restoreStall {
		return fmt.Errorf("changelog: restore %s: no message for %v, %d of %d pending read, %d readers replaced",
			r.name(), quiet.Round(time.Second), read, pending, st.Reopens)
	}
	if quiet > restoreReopen && time.Since(r.opened) > restoreReopen {
		r.close()
		if _, err := r.open(next); err != nil {
			return err
		}
		st.Reopens++
	}
	return nil
}

// close stops the reader, if open, and deletes its consumer.
func (r *reader) close() {
	if r.it != nil {
		r.stop()
		r.it.Stop()
		r.remove()
		r.it = nil
	}
}

// name names what r reads, for errors: its forwards' subjects.
func (r *reader) name() string { return strings.Join(r.sp.Forwards, ",") }

// readerInactive is how long the server keeps a restore reader's
// consumer once nothing pulls from it: the reader deletes it when it
// closes, so this bounds only what a crash or a failed delete leaves.
// nats.go's default for an ordered consumer is 5 minutes, and a warm
// standby opens a reader per partition every couple of seconds under
// load: readers that outlived their use filled the output stream's
// consumers up to the server's limit (1,000 a stream by default since
// nats-server 2.15), after which no takeover could open its restore.
const readerInactive = 30 * time.Second

// restoreReader opens Restore's reader: an ordered consumer of the
// partition's records, fences and key-state records (keySubject, when not
// "") from sequence from, or with all of every subject; how many messages
// it had pending when it was created; and remove, which deletes its
// consumer (in the background, bounded by RequestTimeout) once the reader
// is stopped.
func restoreReader(ctx context.Context, js jetstream.JetStream, sp Span, from uint64, all bool) (it jetstream.MessagesContext, pending uint64, remove func(), err error) {
	cfg := jetstream.OrderedConsumerConfig{InactiveThreshold: readerInactive}
	if !all {
		cfg.FilterSubjects = append(cfg.FilterSubjects, sp.Forwards...)
		for _, sub := range []string{sp.Fence, sp.KeyState} {
			if sub != "" {
				cfg.FilterSubjects = append(cfg.FilterSubjects, sub)
			}
		}
	}
	stream := sp.Stream
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	var cons jetstream.Consumer
	// Opening it is retried for StepBound at most: a takeover that cannot
	// open one gives up with the last failure, and is tried again with the
	// partition's next batch.
	octx, cancel := boundStep(ctx)
	defer cancel()
	err = retry.Do(octx, "restore", func() error {
		rctx, cancel := Request(octx)
		defer cancel()
		c, err := js.OrderedConsumer(rctx, stream, cfg)
		if err != nil {
			return err
		}
		info, err := c.Info(rctx)
		if err != nil {
			return err
		}
		cons, pending = c, info.NumPending
		return nil
	}, retry.Options{})
	if err != nil {
		return nil, 0, nil, fmt.Errorf("changelog: restore %s from stream %s: %w", strings.Join(sp.Forwards, ","), stream, err)
	}
	remove = func() {
		// The ordered consumer's current one: it makes a new one after a
		// gap, and deletes the one before itself.
		info := cons.CachedInfo()
		if info == nil {
			return
		}
		name := info.Name
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), RequestTimeout)
			defer cancel()
			_ = js.DeleteConsumer(ctx, stream, name)
		}()
	}
	it, err = cons.Messages(jetstream.PullMaxMessages(restoreBuffer))
	if err != nil {
		remove()
		return nil, 0, nil, fmt.Errorf("changelog: restore %s from stream %s: %w", strings.Join(sp.Forwards, ","), stream, err)
	}
	return it, pending, remove, nil
}

// StartSince returns the sequence at which a read of the records on each
// of filters stored at or after since starts, as Read starts a Span
// without From: a warm standby bounds its first read from there.
func StartSince(ctx context.Context, js jetstream.JetStream, stream string, filters []string, since time.Time) (uint64, error) {
	return startSince(ctx, js, stream, filters, since)
}
