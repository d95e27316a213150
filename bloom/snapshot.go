package bloom

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// The snapshot format, version 1, is laid out in docs/state.md. Every length
// in it follows from the options given to ReadSnapshot, so a corrupted
// snapshot cannot make the reader allocate more than those imply.
const (
	snapshotMagic   = "DSBF"
	snapshotVersion = 1
	headerSize      = 44
	genHeaderSize   = 16
	trailerSize     = 4
)

// chunkBytes is the size of the encode/decode buffer for bitset words.
const chunkBytes = 64 << 10

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SnapshotSize returns the exact size in bytes of a snapshot of a filter
// built with opts, or an error wrapping ErrBadOptions.
func SnapshotSize(opts Options) (int64, error) {
	sz, err := opts.Sizing()
	if err != nil {
		return 0, err
	}
	return snapshotSize(int64(opts.Generations), wordsFor(sz.BitsPerGeneration)), nil
}

func snapshotSize(g int64, words int) int64 {
	return headerSize + (g+1)*(genHeaderSize+8*int64(words)) + trailerSize
}

// countingWriter counts the bytes its underlying writer accepted.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// WriteSnapshot writes the filter and meta, an opaque value the caller gets
// back from ReadSnapshot, to w in the format described above, through a
// bufio.Writer. It returns the number of bytes w accepted. The filter is
// copied under its read lock and written after the lock is released, so a
// slow w does not block Add; the copy costs MemoryBytes of transient
// memory. The snapshot is a consistent cut: it holds every Add that
// returned before WriteSnapshot was called.
func (f *Filter) WriteSnapshot(w io.Writer, meta uint64) (int64, error) {
	nw := wordsFor(uint(f.m))
	type genCopy struct {
		index int64
		adds  uint64
	}
	gens := make([]genCopy, f.g+1)
	words := make([]uint64, int(f.g+1)*nw)

	f.mu.RLock()
	cur := f.cur
	for j := range gens {
		gen := &f.gens[f.slot(cur-f.g+int64(j))]
		gens[j] = genCopy{gen.index, gen.adds}
		copy(words[j*nw:(j+1)*nw], gen.bf.BitSet().Words())
	}
	f.mu.RUnlock()

	cw := &countingWriter{w: w}
	bw := bufio.NewWriterSize(cw, chunkBytes)
	var crc uint32
	put := func(p []byte) error {
		crc = crc32.Update(crc, castagnoli, p)
		_, err := bw.Write(p)
		return err
	}
	fail := func(err error) (int64, error) {
		return cw.n, fmt.Errorf("bloom: write snapshot: %w", err)
	}

	hdr := make([]byte, 0, headerSize)
	hdr = append(hdr, snapshotMagic...)
	hdr = binary.LittleEndian.AppendUint16(hdr, snapshotVersion)
	hdr = binary.LittleEndian.AppendUint16(hdr, uint16(f.g))
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(f.opts.Window))
	hdr = binary.LittleEndian.AppendUint64(hdr, f.m)
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(f.k))
	hdr = binary.LittleEndian.AppendUint64(hdr, meta)
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(cur))
	if err := put(hdr); err != nil {
		return fail(err)
	}

	buf := make([]byte, chunkBytes)
	for j, g := range gens {
		gh := buf[:genHeaderSize]
		binary.LittleEndian.PutUint64(gh, uint64(g.index))
		binary.LittleEndian.PutUint64(gh[8:], g.adds)
		if err := put(gh); err != nil {
			return fail(err)
		}
		ws := words[j*nw : (j+1)*nw]
		for len(ws) > 0 {
			n := min(len(ws), chunkBytes/8)
			for i, x := range ws[:n] {
				binary.LittleEndian.PutUint64(buf[8*i:], x)
			}
			if err := put(buf[:8*n]); err != nil {
				return fail(err)
			}
			ws = ws[n:]
		}
	}
	var tr [trailerSize]byte
	binary.LittleEndian.PutUint32(tr[:], crc)
	if _, err := bw.Write(tr[:]); err != nil {
		return fail(err)
	}
	if err := bw.Flush(); err != nil {
		return fail(err)
	}
	return cw.n, nil
}

// ReadSnapshot reads a snapshot written by WriteSnapshot, and no byte past
// it, and returns the filter built with opts and the meta stored with it;
// call Advance before using the filter. Its errors wrap ErrBadOptions,
// ErrBadMagic, ErrUnsupportedVersion, ErrMismatch (the snapshot's W, G, m or
// k differ from opts'), ErrTruncated, ErrChecksum, ErrCorrupt or r's own.
func ReadSnapshot(r io.Reader, opts Options) (f *Filter, meta uint64, err error) {
	sz, err := opts.Sizing()
	if err != nil {
		return nil, 0, err
	}
	h, err := readSnapshotHeader(r, opts, sz)
	if err != nil {
		return nil, 0, err
	}
	f, err = newFilter(opts)
	if err != nil {
		return nil, 0, err
	}
	infos, crc, err := f.readGenerations(r, crc32.Update(0, castagnoli, h.raw[:]))
	if err != nil {
		return nil, 0, err
	}
	var tr [trailerSize]byte
	if _, err := io.ReadFull(r, tr[:]); err != nil {
		return nil, 0, truncated("checksum", err)
	}
	if got := binary.LittleEndian.Uint32(tr[:]); got != crc {
		return nil, 0, fmt.Errorf("%w: stored %08x, computed %08x", ErrChecksum, got, crc)
	}
	if err := f.place(infos, h.cur, h.m); err != nil {
		return nil, 0, err
	}
	return f, h.meta, nil
}

// snapshotHeader is a snapshot's fixed header: its bytes and the fields
// ReadSnapshot uses after checking it.
type snapshotHeader struct {
	raw  [headerSize]byte
	m    uint64
	meta uint64
	cur  int64
}

// readSnapshotHeader reads the header and checks its magic, its version
// and that it describes a filter built with opts.
func readSnapshotHeader(r io.Reader, opts Options, sz Sizing) (h snapshotHeader, err error) {
	hdr := h.raw[:]
	if n, err := io.ReadFull(r, hdr[:len(snapshotMagic)]); err != nil {
		if !bytes.HasPrefix([]byte(snapshotMagic), hdr[:n]) {
			return h, fmt.Errorf("%w: starts with %q", ErrBadMagic, hdr[:n])
		}
		return h, truncated("magic", err)
	}
	if string(hdr[:len(snapshotMagic)]) != snapshotMagic {
		return h, fmt.Errorf("%w: starts with %q", ErrBadMagic, hdr[:len(snapshotMagic)])
	}
	if _, err := io.ReadFull(r, hdr[len(snapshotMagic):]); err != nil {
		return h, truncated("header", err)
	}
	le := binary.LittleEndian
	if v := le.Uint16(hdr[4:]); v != snapshotVersion {
		return h, fmt.Errorf("%w: version %d, this code reads %d", ErrUnsupportedVersion, v, snapshotVersion)
	}
	g := le.Uint16(hdr[6:])
	window := int64(le.Uint64(hdr[8:]))
	h.m = le.Uint64(hdr[16:])
	k := le.Uint32(hdr[24:])
	h.meta = le.Uint64(hdr[28:])
	h.cur = int64(le.Uint64(hdr[36:]))
	switch {
	case int(g) != opts.Generations:
		return h, fmt.Errorf("%w: snapshot Generations %d, options %d", ErrMismatch, g, opts.Generations)
	case window != int64(opts.Window):
		return h, fmt.Errorf("%w: snapshot Window %v, options %v", ErrMismatch, window, opts.Window)
	case h.m != uint64(sz.BitsPerGeneration) || uint64(k) != uint64(sz.Hashes):
		return h, fmt.Errorf("%w: snapshot m=%d k=%d, options imply m=%d k=%d", ErrMismatch, h.m, k, sz.BitsPerGeneration, sz.Hashes)
	}
	return h, nil
}

// genInfo is a generation's header as read, and whether its bits are not
// all zero.
type genInfo struct {
	index   int64
	adds    uint64
	nonzero bool
}

// readGenerations reads the G+1 generations into f.gens in the order
// written (place moves them to their slots), and returns their headers and
// crc updated with their bytes.
func (f *Filter) readGenerations(r io.Reader, crc uint32) ([]genInfo, uint32, error) {
	le := binary.LittleEndian
	infos := make([]genInfo, len(f.gens))
	buf := make([]byte, chunkBytes)
	for j := range f.gens {
		gh := buf[:genHeaderSize]
		if _, err := io.ReadFull(r, gh); err != nil {
			return nil, 0, truncated(fmt.Sprintf("generation %d header", j), err)
		}
		crc = crc32.Update(crc, castagnoli, gh)
		info := genInfo{index: int64(le.Uint64(gh)), adds: le.Uint64(gh[8:])}
		ws := f.gens[j].bf.BitSet().Words()
		var or uint64
		for len(ws) > 0 {
			n := min(len(ws), chunkBytes/8)
			b := buf[:8*n]
			if _, err := io.ReadFull(r, b); err != nil {
				return nil, 0, truncated(fmt.Sprintf("generation %d bits", j), err)
			}
			crc = crc32.Update(crc, castagnoli, b)
			for i := range ws[:n] {
				x := le.Uint64(b[8*i:])
				ws[i] = x
				or |= x
			}
			ws = ws[n:]
		}
		info.nonzero = or != 0
		infos[j] = info
	}
	return infos, crc, nil
}

// place checks that generations read as written describe a filter whose
// current generation is cur, and moves each to its slot: the bytes passed
// their checksum, so what fails here is ErrCorrupt.
func (f *Filter) place(infos []genInfo, cur int64, m uint64) error {
	if cur > maxGen || cur < minGen {
		return fmt.Errorf("%w: current generation %d out of range", ErrCorrupt, cur)
	}
	if rem := m % 64; rem != 0 {
		for j := range f.gens {
			ws := f.gens[j].bf.BitSet().Words()
			if ws[len(ws)-1]>>rem != 0 {
				return fmt.Errorf("%w: generation %d has bits set past m=%d", ErrCorrupt, j, m)
			}
		}
	}
	for j, info := range infos {
		if want := cur - f.g + int64(j); info.index != want {
			return fmt.Errorf("%w: generation %d has index %d, want %d", ErrCorrupt, j, info.index, want)
		}
		if (info.adds == 0) == info.nonzero {
			return fmt.Errorf("%w: generation %d has %d adds but bits set is %v", ErrCorrupt, j, info.adds, info.nonzero)
		}
	}
	gens := make([]generation, len(f.gens))
	for j, info := range infos {
		gens[f.slot(info.index)] = generation{bf: f.gens[j].bf, index: info.index, adds: info.adds}
	}
	f.gens = gens
	f.cur = cur
	return nil
}

// truncated returns the error for a read that failed in what: ErrTruncated
// if the input ended, otherwise the read error itself, wrapped.
func truncated(what string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: input ends in %s", ErrTruncated, what)
	}
	return fmt.Errorf("bloom: read snapshot %s: %w", what, err)
}
