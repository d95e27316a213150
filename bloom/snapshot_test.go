package bloom

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"slices"
	"testing"
	"time"

	bbloom "github.com/bits-and-blooms/bloom/v3"
)

// snapOpts are small options for snapshot tests: m is not a multiple of 64,
// so the padding check is exercised.
var snapOpts = Options{Window: 4 * time.Second, Generations: 3, ExpectedKeys: 300, FalsePositiveRate: 0.01}

// filledFilter returns a filter built with opts whose generations hold
// different keys, some generations empty, and the keys added.
func filledFilter(tb testing.TB, opts Options) (*Filter, [][]byte) {
	tb.Helper()
	t0 := time.Unix(1_700_000_000, 0)
	f := newTestFilter(tb, opts, t0)
	var keys [][]byte
	// Generations cur-G+1 .. cur get keys; the oldest stays empty.
	for g := 1; g <= opts.Generations; g++ {
		now := t0.Add(time.Duration(g) * f.Span())
		f.Advance(now)
		for i := 0; i < 50*g; i++ {
			k := testKey(byte(20+g), uint64(i))
			f.Add(k, now)
			keys = append(keys, k)
		}
	}
	return f, keys
}

// snapshotBytes writes f's snapshot and checks the reported size.
func snapshotBytes(tb testing.TB, f *Filter, meta uint64) []byte {
	tb.Helper()
	var buf bytes.Buffer
	n, err := f.WriteSnapshot(&buf, meta)
	if err != nil {
		tb.Fatalf("WriteSnapshot: %v", err)
	}
	if n != int64(buf.Len()) {
		tb.Fatalf("WriteSnapshot returned %d, wrote %d bytes", n, buf.Len())
	}
	want, err := SnapshotSize(f.Options())
	if err != nil {
		tb.Fatal(err)
	}
	if n != want {
		tb.Fatalf("snapshot is %d bytes, SnapshotSize says %d", n, want)
	}
	return buf.Bytes()
}

// resum recomputes the trailing CRC-32C of a snapshot after a test edits it.
func resum(b []byte) {
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], crc32.MakeTable(crc32.Castagnoli)))
}

func TestSnapshotRoundTrip(t *testing.T) {
	for _, opts := range []Options{snapOpts, {Window: time.Hour, Generations: 4, ExpectedKeys: 100_000, FalsePositiveRate: 0.01}} {
		t.Run(opts.Window.String(), func(t *testing.T) {
			f, keys := filledFilter(t, opts)
			const meta uint64 = 0xfeedface_12345678
			b := snapshotBytes(t, f, meta)

			r := bytes.NewReader(append(slices.Clone(b), "trailing"...))
			g, gotMeta, err := ReadSnapshot(r, opts)
			if err != nil {
				t.Fatalf("ReadSnapshot: %v", err)
			}
			if gotMeta != meta {
				t.Errorf("meta = %x, want %x", gotMeta, meta)
			}
			if rest, _ := io.ReadAll(r); string(rest) != "trailing" {
				t.Errorf("ReadSnapshot left %q unread, want exactly the bytes after the snapshot", rest)
			}
			if g.cur != f.cur {
				t.Errorf("cur = %d, want %d", g.cur, f.cur)
			}
			checkRing(t, g, f.cur)
			for i := f.cur - f.g; i <= f.cur; i++ {
				a, b := f.gens[f.slot(i)], g.gens[g.slot(i)]
				if a.adds != b.adds || !a.bf.Equal(b.bf) {
					t.Errorf("generation %d: adds %d vs %d, bits equal %v", i, a.adds, b.adds, a.bf.Equal(b.bf))
				}
			}
			for _, k := range keys {
				if !g.Test(k) {
					t.Fatalf("key %x lost in the round trip", k)
				}
			}
			for i := uint64(0); i < 20_000; i++ {
				k := testKey(99, i)
				if f.Test(k) != g.Test(k) {
					t.Fatalf("absent key %x answers differently after the round trip", k)
				}
			}
			if f.Keys() != g.Keys() || f.EstimatedFalsePositiveRate() != g.EstimatedFalsePositiveRate() {
				t.Errorf("Keys/EstimatedFalsePositiveRate differ: %d/%g vs %d/%g",
					f.Keys(), f.EstimatedFalsePositiveRate(), g.Keys(), g.EstimatedFalsePositiveRate())
			}
			if again := snapshotBytes(t, g, meta); !bytes.Equal(again, b) {
				t.Error("snapshot of the loaded filter differs from the original snapshot")
			}

			// The loaded filter keeps working: rotation drops its oldest keys.
			g.Advance(time.Unix(0, (g.cur+1)*g.span))
			checkRing(t, g, f.cur+1)
		})
	}
}

// TestSnapshotExtremeGenerations round-trips filters positioned at the
// clamped ends of the generation range and before 1970.
func TestSnapshotExtremeGenerations(t *testing.T) {
	for _, now := range []time.Time{{}, time.Unix(-5, 0), time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)} {
		f := newTestFilter(t, snapOpts, now)
		f.Add([]byte("k"), now)
		b := snapshotBytes(t, f, 3)
		g, _, err := ReadSnapshot(bytes.NewReader(b), snapOpts)
		if err != nil {
			t.Fatalf("now %v (generation %d): %v", now, f.cur, err)
		}
		checkRing(t, g, f.cur)
		if !g.Test([]byte("k")) {
			t.Fatalf("now %v: key lost", now)
		}
	}
}

func TestSnapshotCorruptByte(t *testing.T) {
	f, _ := filledFilter(t, snapOpts)
	b := snapshotBytes(t, f, 7)
	for i := range b {
		for _, mask := range []byte{0x01, 0x80, 0xff} {
			c := slices.Clone(b)
			c[i] ^= mask
			g, _, err := ReadSnapshot(bytes.NewReader(c), snapOpts)
			if err == nil || g != nil {
				t.Fatalf("byte %d ^ %#x: ReadSnapshot accepted a corrupted snapshot", i, mask)
			}
			if i >= headerSize && !errors.Is(err, ErrChecksum) {
				t.Fatalf("byte %d ^ %#x in the body: error %v, want ErrChecksum", i, mask, err)
			}
		}
	}
}

func TestSnapshotTruncated(t *testing.T) {
	f, _ := filledFilter(t, snapOpts)
	b := snapshotBytes(t, f, 7)
	for n := 0; n < len(b); n++ {
		g, _, err := ReadSnapshot(bytes.NewReader(b[:n]), snapOpts)
		if !errors.Is(err, ErrTruncated) || g != nil {
			t.Fatalf("snapshot cut to %d of %d bytes: error %v, want ErrTruncated", n, len(b), err)
		}
	}
}

func TestSnapshotErrors(t *testing.T) {
	f, _ := filledFilter(t, snapOpts)
	valid := snapshotBytes(t, f, 7)
	edit := func(change func([]byte)) []byte {
		c := slices.Clone(valid)
		change(c)
		return c
	}
	var bloomV3 bytes.Buffer
	if _, err := bbloom.NewWithEstimates(100, 0.01).WriteTo(&bloomV3); err != nil {
		t.Fatal(err)
	}
	other := func(change func(*Options)) Options {
		o := snapOpts
		change(&o)
		return o
	}
	tests := []struct {
		name  string
		input []byte
		opts  Options
		want  error
	}{
		{"empty", nil, snapOpts, ErrTruncated},
		{"magic prefix only", []byte("DS"), snapOpts, ErrTruncated},
		{"text", []byte("this is not a snapshot at all"), snapOpts, ErrBadMagic},
		{"short foreign", []byte("DX"), snapOpts, ErrBadMagic},
		{"json", []byte(`{"m":1,"k":1}`), snapOpts, ErrBadMagic},
		{"bloom/v3 WriteTo", bloomV3.Bytes(), snapOpts, ErrBadMagic},
		{"version 2", edit(func(b []byte) { b[4] = 2; resum(b) }), snapOpts, ErrUnsupportedVersion},
		{"version 0", edit(func(b []byte) { b[4] = 0 }), snapOpts, ErrUnsupportedVersion},
		{"other window", valid, other(func(o *Options) { o.Window = time.Hour }), ErrMismatch},
		{"other generations", valid, other(func(o *Options) { o.Generations = 4 }), ErrMismatch},
		{"other expected keys", valid, other(func(o *Options) { o.ExpectedKeys = 3000 }), ErrMismatch},
		{"other fp rate", valid, other(func(o *Options) { o.FalsePositiveRate = 0.001 }), ErrMismatch},
		{"bad options", valid, other(func(o *Options) { o.Window = 0 }), ErrBadOptions},
		{"checksum", edit(func(b []byte) { b[len(b)-1]++ }), snapOpts, ErrChecksum},
		{"generation index out of order", edit(func(b []byte) {
			binary.LittleEndian.PutUint64(b[headerSize:], 0)
			resum(b)
		}), snapOpts, ErrCorrupt},
		{"bits in a generation without adds", edit(func(b []byte) {
			// The oldest generation is empty: set a bit in it.
			b[headerSize+genHeaderSize] = 1
			resum(b)
		}), snapOpts, ErrCorrupt},
		{"adds without bits", edit(func(b []byte) {
			binary.LittleEndian.PutUint64(b[headerSize+8:], 5)
			resum(b)
		}), snapOpts, ErrCorrupt},
		{"bit past m", edit(func(b []byte) {
			// Last byte of the newest generation's last word, top bit.
			b[len(b)-trailerSize-1] |= 0x80
			resum(b)
		}), snapOpts, ErrCorrupt},
		{"current generation out of range", edit(func(b []byte) {
			cur := int64(minGen - 1)
			binary.LittleEndian.PutUint64(b[36:], uint64(cur))
			resum(b)
		}), snapOpts, ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, _, err := ReadSnapshot(bytes.NewReader(tt.input), tt.opts)
			if !errors.Is(err, tt.want) || g != nil {
				t.Fatalf("ReadSnapshot error = %v, want %v", err, tt.want)
			}
		})
	}
	if sz, _ := snapOpts.Sizing(); sz.BitsPerGeneration%64 == 0 {
		t.Fatalf("snapOpts give m = %d, a multiple of 64: the bit-past-m case tests nothing", sz.BitsPerGeneration)
	}
}

// failingWriter accepts limit bytes, then fails.
type failingWriter struct{ limit int }

var errWriter = errors.New("disk full")

func (w *failingWriter) Write(p []byte) (int, error) {
	if len(p) <= w.limit {
		w.limit -= len(p)
		return len(p), nil
	}
	n := w.limit
	w.limit = 0
	return n, errWriter
}

func TestWriteSnapshotError(t *testing.T) {
	f, _ := filledFilter(t, snapOpts)
	size, _ := SnapshotSize(snapOpts)
	for _, limit := range []int{0, 10, int(size) / 2, int(size) - 1} {
		n, err := f.WriteSnapshot(&failingWriter{limit: limit}, 1)
		if !errors.Is(err, errWriter) {
			t.Fatalf("limit %d: error %v, want the writer's error", limit, err)
		}
		if n != int64(limit) {
			t.Fatalf("limit %d: WriteSnapshot reported %d bytes written", limit, n)
		}
	}
}

type errReader struct{}

var errRead = errors.New("connection reset")

func (errReader) Read([]byte) (int, error) { return 0, errRead }

func TestReadSnapshotReadError(t *testing.T) {
	f, _ := filledFilter(t, snapOpts)
	b := snapshotBytes(t, f, 1)
	_, _, err := ReadSnapshot(io.MultiReader(bytes.NewReader(b[:100]), errReader{}), snapOpts)
	if !errors.Is(err, errRead) || errors.Is(err, ErrTruncated) {
		t.Fatalf("error %v, want the reader's error (not ErrTruncated)", err)
	}
}
