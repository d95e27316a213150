// Package sink writes the stage's absolute totals to places other systems
// read them from, keeping the larger value.
//
// The stage keeps optional totals per (group, time bucket): each new event
// adds to its group's bucket, and totals leave the stage as absolute values,
// not increments. A sink keeps, for every (group, bucket), the largest value
// it was ever given, so a replay from an older point, a flush that arrives
// late, or two instances overlapping during a failover never move a total
// backwards. A write whose value is not larger than the stored one is stale:
// it is skipped and counted in Result.Stale, never an error. Writes are
// idempotent, so a failed Write can simply be called again with the same
// totals.
//
// Keep-the-larger is only correct for totals that never shrink: counts, or
// sums of non-negative integer values. A Total's Value is an int64 and must
// not be negative; float sums are out of scope (they do not add up the same
// way twice, and "larger" would hide rounding).
//
// Three sinks implement the same interface:
//
//   - NewKV: a JetStream key-value bucket. The key is Total.ID(), the value
//     the decimal text of the total; updates are compare-and-set on the
//     key's revision, so the stored value only grows.
//   - NewStream: a JetStream stream, one message per total, de-duplicated by
//     Nats-Msg-Id within the stream's duplicate window. The stream is a log
//     of observations: readers keep the largest value per (group, bucket),
//     see Latest.
//   - NewPostgres: a PostgreSQL table, one upsert statement per batch with
//     GREATEST; see the schema below.
//
// Use:
//
//	s := sink.Instrument(sink.NewKV(kv), sink.NewMetrics(reg))
//	res, err := s.Write(ctx, []sink.Total{
//		{Group: "campaign-42", Bucket: hour, Value: 1017},
//	})
//	// res.Applied == 1 if 1017 was larger than what the bucket held,
//	// res.Stale == 1 if it was not.
//
// # PostgreSQL schema
//
// The PostgreSQL sink's table is created by CreateSchema, on request only
// (the sink never changes the schema by itself):
//
//	CREATE TABLE IF NOT EXISTS <table> (
//		group_key  text        NOT NULL,  -- Total.Group, as given
//		bucket     timestamptz NOT NULL,  -- Total.Bucket
//		total      bigint      NOT NULL,  -- Total.Value, the largest seen
//		updated_at timestamptz NOT NULL DEFAULT now(),  -- last raise
//		PRIMARY KEY (group_key, bucket))
//
// # Identifiers
//
// Total.ID names a (group, bucket) pair as "<group token>.<bucket unix
// seconds>", e.g. "campaign-42.1767225600". The group token is the group
// itself when it consists only of [A-Za-z0-9_-]; otherwise it is "=" followed
// by the unpadded base64url encoding of the group's bytes (e.g. group
// "tenant.a/x" becomes "=dGVuYW50LmEveA"). A raw token never contains "=", so
// the two forms cannot collide, and ParseID inverts ID exactly. IDs are valid
// JetStream KV keys, and group tokens are valid NATS subject tokens.
package sink

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Errors returned by the sinks, ParseID and the constructors. Errors from the
// underlying servers are wrapped with %w and keep their own identity.
var (
	// ErrClosed means Write was called after Close.
	ErrClosed = errors.New("sink: closed")
	// ErrBadTotal means a Total cannot be written: empty, oversized or
	// non-printable group, zero or sub-second bucket, or a negative value.
	// Nothing of the batch was written.
	ErrBadTotal = errors.New("sink: bad total")
	// ErrBadID means a string given to ParseID is not an ID that Total.ID
	// produces.
	ErrBadID = errors.New("sink: bad id")
	// ErrBadStored means the value stored under a key is not the decimal text
	// of a non-negative int64, so keep-the-larger cannot compare with it.
	ErrBadStored = errors.New("sink: stored value is not a non-negative decimal integer")
	// ErrConflicts means a compare-and-set kept losing to concurrent writers
	// and gave up after a bounded number of attempts. Calling Write again is
	// safe.
	ErrConflicts = errors.New("sink: too many concurrent updates")
	// ErrBadSubject means the stream sink's subject prefix is not a valid
	// NATS subject without wildcards.
	ErrBadSubject = errors.New("sink: bad subject prefix")
	// ErrBadTable means a PostgreSQL table name does not match
	// [a-z_][a-z0-9_]{0,62}, optionally qualified by one schema name of the
	// same form.
	ErrBadTable = errors.New("sink: bad table name")
	// ErrNoTable means the PostgreSQL table does not exist or lacks the
	// expected columns; create it with CreateSchema.
	ErrNoTable = errors.New("sink: table missing or wrong shape")
)

// MaxGroupLen is the longest group key, in bytes, that a Total may carry.
const MaxGroupLen = 256

// Total is the absolute value of one group's total in one time bucket.
//
// Its JSON form, {"group":...,"bucket":"RFC 3339 time","value":n}, is the
// payload of the stream sink's messages.
type Total struct {
	// Group is the group key, e.g. "campaign-42": non-empty, at most
	// MaxGroupLen bytes of valid UTF-8 without control characters.
	Group string `json:"group"`
	// Bucket is the start of the time bucket. It must be a whole second and
	// not the zero time; its location is ignored (sinks store it as UTC).
	Bucket time.Time `json:"bucket"`
	// Value is the absolute total: a count, or a sum of non-negative integer
	// values. It must not be negative. Float sums are out of scope.
	Value int64 `json:"value"`
}

// ID returns the stable identifier of t's (group, bucket) pair, independent
// of Value: "<group token>.<bucket unix seconds>" as described in the package
// comment. It is a valid JetStream KV key for every Total that passes
// validation (see ErrBadTotal).
func (t Total) ID() string {
	return EncodeGroup(t.Group) + "." + strconv.FormatInt(t.Bucket.Unix(), 10)
}

// EncodeGroup returns the token that stands for group in IDs and in the
// stream sink's subjects: group itself if it is non-empty and consists only
// of [A-Za-z0-9_-], otherwise "=" followed by the unpadded base64url encoding
// of group.
func EncodeGroup(group string) string {
	if rawGroup(group) {
		return group
	}
	return "=" + base64.RawURLEncoding.EncodeToString([]byte(group))
}

// rawGroup reports whether group can stand for itself in an ID.
func rawGroup(group string) bool {
	if group == "" {
		return false
	}
	for i := 0; i < len(group); i++ {
		c := group[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ParseID returns the group and bucket (in UTC) that id names. It accepts
// exactly the strings Total.ID returns for valid totals, so
// Total{Group: g, Bucket: b}.ID() == id for the returned g and b; anything
// else is ErrBadID.
func ParseID(id string) (group string, bucket time.Time, err error) {
	tok, secs, ok := strings.Cut(id, ".")
	if !ok {
		return "", time.Time{}, fmt.Errorf("%w: %q has no \".\"", ErrBadID, id)
	}
	if strings.HasPrefix(tok, "=") {
		b, err := base64.RawURLEncoding.DecodeString(tok[1:])
		if err != nil {
			return "", time.Time{}, fmt.Errorf("%w: %q: group token: %v", ErrBadID, id, err)
		}
		group = string(b)
	} else {
		group = tok
	}
	n, err := strconv.ParseInt(secs, 10, 64)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("%w: %q: bucket: %v", ErrBadID, id, err)
	}
	t := Total{Group: group, Bucket: time.Unix(n, 0).UTC()}
	if err := t.validate(); err != nil {
		return "", time.Time{}, fmt.Errorf("%w: %q: %v", ErrBadID, id, err)
	}
	if t.ID() != id {
		return "", time.Time{}, fmt.Errorf("%w: %q is not canonical (want %q)", ErrBadID, id, t.ID())
	}
	return t.Group, t.Bucket, nil
}

// CheckGroup reports why group cannot be a Total's Group, or nil: it must
// be non-empty, at most MaxGroupLen bytes of valid UTF-8 without control
// characters. The message names the byte at fault, not the group.
func CheckGroup(group string) error {
	if group == "" {
		return errors.New("empty")
	}
	if len(group) > MaxGroupLen {
		return fmt.Errorf("%d bytes, want at most %d", len(group), MaxGroupLen)
	}
	for i := 0; i < len(group); {
		r, size := utf8.DecodeRuneInString(group[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return fmt.Errorf("not valid UTF-8 at byte %d", i)
		case isControl(r):
			return fmt.Errorf("control character at byte %d", i)
		}
		i += size
	}
	return nil
}

// validate reports why t cannot be written, or nil.
func (t Total) validate() error {
	if err := CheckGroup(t.Group); err != nil {
		return fmt.Errorf("group %q: %w", t.Group, err)
	}
	switch {
	case t.Bucket.IsZero():
		return fmt.Errorf("group %q: zero bucket", t.Group)
	case t.Bucket.Nanosecond() != 0:
		return fmt.Errorf("group %q: bucket %s is not a whole second", t.Group, t.Bucket.UTC().Format(time.RFC3339Nano))
	case t.Value < 0:
		return fmt.Errorf("group %q bucket %s: negative value %d", t.Group, t.Bucket.UTC().Format(time.RFC3339), t.Value)
	}
	return nil
}

// isControl reports whether r is a C0 or C1 control character or DEL.
func isControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r < 0xa0) }

// Result counts what one Write did. After a successful Write,
// Applied+Stale equals the number of totals given. After a failed Write it
// counts what was done before the failure (see each sink).
type Result struct {
	// Applied counts totals that raised (or first set) the stored value.
	Applied int
	// Stale counts totals that were skipped because the sink already held
	// the same or a larger value, including a smaller value for a
	// (group, bucket) that appears more than once in the same batch.
	Stale int
	// Retried counts extra attempts caused by concurrent writers
	// (compare-and-set conflicts, deadlocks, serialization failures). It is
	// not a count of totals.
	Retried int
}

// Add returns the field-wise sum of r and o.
func (r Result) Add(o Result) Result {
	return Result{Applied: r.Applied + o.Applied, Stale: r.Stale + o.Stale, Retried: r.Retried + o.Retried}
}

// Sink stores absolute totals, keeping the larger value per (group, bucket).
// Implementations in this package are safe for concurrent use, and several
// sinks (in one process or many) may write the same keys at the same time.
type Sink interface {
	// Name returns the sink's kind: "kv", "stream" or "postgres".
	Name() string
	// Write stores each total unless the sink already holds the same or a
	// larger value for its (group, bucket), which counts as Stale. It is
	// idempotent: calling it again with the same totals changes nothing and
	// returns them as Stale. An invalid total fails the whole batch with
	// ErrBadTotal before anything is written.
	Write(ctx context.Context, totals []Total) (Result, error)
	// Close marks the sink closed; later Writes return ErrClosed. It does not
	// close the connection, bucket or pool the sink was built on, which
	// belong to the caller (except the pool OpenPostgres opened, which its
	// sink owns). Close is safe to call more than once and always returns
	// nil for the sinks in this package.
	Close() error
}

// prepare validates totals and collapses those that share an ID into the
// largest value, keeping the order in which IDs first appear. dropped counts
// the totals collapsed away (they are stale by definition).
func prepare(totals []Total) (uniq []Total, dropped int, err error) {
	index := make(map[string]int, len(totals))
	uniq = make([]Total, 0, len(totals))
	for i, t := range totals {
		if err := t.validate(); err != nil {
			return nil, 0, fmt.Errorf("%w: totals[%d]: %v", ErrBadTotal, i, err)
		}
		t.Bucket = t.Bucket.UTC()
		id := t.ID()
		if j, ok := index[id]; ok {
			dropped++
			if t.Value > uniq[j].Value {
				uniq[j].Value = t.Value
			}
			continue
		}
		index[id] = len(uniq)
		uniq = append(uniq, t)
	}
	return uniq, dropped, nil
}

// Latest returns, for every (group, bucket) in totals, the Total with the
// largest value, keyed by Total.ID. It is how a reader of the stream sink
// (which logs every value it is given) recovers the current totals.
func Latest(totals []Total) map[string]Total {
	out := make(map[string]Total, len(totals))
	for _, t := range totals {
		id := t.ID()
		if cur, ok := out[id]; !ok || t.Value > cur.Value {
			t.Bucket = t.Bucket.UTC()
			out[id] = t
		}
	}
	return out
}
