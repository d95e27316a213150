// Package snapshot encodes and decodes a scale-out partition's snapshot
// (docs/scale-out.md §3.3, option C): the records a partition holds inside
// its window, and the output stream (changelog) sequence up to which they
// are complete. A new owner loads the newest snapshot and replays only the
// changelog after that sequence, instead of the whole changelog.
//
// The format is a stream, written and read record by record, so that
// neither side holds a whole partition in memory:
//
//	magic "DDSN" | version byte | uvarint n | header (n bytes) | crc32c (4, LE) of all before
//	block*: uvarint n (> 0) | uvarint records | body (n bytes) | crc32c (4, LE) of the block
//	end:    0 | uvarint total records | crc32c (4, LE) of every byte before it
//
// A record in a block's body is uvarint key length, the key, the first-seen
// time as a zigzag varint of nanoseconds relative to Header.Taken, and the
// fingerprint (8 bytes, LE): a 20-byte key takes about 35 bytes. Format
// version 2 adds a flags byte after the fingerprint and the fields it
// names, in this order: the refresh time and the forget time (zigzag
// varints relative to Header.Taken) and the key's version (uvarint); a
// record with none of them costs one byte more than in version 1. Format
// version 3 adds one more flagged field after them: the output sequence
// of the key's forward, a zigzag varint relative to Header.Seq (a recent
// forward's takes a few bytes). The reader reads all three versions; the
// writer writes version 3. The
// Bloom filter is not stored: loading the records adds their keys to the
// new owner's filter, which costs less than the filter's bytes would, and
// leaves the new owner's filter options its own.
//
// Every block is checked before any of its records is returned, and the end
// checks the count and the whole stream, so a corrupt, partial or truncated
// snapshot ends Next with an error wrapping ErrCorrupt (or ErrVersion);
// the records returned before it are records the writer wrote.
//
// Use:
//
//	w, err := snapshot.NewWriter(dst, snapshot.Header{Group: "dedupe", Partition: 3, Seq: cursor, ...})
//	err = w.Add(snapshot.Record{Key: k, FirstSeen: t, Fingerprint: fp}) // for each record
//	err = w.Close()
//
//	r, err := snapshot.NewReader(src) // reads and checks the header
//	for { rec, err := r.Next(); if err == io.EOF { break } ... }
package snapshot

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"
)

// Errors returned by the package; returned errors wrap them.
var (
	// ErrCorrupt means the bytes read are not a whole snapshot as the
	// writer wrote it: a wrong magic, a checksum that does not match, a
	// field out of range, or a stream that ends early.
	ErrCorrupt = errors.New("snapshot: corrupt or truncated")
	// ErrVersion means the snapshot was written in a format version this
	// build does not read.
	ErrVersion = errors.New("snapshot: unknown format version")
	// ErrBadRecord means a record given to Writer.Add cannot be written:
	// an empty key or one longer than MaxKeySize.
	ErrBadRecord = errors.New("snapshot: bad record")
)

// Version is the format version this package writes. It reads this one
// and versions 1 (a record without flags) and 2 (no output sequence).
const Version = 3

// Earlier format versions: version1 has no flags byte in a record,
// version2 no flagOutputSeq.
const (
	version1 = 1
	version2 = 2
)

// Record flags (format versions 2 and 3): which optional fields follow.
const (
	flagRefreshed byte = 1 << 0
	flagForgotten byte = 1 << 1
	flagVersion   byte = 1 << 2
	flagOutputSeq byte = 1 << 3 // format version 3
	flagsKnown2        = flagRefreshed | flagForgotten | flagVersion
	flagsKnown         = flagsKnown2 | flagOutputSeq
)

// MaxKeySize is the longest key a snapshot holds, in bytes.
const MaxKeySize = 65535

// maxGroup is the longest group name a header holds, in bytes.
const maxGroup = 1024

// maxHeader bounds a header's encoded size.
const maxHeader = maxGroup + 8*binary.MaxVarintLen64

// blockSize is the body size past which the writer closes a block; a
// block never exceeds blockSize + one record.
const blockSize = 64 << 10

// maxBlock is the largest block body the reader accepts.
const maxBlock = blockSize + MaxKeySize + 6*binary.MaxVarintLen64 + 8 + 1

var magic = [4]byte{'D', 'D', 'S', 'N'}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Header identifies what a snapshot holds.
type Header struct {
	// Group is the scale-out group the partition belongs to.
	Group string
	// Partition is the partition's number, 0..Partitions-1.
	Partition int
	// Partitions is the group's number of partitions when the snapshot
	// was taken.
	Partitions int
	// Seq is the output stream sequence up to which the snapshot holds
	// every record of the partition still inside the window: a new owner
	// replays the changelog from Seq+1.
	Seq uint64
	// StreamCreated is the output stream's creation time, which tells a
	// stream deleted and made again (its sequences start over) from the
	// one the snapshot covers.
	StreamCreated time.Time
	// Window is the window W the partition held its records for.
	Window time.Duration
	// Taken is when the snapshot was taken, by the writer's clock.
	Taken time.Time
}

// Record is one key the partition holds.
type Record struct {
	// Key is the dedupe key, 1..MaxKeySize bytes.
	Key []byte
	// FirstSeen is the key's first-seen time, with nanosecond precision.
	FirstSeen time.Time
	// Fingerprint is the payload fingerprint stored with the key.
	Fingerprint uint64
	// Refreshed is when a repeat last moved the key's window; zero: never.
	Refreshed time.Time
	// Forgotten is when an operator forgot the key; zero: never.
	Forgotten time.Time
	// Version is the key's version, when HasVersion.
	Version uint64
	// HasVersion is true when the record carries a Version.
	HasVersion bool
	// OutputSeq is the output stream sequence of the key's forward; 0:
	// unknown.
	OutputSeq uint64
}

// flags returns r's format version 2 flags.
func (r Record) flags() byte {
	var f byte
	if !r.Refreshed.IsZero() {
		f |= flagRefreshed
	}
	if !r.Forgotten.IsZero() {
		f |= flagForgotten
	}
	if r.HasVersion {
		f |= flagVersion
	}
	if r.OutputSeq != 0 {
		f |= flagOutputSeq
	}
	return f
}

// Writer writes one snapshot to an io.Writer. It is not safe for
// concurrent use.
type Writer struct {
	w     *bufio.Writer
	crc   uint32 // of every byte written so far
	base  int64  // Header.Taken, Unix nanoseconds
	seq   int64  // Header.Seq, the base of records' OutputSeq
	block []byte
	n     uint64 // records in block
	total uint64
	err   error
}

// NewWriter writes h to w and returns a Writer for the records. It fails
// when h cannot be encoded (a group longer than 1024 bytes, a negative
// partition) or w fails.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	if len(h.Group) > maxGroup || h.Partition < 0 || h.Partitions < 0 || h.Window < 0 {
		return nil, fmt.Errorf("snapshot: header %+v: group of %d bytes (at most %d), partition, partitions and window must be >= 0",
			h, len(h.Group), maxGroup)
	}
	var hb []byte
	hb = binary.AppendUvarint(hb, uint64(len(h.Group)))
	hb = append(hb, h.Group...)
	hb = binary.AppendUvarint(hb, uint64(h.Partition))
	hb = binary.AppendUvarint(hb, uint64(h.Partitions))
	hb = binary.AppendUvarint(hb, h.Seq)
	hb = binary.AppendVarint(hb, unixNano(h.StreamCreated))
	hb = binary.AppendVarint(hb, int64(h.Window))
	hb = binary.AppendVarint(hb, unixNano(h.Taken))
	out := append(magic[:], Version)
	out = binary.AppendUvarint(out, uint64(len(hb)))
	out = append(out, hb...)
	out = binary.LittleEndian.AppendUint32(out, crc32.Checksum(out, castagnoli))
	sw := &Writer{w: bufio.NewWriterSize(w, blockSize), base: unixNano(h.Taken), seq: int64(h.Seq), block: make([]byte, 0, blockSize+1024)}
	if err := sw.write(out); err != nil {
		return nil, err
	}
	return sw, nil
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// write writes b and adds it to the running checksum.
func (w *Writer) write(b []byte) error {
	if w.err != nil {
		return w.err
	}
	w.crc = crc32.Update(w.crc, castagnoli, b)
	if _, err := w.w.Write(b); err != nil {
		w.err = fmt.Errorf("snapshot: write: %w", err)
	}
	return w.err
}

// Add appends r. It returns an error wrapping ErrBadRecord for an empty
// key or one longer than MaxKeySize (nothing is written), or the
// destination's error, after which every call fails.
func (w *Writer) Add(r Record) error {
	if len(r.Key) == 0 || len(r.Key) > MaxKeySize {
		return fmt.Errorf("%w: key of %d bytes, want 1..%d", ErrBadRecord, len(r.Key), MaxKeySize)
	}
	if w.err != nil {
		return w.err
	}
	b := binary.AppendUvarint(w.block, uint64(len(r.Key)))
	b = append(b, r.Key...)
	b = binary.AppendVarint(b, r.FirstSeen.UnixNano()-w.base)
	b = binary.LittleEndian.AppendUint64(b, r.Fingerprint)
	flags := r.flags()
	b = append(b, flags)
	if flags&flagRefreshed != 0 {
		b = binary.AppendVarint(b, r.Refreshed.UnixNano()-w.base)
	}
	if flags&flagForgotten != 0 {
		b = binary.AppendVarint(b, r.Forgotten.UnixNano()-w.base)
	}
	if flags&flagVersion != 0 {
		b = binary.AppendUvarint(b, r.Version)
	}
	if flags&flagOutputSeq != 0 {
		b = binary.AppendVarint(b, int64(r.OutputSeq)-w.seq)
	}
	w.block = b
	w.n++
	if len(w.block) >= blockSize {
		return w.flushBlock()
	}
	return nil
}

// flushBlock writes the pending block, if any.
func (w *Writer) flushBlock() error {
	if w.n == 0 {
		return w.err
	}
	var hd []byte
	hd = binary.AppendUvarint(hd, uint64(len(w.block)))
	hd = binary.AppendUvarint(hd, w.n)
	c := crc32.Update(crc32.Checksum(hd, castagnoli), castagnoli, w.block)
	if err := w.write(hd); err != nil {
		return err
	}
	if err := w.write(w.block); err != nil {
		return err
	}
	if err := w.write(binary.LittleEndian.AppendUint32(nil, c)); err != nil {
		return err
	}
	w.total += w.n
	w.block, w.n = w.block[:0], 0
	return nil
}

// Close writes the last block and the end, and flushes. It does not close
// the destination. It returns how many records the snapshot holds.
func (w *Writer) Close() (uint64, error) {
	if err := w.flushBlock(); err != nil {
		return 0, err
	}
	end := binary.AppendUvarint([]byte{0}, w.total)
	if err := w.write(end); err != nil {
		return 0, err
	}
	if _, err := w.w.Write(binary.LittleEndian.AppendUint32(nil, w.crc)); err != nil {
		return 0, fmt.Errorf("snapshot: write: %w", err)
	}
	if err := w.w.Flush(); err != nil {
		return 0, fmt.Errorf("snapshot: write: %w", err)
	}
	return w.total, nil
}

// Reader reads one snapshot. It is not safe for concurrent use.
type Reader struct {
	r      *bufio.Reader
	h      Header
	format byte   // the snapshot's format version
	crc    uint32 // of every byte read so far
	base   int64
	seq    int64  // Header.Seq
	block  []byte // the current block's unread records
	left   uint64 // records left in block
	total  uint64 // records returned
	done   bool
	failed error
}

// NewReader reads and checks the header of a snapshot from r. It returns
// an error wrapping ErrCorrupt or ErrVersion when the header is not one
// this package wrote.
func NewReader(r io.Reader) (*Reader, error) {
	sr := &Reader{r: bufio.NewReaderSize(r, 64<<10)}
	pre := make([]byte, 5)
	if err := sr.full(pre); err != nil {
		return nil, err
	}
	if [4]byte(pre[:4]) != magic {
		return nil, fmt.Errorf("%w: magic %q, want %q", ErrCorrupt, pre[:4], magic[:])
	}
	if pre[4] != Version && pre[4] != version1 && pre[4] != version2 {
		return nil, fmt.Errorf("%w: version %d, this build reads %d to %d", ErrVersion, pre[4], version1, Version)
	}
	sr.format = pre[4]
	n, err := sr.uvarint()
	if err != nil {
		return nil, err
	}
	if n > maxHeader {
		return nil, fmt.Errorf("%w: header of %d bytes", ErrCorrupt, n)
	}
	hb := make([]byte, n)
	if err := sr.full(hb); err != nil {
		return nil, err
	}
	want := sr.crc
	if err := sr.checksum(want, "header"); err != nil {
		return nil, err
	}
	d := decoder{b: hb}
	gl := d.uvarint()
	if gl > maxGroup || gl > uint64(len(d.b)) {
		return nil, fmt.Errorf("%w: header group of %d bytes", ErrCorrupt, gl)
	}
	sr.h.Group = string(d.bytes(int(gl)))
	part, parts := d.uvarint(), d.uvarint()
	sr.h.Seq = d.uvarint()
	created, win, taken := d.varint(), d.varint(), d.varint()
	if d.err || len(d.b) != 0 || part > 1<<31 || parts > 1<<31 || win < 0 {
		return nil, fmt.Errorf("%w: malformed header", ErrCorrupt)
	}
	sr.h.Partition, sr.h.Partitions, sr.h.Window = int(part), int(parts), time.Duration(win)
	sr.h.StreamCreated, sr.h.Taken = fromNano(created), fromNano(taken)
	sr.base, sr.seq = taken, int64(sr.h.Seq)
	return sr, nil
}

func fromNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Header returns the snapshot's header.
func (r *Reader) Header() Header { return r.h }

// Next returns the next record. It returns io.EOF after the last record,
// once the end and the whole stream's checksum are checked; an error
// wrapping ErrCorrupt when the snapshot is corrupt or ends early. The
// record's Key is valid until the next call.
func (r *Reader) Next() (Record, error) {
	if r.failed != nil {
		return Record{}, r.failed
	}
	if r.left == 0 {
		if r.done {
			return Record{}, io.EOF
		}
		if err := r.nextBlock(); err != nil {
			r.failed = err
			return Record{}, err
		}
		if r.done {
			return Record{}, io.EOF
		}
	}
	d := decoder{b: r.block}
	kl := d.uvarint()
	if d.err || kl == 0 || kl > MaxKeySize || kl > uint64(len(d.b)) {
		r.failed = fmt.Errorf("%w: record %d: key of %d bytes", ErrCorrupt, r.total, kl)
		return Record{}, r.failed
	}
	key := d.bytes(int(kl))
	ns := d.varint()
	fp := d.bytes(8)
	rec := Record{Key: key, FirstSeen: time.Unix(0, r.base+ns), Fingerprint: binary.LittleEndian.Uint64(fp)}
	if r.format != version1 {
		if err := r.optional(&d, &rec); err != nil {
			r.failed = err
			return Record{}, err
		}
	}
	if d.err {
		r.failed = fmt.Errorf("%w: record %d is cut short", ErrCorrupt, r.total)
		return Record{}, r.failed
	}
	r.block = d.b
	r.left--
	r.total++
	if r.left == 0 && len(r.block) != 0 {
		r.failed = fmt.Errorf("%w: %d bytes after a block's last record", ErrCorrupt, len(r.block))
		return Record{}, r.failed
	}
	return rec, nil
}

// optional reads a format version 2 or 3 record's flags and the fields they
// name into rec.
func (r *Reader) optional(d *decoder, rec *Record) error {
	fb := d.bytes(1)
	if d.err {
		return nil // cut short: Next says so
	}
	flags, known := fb[0], flagsKnown
	if r.format == version2 {
		known = flagsKnown2
	}
	if flags&^known != 0 {
		return fmt.Errorf("%w: record %d: flags %#x", ErrCorrupt, r.total, flags)
	}
	if flags&flagRefreshed != 0 {
		rec.Refreshed = time.Unix(0, r.base+d.varint())
	}
	if flags&flagForgotten != 0 {
		rec.Forgotten = time.Unix(0, r.base+d.varint())
	}
	if flags&flagVersion != 0 {
		rec.Version, rec.HasVersion = d.uvarint(), true
	}
	if flags&flagOutputSeq != 0 {
		rec.OutputSeq = uint64(r.seq + d.varint())
	}
	return nil
}

// nextBlock reads and checks the next block, or the end.
func (r *Reader) nextBlock() error {
	n, err := r.uvarint()
	if err != nil {
		return err
	}
	if n == 0 {
		total, err := r.uvarint()
		if err != nil {
			return err
		}
		if err := r.checksum(r.crc, "snapshot"); err != nil {
			return err
		}
		if total != r.total {
			return fmt.Errorf("%w: the end says %d records, %d read", ErrCorrupt, total, r.total)
		}
		if _, err := r.r.ReadByte(); err == nil {
			return fmt.Errorf("%w: bytes after the end", ErrCorrupt)
		}
		r.done = true
		return nil
	}
	if n > maxBlock {
		return fmt.Errorf("%w: block of %d bytes", ErrCorrupt, n)
	}
	hd := binary.AppendUvarint(nil, n)
	count, err := r.uvarint()
	if err != nil {
		return err
	}
	if count == 0 || count > n {
		return fmt.Errorf("%w: block of %d bytes with %d records", ErrCorrupt, n, count)
	}
	hd = binary.AppendUvarint(hd, count)
	if cap(r.block) < int(n) {
		r.block = make([]byte, n)
	}
	r.block = r.block[:n]
	if err := r.full(r.block); err != nil {
		return err
	}
	c := crc32.Update(crc32.Checksum(hd, castagnoli), castagnoli, r.block)
	if err := r.checksum(c, "block"); err != nil {
		return err
	}
	r.left = count
	return nil
}

// full reads len(b) bytes into b and adds them to the running checksum.
func (r *Reader) full(b []byte) error {
	if _, err := io.ReadFull(r.r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: ends early (%v)", ErrCorrupt, err)
		}
		return fmt.Errorf("snapshot: read: %w", err)
	}
	r.crc = crc32.Update(r.crc, castagnoli, b)
	return nil
}

// uvarint reads a uvarint and adds its bytes to the running checksum.
func (r *Reader) uvarint() (uint64, error) {
	var b [binary.MaxVarintLen64]byte
	for i := range b {
		if err := r.full(b[i : i+1]); err != nil {
			return 0, err
		}
		if b[i] < 0x80 {
			v, n := binary.Uvarint(b[:i+1])
			if n <= 0 {
				return 0, fmt.Errorf("%w: malformed varint", ErrCorrupt)
			}
			return v, nil
		}
	}
	return 0, fmt.Errorf("%w: varint too long", ErrCorrupt)
}

// checksum reads a stored crc32c and compares it with want. A header's or
// a block's checksum is part of the stream the end's checksum covers; the
// end's own is not.
func (r *Reader) checksum(want uint32, what string) error {
	var b [4]byte
	if _, err := io.ReadFull(r.r, b[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: ends early in a %s checksum", ErrCorrupt, what)
		}
		return fmt.Errorf("snapshot: read: %w", err)
	}
	if got := binary.LittleEndian.Uint32(b[:]); got != want {
		return fmt.Errorf("%w: %s checksum %08x, computed %08x", ErrCorrupt, what, got, want)
	}
	if what != "snapshot" {
		r.crc = crc32.Update(r.crc, castagnoli, b[:])
	}
	return nil
}

// decoder reads fields from a checked byte slice; err is set once a field
// does not fit.
type decoder struct {
	b   []byte
	err bool
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(n int) []byte {
	if n > len(d.b) {
		d.err = true
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}
