package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
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
	// or as the Claim gave it), with nanosecond precision. It is logically
	// expired from WindowStart()+W on.
	FirstSeen time.Time
	// Fingerprint is the payload fingerprint given with the first claim; a
	// later copy with another fingerprint is a copy that differs.
	Fingerprint uint64
	// Refreshed is when a repeat last moved the key's window
	// (Options.RefreshOnRepeat); zero when none did.
	Refreshed time.Time
	// Version is the key's version, from the claim that recorded it
	// (Claim.Versioned), when HasVersion.
	Version uint64
	// HasVersion is true when the record carries a Version.
	HasVersion bool
	// Forgotten is when an operator forgot the key (Partition.Forget);
	// zero when never. A forgotten record holds nothing: the key's next
	// copy is New.
	Forgotten time.Time
	// OutputSeq is the output stream sequence of the key's forward (the
	// PubAck's, Claim.OutputSeq), or of the forward a restore read back;
	// 0 when unknown (a record written before it was kept).
	OutputSeq uint64
}

// holds reports whether r makes a copy of its key a repeat at now: it is
// not forgotten and its window has not ended.
func (r Record) holds(win window.Window, now time.Time) bool {
	return r.Forgotten.IsZero() && win.Inside(r.WindowStart(), now)
}

// WindowStart is where the key's window starts: the later of FirstSeen and
// Refreshed. The key is a repeat until WindowStart()+W.
func (r Record) WindowStart() time.Time {
	if r.Refreshed.After(r.FirstSeen) {
		return r.Refreshed
	}
	return r.FirstSeen
}

// OlderThan reports whether a copy with version v wins over r
// (version-wins): r carries no version, or a smaller one. A false means
// the copy is stale.
func (r Record) OlderThan(v uint64) bool { return !r.HasVersion || r.Version < v }

// Record encodings. Version 1 (17 bytes) is a record with no refresh,
// version, forget or output sequence, as every record was before those
// existed; version 2 adds a flags byte and the fields it names. A record
// whose forward's sequence is known is version 2.
const (
	recordVersion  = 1
	recordLen      = 1 + 8 + 8
	recordVersion2 = 2

	flagRefreshed byte = 1 << 0 // Refreshed follows, Unix nanoseconds
	flagVersion   byte = 1 << 1 // Version follows
	flagForgotten byte = 1 << 2 // Forgotten follows, Unix nanoseconds
	flagOutputSeq byte = 1 << 3 // OutputSeq follows, a uvarint, last
	flagsKnown         = flagRefreshed | flagVersion | flagForgotten | flagOutputSeq
)

// encodeRecord encodes r. Without Refreshed, HasVersion, Forgotten and
// OutputSeq: version byte 1, FirstSeen as Unix nanoseconds (int64 big
// endian) and the fingerprint (uint64 big endian). Otherwise: version byte
// 2, a flags byte, FirstSeen, the fingerprint, then Refreshed
// (flagRefreshed), Version (flagVersion) and Forgotten (flagForgotten),
// each 8 bytes big endian, and last OutputSeq (flagOutputSeq) as a uvarint
// (5 bytes up to sequence 2^35).
func encodeRecord(r Record) []byte {
	var flags byte
	if !r.Refreshed.IsZero() {
		flags |= flagRefreshed
	}
	if r.HasVersion {
		flags |= flagVersion
	}
	if !r.Forgotten.IsZero() {
		flags |= flagForgotten
	}
	if r.OutputSeq != 0 {
		flags |= flagOutputSeq
	}
	if flags == 0 {
		b := make([]byte, recordLen)
		b[0] = recordVersion
		binary.BigEndian.PutUint64(b[1:9], uint64(r.FirstSeen.UnixNano()))
		binary.BigEndian.PutUint64(b[9:17], r.Fingerprint)
		return b
	}
	b := make([]byte, 2, 2+8*5+binary.MaxVarintLen64)
	b[0], b[1] = recordVersion2, flags
	b = binary.BigEndian.AppendUint64(b, uint64(r.FirstSeen.UnixNano()))
	b = binary.BigEndian.AppendUint64(b, r.Fingerprint)
	if flags&flagRefreshed != 0 {
		b = binary.BigEndian.AppendUint64(b, uint64(r.Refreshed.UnixNano()))
	}
	if flags&flagVersion != 0 {
		b = binary.BigEndian.AppendUint64(b, r.Version)
	}
	if flags&flagForgotten != 0 {
		b = binary.BigEndian.AppendUint64(b, uint64(r.Forgotten.UnixNano()))
	}
	if flags&flagOutputSeq != 0 {
		b = binary.AppendUvarint(b, r.OutputSeq)
	}
	return b
}

// decodeRecord decodes a value written by encodeRecord. Any other length,
// version or flags is an error wrapping ErrCorruptRecord.
func decodeRecord(b []byte) (Record, error) {
	if len(b) == 0 {
		return Record{}, fmt.Errorf("%w: empty value", ErrCorruptRecord)
	}
	switch b[0] {
	case recordVersion:
		if len(b) != recordLen {
			return Record{}, fmt.Errorf("%w: value is %d bytes, want %d", ErrCorruptRecord, len(b), recordLen)
		}
		return Record{
			FirstSeen:   time.Unix(0, int64(binary.BigEndian.Uint64(b[1:9]))),
			Fingerprint: binary.BigEndian.Uint64(b[9:17]),
		}, nil
	case recordVersion2:
		if len(b) < 2 {
			return Record{}, fmt.Errorf("%w: value is %d bytes, want a flags byte", ErrCorruptRecord, len(b))
		}
		flags := b[1]
		if flags == 0 || flags&^flagsKnown != 0 {
			return Record{}, fmt.Errorf("%w: version 2 with flags %#x", ErrCorruptRecord, flags)
		}
		fixed := 2 + 16 + 8*bits.OnesCount8(flags&^flagOutputSeq)
		switch {
		case flags&flagOutputSeq == 0 && len(b) != fixed:
			return Record{}, fmt.Errorf("%w: value is %d bytes, want %d", ErrCorruptRecord, len(b), fixed)
		case flags&flagOutputSeq != 0 && len(b) <= fixed:
			return Record{}, fmt.Errorf("%w: value is %d bytes, want more than %d", ErrCorruptRecord, len(b), fixed)
		}
		r := Record{
			FirstSeen:   time.Unix(0, int64(binary.BigEndian.Uint64(b[2:10]))),
			Fingerprint: binary.BigEndian.Uint64(b[10:18]),
		}
		rest := b[18:]
		if flags&flagRefreshed != 0 {
			r.Refreshed = time.Unix(0, int64(binary.BigEndian.Uint64(rest)))
			rest = rest[8:]
		}
		if flags&flagVersion != 0 {
			r.Version, r.HasVersion = binary.BigEndian.Uint64(rest), true
			rest = rest[8:]
		}
		if flags&flagForgotten != 0 {
			r.Forgotten = time.Unix(0, int64(binary.BigEndian.Uint64(rest)))
			rest = rest[8:]
		}
		if flags&flagOutputSeq != 0 {
			seq, n := binary.Uvarint(rest)
			if n != len(rest) || seq == 0 || len(binary.AppendUvarint(nil, seq)) != n { // one encoding per record
				return Record{}, fmt.Errorf("%w: output sequence of %d bytes is malformed", ErrCorruptRecord, len(rest))
			}
			r.OutputSeq = seq
		}
		return r, nil
	}
	return Record{}, fmt.Errorf("%w: version %d, want %d or %d", ErrCorruptRecord, b[0], recordVersion, recordVersion2)
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
