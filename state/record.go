package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/dedupe-stage/dedupe-stage/window"
)

// Errors returned by the package. Test with errors.Is; returned errors wrap
// them with the field, directory, partition or key concerned. ErrClosed,
// ErrCorruptRecord, ErrBadKey, ErrBadTotal and ErrBadRestore are
// permanent: the same call with the same input fails the same way, and
// each says so with a Permanent method that returns true (see
// permanentError); the others can clear, or are met only at Open.
var (
	// ErrBadOptions means an Options field is invalid.
	ErrBadOptions = errors.New("state: bad options")
	// ErrLayout means Dir/LAYOUT (or the partition directories found in
	// Dir) disagree with Options.Partitions: keys would route to the wrong
	// partition.
	ErrLayout = errors.New("state: partition layout mismatch")
	// ErrLocked means a partition directory is held by another Badger
	// instance (another process, or another Store in this process).
	ErrLocked = errors.New("state: directory locked by another process")
	// ErrClosed means the Store was closed. Permanent.
	ErrClosed error = &permanentError{"state: store closed"}
	// ErrCorruptRecord means a stored record cannot be decoded.
	// Permanent.
	ErrCorruptRecord error = &permanentError{"state: corrupt record"}
	// ErrBadKey means a key is empty or longer than MaxKeySize. Permanent.
	ErrBadKey error = &permanentError{"state: bad key"}
	// ErrDiskFull means the file system holding a partition has less space
	// available than Options.MinFreeBytes: Claim wrote nothing.
	ErrDiskFull = errors.New("state: too little free disk space")
	// ErrBadTotal means a Claim's Contribution is invalid (see
	// Contribution), or carries a group while totals are off. Permanent.
	ErrBadTotal error = &permanentError{"state: bad total contribution"}
	// ErrBadRestore means a record given to Partition.Restore has no
	// FirstSeen, or carries a total contribution. Permanent.
	ErrBadRestore error = &permanentError{"state: bad record to restore"}
)

// permanentError is a sentinel error that no retry can fix. Its Permanent
// method says so to whoever classifies failures (the stage's retry
// classifier asks every error in a chain, with errors.As, without knowing
// this package); errors.Is matches it by identity, as any sentinel.
type permanentError struct{ msg string }

func (e *permanentError) Error() string { return e.msg }

// Permanent returns true: trying again with the same input gives the same
// error.
func (e *permanentError) Permanent() bool { return true }

// MaxKeySize is the longest accepted key in bytes (Badger's own limit is
// 65000 bytes including the record prefix).
const MaxKeySize = 60000

// Badger key prefixes. Every kind of record lives under its own one-byte
// prefix so that the keyspace can hold more kinds (e.g. totals) next to
// dedupe records. All partitions share one Badger instance: each key
// starts with its partition's keyspace (see keyspace), then the kind.
const (
	// prefixRecord prefixes dedupe records: 'k' + key.
	prefixRecord byte = 'k'
	// prefixTotal prefixes totals: 't' + bucket + group (see totalKey).
	prefixTotal byte = 't'
	// prefixCursor prefixes the partition's cursor, a single key (see
	// keyspace.cursor). Scans of records or totals never see it.
	prefixCursor byte = 'c'
)

// keyspaceLen is the length of a partition's keyspace prefix.
const keyspaceLen = 2

// keyspace is the prefix of every Badger key of one partition: the
// partition's index as a big-endian uint16 (MaxPartitions fits). A
// partition's keys sort together, so its scans read its own tables and a
// partition's whole state drops with one DropPrefix.
type keyspace [keyspaceLen]byte

// keyspaceOf returns partition i's keyspace.
func keyspaceOf(i int) keyspace {
	var ks keyspace
	binary.BigEndian.PutUint16(ks[:], uint16(i))
	return ks
}

// kind returns the prefix of the partition's keys of one kind, for
// iterators.
func (ks keyspace) kind(prefix byte) []byte { return []byte{ks[0], ks[1], prefix} }

// record returns the Badger key of a dedupe record.
func (ks keyspace) record(key []byte) []byte {
	k := make([]byte, keyspaceLen+1+len(key))
	copy(k, ks[:])
	k[keyspaceLen] = prefixRecord
	copy(k[keyspaceLen+1:], key)
	return k
}

// cursor returns the Badger key of the partition's cursor: the output
// stream sequence up to which the partition's state is complete.
func (ks keyspace) cursor() []byte { return ks.kind(prefixCursor) }

// userKey returns the key part of a partition's Badger key, after the
// keyspace and the kind.
func userKey(badgerKey []byte) []byte { return badgerKey[keyspaceLen+1:] }

// encodeCursor encodes a cursor as a uint64 big endian.
func encodeCursor(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// decodeCursor decodes a value written by encodeCursor; any other length
// is an error wrapping ErrCorruptRecord.
func decodeCursor(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: cursor is %d bytes, want 8", ErrCorruptRecord, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

// Record is what the store keeps for a key.
type Record struct {
	// FirstSeen is when the key was first claimed (by the store's Clock,
	// or as the Claim gave it), with nanosecond precision. It is logically expired from FirstSeen+W on.
	FirstSeen time.Time
	// Fingerprint is the payload fingerprint given with the first claim; a
	// later copy with another fingerprint is a copy that differs.
	Fingerprint uint64
	// Forgotten is when an operator forgot the key (Partition.Forget);
	// zero when never. A forgotten record holds nothing: the key's next
	// copy is New.
	Forgotten time.Time
}

// holds reports whether r makes a copy of its key a repeat at now: it is
// not forgotten and inside the window.
func (r Record) holds(win window.Window, now time.Time) bool {
	return r.Forgotten.IsZero() && win.Inside(r.FirstSeen, now)
}

const (
	recordVersion    = 1
	recordLen        = 1 + 8 + 8
	forgottenVersion = 2
	forgottenLen     = recordLen + 8
)

// encodeRecord encodes r as version byte 1, FirstSeen as Unix nanoseconds
// (int64 big endian) and the fingerprint (uint64 big endian); a forgotten
// record as version byte 2 and the same fields followed by Forgotten in
// Unix nanoseconds.
func encodeRecord(r Record) []byte {
	n, v := recordLen, byte(recordVersion)
	if !r.Forgotten.IsZero() {
		n, v = forgottenLen, forgottenVersion
	}
	b := make([]byte, n)
	b[0] = v
	binary.BigEndian.PutUint64(b[1:9], uint64(r.FirstSeen.UnixNano()))
	binary.BigEndian.PutUint64(b[9:17], r.Fingerprint)
	if v == forgottenVersion {
		binary.BigEndian.PutUint64(b[17:25], uint64(r.Forgotten.UnixNano()))
	}
	return b
}

// decodeRecord decodes a value written by encodeRecord. Any other length or
// version is an error wrapping ErrCorruptRecord.
func decodeRecord(b []byte) (Record, error) {
	want := recordLen
	if len(b) > 0 && b[0] == forgottenVersion {
		want = forgottenLen
	}
	if len(b) != want {
		return Record{}, fmt.Errorf("%w: value is %d bytes, want %d", ErrCorruptRecord, len(b), want)
	}
	if b[0] != recordVersion && b[0] != forgottenVersion {
		return Record{}, fmt.Errorf("%w: version %d, want %d or %d", ErrCorruptRecord, b[0], recordVersion, forgottenVersion)
	}
	r := Record{
		FirstSeen:   time.Unix(0, int64(binary.BigEndian.Uint64(b[1:9]))),
		Fingerprint: binary.BigEndian.Uint64(b[9:17]),
	}
	if b[0] == forgottenVersion {
		r.Forgotten = time.Unix(0, int64(binary.BigEndian.Uint64(b[17:25])))
	}
	return r, nil
}

func checkKey(key []byte) error {
	if len(key) == 0 {
		return fmt.Errorf("%w: empty", ErrBadKey)
	}
	if len(key) > MaxKeySize {
		return fmt.Errorf("%w: %d bytes, want <= %d", ErrBadKey, len(key), MaxKeySize)
	}
	return nil
}
