package changelog

import (
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/state"
)

// Key-state records are the changes to a key's record that no forward
// shows: a repeat that moved the key's window (window.refresh_on_repeat)
// and an operator's forget. Each is a header-only message on the
// partition's KeyStateSubject, written by the owner in a publish that
// expects its fence, and applied by a restore in stream order.
const (
	// HeaderOp is a key-state record's operation: OpRefresh or OpForget.
	HeaderOp = "Dedupe-Op"
	// HeaderWindowStart is a refresh's new window start: Unix nanoseconds,
	// in decimal.
	HeaderWindowStart = "Dedupe-Window-Start"
	// HeaderOutputSeq is the output stream sequence of the key's forward,
	// in decimal, when the owner knew it.
	HeaderOutputSeq = "Dedupe-Output-Seq"

	// OpRefresh moves a key's window start to HeaderWindowStart. The
	// record also carries the key's record (HeaderFirstSeen,
	// HeaderFingerprint, HeaderVersion), so that a restore that no longer
	// holds the key (its first-seen time is past the window) restores it.
	OpRefresh = "refresh"
	// OpForget marks a key forgotten at HeaderForgotten (a tombstone); it
	// carries the key's record too, and HeaderWindowStart when a repeat
	// moved its window.
	OpForget = "forget"
)

// KeyStateSubjects returns the subject filter of every partition's
// key-state records in an output stream whose forwarded messages are under
// outputPrefix: "_dedupe.<outputPrefix>.key.*".
func KeyStateSubjects(outputPrefix string) string {
	return ControlRoot + "." + outputPrefix + ".key.*"
}

// KeyStatePartition returns the partition whose key-state subject
// (KeyStateSubject) in an output stream whose forwarded messages are under
// outputPrefix subject is; ok is false when it is none.
func KeyStatePartition(outputPrefix, subject string) (p int, ok bool) {
	rest, ok := strings.CutPrefix(subject, ControlRoot+"."+outputPrefix+".key.")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 0 && strconv.Itoa(n) == rest
}

// KeyRecord is the record a key-state record carries of key, whose state
// record is rec: what a restore needs to store the key when it holds no
// record of it.
func KeyRecord(key []byte, rec state.Record) Record {
	r := Record{Key: key, FirstSeen: rec.FirstSeen, Fingerprint: rec.Fingerprint, Version: rec.Version,
		HasVersion: rec.HasVersion, OutputSeq: rec.OutputSeq}
	if rec.Refreshed.After(rec.FirstSeen) {
		r.WindowStart = rec.Refreshed
	}
	return r
}

// KeyStateSubject returns partition p's key-state subject in an output
// stream whose forwarded messages are under outputPrefix:
// "_dedupe.<outputPrefix>.key.<p>". It is one of ControlSubjects.
func KeyStateSubject(outputPrefix string, p int) string {
	return ControlRoot + "." + outputPrefix + ".key." + strconv.Itoa(p)
}

// RefreshMsg returns the key-state record on subject (KeyStateSubject) of
// a repeat that moved the window of r.Key, whose record is r, to
// windowStart.
func RefreshMsg(subject string, r Record, windowStart time.Time) *nats.Msg {
	r.WindowStart = windowStart
	return keyStateMsg(subject, OpRefresh, r)
}

// ForgetMsg returns the key-state record (a tombstone) on subject
// (KeyStateSubject) of an operator's forget at forgotten of r.Key, whose
// record is r (its window start in r.WindowStart when a repeat moved it).
// It carries the record so that an owner that does not hold the key marks
// it as the old owner did, with the same window.
func ForgetMsg(subject string, r Record, forgotten time.Time) *nats.Msg {
	r.Forgotten = forgotten
	return keyStateMsg(subject, OpForget, r)
}

// keyStateMsg returns the header-only key-state record of op on subject
// carrying r.
func keyStateMsg(subject, op string, r Record) *nats.Msg {
	h := nats.Header{}
	h.Set(HeaderOp, op)
	h.Set(HeaderKey, string(r.Key))
	Annotate(h, r.FirstSeen, r.Fingerprint)
	if r.HasVersion {
		h.Set(HeaderVersion, strconv.FormatUint(r.Version, 10))
	}
	if !r.WindowStart.IsZero() {
		h.Set(HeaderWindowStart, strconv.FormatInt(r.WindowStart.UnixNano(), 10))
	}
	if !r.Forgotten.IsZero() {
		AnnotateForgotten(h, r.Forgotten)
	}
	if r.OutputSeq != 0 {
		h.Set(HeaderOutputSeq, strconv.FormatUint(r.OutputSeq, 10))
	}
	return &nats.Msg{Subject: subject, Header: h}
}

// DecodeKeyState reads a key-state record from a message's headers: the
// key's record, with Record.WindowStart set on a refresh (and on a forget
// of a record a repeat moved) and Record.Forgotten on a forget. It returns
// an error wrapping ErrNotARecord, permanent, when the operation is
// unknown or a header it needs is missing or malformed.
func DecodeKeyState(h nats.Header) (Record, error) {
	fail := func(format string, args ...any) (Record, error) {
		return notARecord("key-state record: "+format, args...)
	}
	key, op := h.Get(HeaderKey), h.Get(HeaderOp)
	if key == "" {
		return fail("no %s", HeaderKey)
	}
	if op != OpRefresh && op != OpForget {
		return fail("%s %q, want %s or %s", HeaderOp, op, OpRefresh, OpForget)
	}
	r, err := decodeRecord(h, key, nil, false)
	if err != nil {
		return r, err
	}
	if vs := h.Get(HeaderVersion); vs != "" {
		v, err := strconv.ParseUint(vs, 10, 64)
		if err != nil {
			return fail("%s %q is not a decimal integer", HeaderVersion, vs)
		}
		r.Version, r.HasVersion = v, true
	}
	if s := h.Get(HeaderOutputSeq); s != "" {
		seq, err := strconv.ParseUint(s, 10, 64)
		if err != nil || seq == 0 {
			return fail("%s %q is not a positive decimal integer", HeaderOutputSeq, s)
		}
		r.OutputSeq = seq
	}
	ws, f := h.Get(HeaderWindowStart), h.Get(HeaderForgotten)
	if ws != "" || op == OpRefresh {
		ns, err := strconv.ParseInt(ws, 10, 64)
		if err != nil || ns <= 0 {
			return fail("%s %q is not positive Unix nanoseconds", HeaderWindowStart, ws)
		}
		r.WindowStart = time.Unix(0, ns)
	}
	if op == OpForget {
		ns, err := strconv.ParseInt(f, 10, 64)
		if err != nil || ns <= 0 {
			return fail("%s %q is not positive Unix nanoseconds", HeaderForgotten, f)
		}
		r.Forgotten = time.Unix(0, ns)
	}
	return r, nil
}
