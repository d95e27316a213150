package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

var testHeader = Header{
	Group: "dedupe", Partition: 3, Partitions: 8, Seq: 123456,
	StreamCreated: time.Unix(1_700_000_000, 5), Window: time.Hour, Taken: time.Unix(1_700_003_600, 7),
}

// testRecords returns n records with 20-byte keys first seen inside the
// hour before testHeader.Taken.
func testRecords(n int) []Record {
	rng := rand.New(rand.NewPCG(1, 2))
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = Record{
			Key:         fmt.Appendf(nil, "order-%014d", i),
			FirstSeen:   testHeader.Taken.Add(-time.Duration(rng.Int64N(int64(time.Hour)))),
			Fingerprint: rng.Uint64(),
		}
	}
	return recs
}

// withPolicies gives some of recs a refresh, a forget or a version, as
// the per-key policies store them.
func withPolicies(recs []Record) []Record {
	for i := range recs {
		r := &recs[i]
		if i%3 == 0 {
			r.Refreshed = r.FirstSeen.Add(time.Duration(i) * time.Millisecond)
		}
		if i%5 == 0 {
			r.Version, r.HasVersion = uint64(i)*1_000_003, true
		}
		if i%7 == 0 {
			r.Forgotten = r.FirstSeen.Add(time.Second)
		}
	}
	return recs
}

// withOutputSeqs gives most of recs an output sequence: below the
// header's Seq, as a forward the snapshot covers, and a few above it.
func withOutputSeqs(recs []Record) []Record {
	for i := range recs {
		switch {
		case i%6 == 0:
			recs[i].OutputSeq = testHeader.Seq + uint64(i) + 1
		case i%6 != 1:
			recs[i].OutputSeq = testHeader.Seq - uint64(i)*37
		}
	}
	return recs
}

// same reports whether a and b are the same record.
func same(a, b Record) bool {
	return bytes.Equal(a.Key, b.Key) && a.FirstSeen.Equal(b.FirstSeen) && a.Fingerprint == b.Fingerprint &&
		a.Refreshed.Equal(b.Refreshed) && a.Forgotten.Equal(b.Forgotten) && a.Version == b.Version && a.HasVersion == b.HasVersion &&
		a.OutputSeq == b.OutputSeq
}

func encode(tb testing.TB, h Header, recs []Record) []byte {
	tb.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	if err != nil {
		tb.Fatal(err)
	}
	for _, r := range recs {
		if err := w.Add(r); err != nil {
			tb.Fatal(err)
		}
	}
	n, err := w.Close()
	if err != nil {
		tb.Fatal(err)
	}
	if n != uint64(len(recs)) {
		tb.Fatalf("Close says %d records, want %d", n, len(recs))
	}
	return buf.Bytes()
}

// decode reads every record of b; the error is Next's (nil at a checked end).
func decode(b []byte) (Header, []Record, error) {
	r, err := NewReader(bytes.NewReader(b))
	if err != nil {
		return Header{}, nil, err
	}
	var recs []Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return r.Header(), recs, nil
		}
		if err != nil {
			return r.Header(), recs, err
		}
		rec.Key = bytes.Clone(rec.Key)
		recs = append(recs, rec)
	}
}

func TestRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 5000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			want := withOutputSeqs(withPolicies(testRecords(n)))
			b := encode(t, testHeader, want)
			h, got, err := decode(b)
			if err != nil {
				t.Fatal(err)
			}
			checkDecoded(t, h, got, want)
			if n > 0 {
				t.Logf("%d records of 20-byte keys: %d bytes, %.1f bytes/key", n, len(b), float64(len(b))/float64(n))
			}
		})
	}
}

// TestReadsVersion1 reads a snapshot an earlier release wrote (format
// version 1, testdata/v1.snap: testHeader and testRecords(3)): a new owner
// still loads it after an upgrade.
func TestReadsVersion1(t *testing.T) {
	b, err := os.ReadFile("testdata/v1.snap")
	if err != nil {
		t.Fatal(err)
	}
	if b[4] != 1 {
		t.Fatalf("testdata/v1.snap is format version %d, want 1", b[4])
	}
	h, got, err := decode(b)
	if err != nil {
		t.Fatal(err)
	}
	checkDecoded(t, h, got, testRecords(3))
}

// TestReadsVersion2 reads a snapshot in format version 2
// (testdata/v2.snap: testHeader and withPolicies(testRecords(8)), records
// without an output sequence), as the release before version 3 wrote it.
func TestReadsVersion2(t *testing.T) {
	b, err := os.ReadFile("testdata/v2.snap")
	if err != nil {
		t.Fatal(err)
	}
	if b[4] != 2 {
		t.Fatalf("testdata/v2.snap is format version %d, want 2", b[4])
	}
	h, got, err := decode(b)
	if err != nil {
		t.Fatal(err)
	}
	checkDecoded(t, h, got, withPolicies(testRecords(8)))
}

// checkDecoded fails unless h is testHeader and got equals want.
func checkDecoded(t *testing.T, h Header, got, want []Record) {
	t.Helper()
	if h.Group != testHeader.Group || h.Partition != 3 || h.Partitions != 8 || h.Seq != 123456 ||
		!h.StreamCreated.Equal(testHeader.StreamCreated) || h.Window != time.Hour || !h.Taken.Equal(testHeader.Taken) {
		t.Fatalf("header %+v, want %+v", h, testHeader)
	}
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d", len(got), len(want))
	}
	for i := range want {
		if !same(got[i], want[i]) {
			t.Fatalf("record %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestCompact checks the size target: under 40 bytes per key of 20 bytes.
// Records carry their forward's output sequence, as a partition of a
// group of 8 writes them: one forward in 8 of the stream is this
// partition's.
func TestCompact(t *testing.T) {
	const n = 20000
	h := testHeader
	h.Seq = 50_000_000
	recs := testRecords(n)
	for i := range recs {
		recs[i].OutputSeq = h.Seq - uint64(n-i)*8
	}
	b := encode(t, h, recs)
	per := float64(len(b)) / n
	if per >= 40 {
		t.Fatalf("%.1f bytes per 20-byte key, want < 40", per)
	}
	t.Logf("%.1f bytes per 20-byte key with its output sequence", per)
}

// TestCorruptDetected flips, cuts and drops bytes of a valid snapshot: each
// is ErrCorrupt (or ErrVersion), never a clean end, and every record
// returned before the error is one that was written.
func TestCorruptDetected(t *testing.T) {
	want := withPolicies(testRecords(3000)) // several blocks
	b := encode(t, testHeader, want)
	written := make(map[string]Record, len(want))
	for _, r := range want {
		written[string(r.Key)] = r
	}
	check := func(t *testing.T, name string, bad []byte) {
		t.Helper()
		_, got, err := decode(bad)
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrVersion) {
			t.Fatalf("%s: err %v, want ErrCorrupt", name, err)
		}
		for _, r := range got {
			w, ok := written[string(r.Key)]
			if !ok || !same(w, r) {
				t.Fatalf("%s: returned a record never written: %+v", name, r)
			}
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		i := rng.IntN(len(b))
		bad := bytes.Clone(b)
		bad[i] ^= byte(1 + rng.IntN(255))
		check(t, fmt.Sprintf("byte %d flipped", i), bad)
	}
	for _, cut := range []int{0, 3, 5, 20, len(b) / 2, len(b) - 5, len(b) - 1} {
		check(t, fmt.Sprintf("cut at %d", cut), b[:cut])
	}
	// A whole block dropped: blocks are ~64 KiB, find the second's start by
	// re-encoding the first block alone.
	first := encode(t, testHeader, nil)
	hdrLen := len(first) - 6 // header and its checksum; the empty end is 0, 0 and 4 bytes
	check(t, "one block dropped", append(bytes.Clone(b[:hdrLen]), b[hdrLen+len(b)/3:]...))
}

func TestBadRecordRefused(t *testing.T) {
	w, err := NewWriter(io.Discard, testHeader)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(Record{}); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("empty key: %v, want ErrBadRecord", err)
	}
	if err := w.Add(Record{Key: make([]byte, MaxKeySize+1)}); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("long key: %v, want ErrBadRecord", err)
	}
}

func FuzzReader(f *testing.F) {
	f.Add(encode(f, testHeader, testRecords(3)))
	f.Add(encode(f, Header{}, nil))
	f.Add([]byte("DDSN\x01"))
	f.Add(encode(f, testHeader, withPolicies(testRecords(8))))
	f.Add([]byte("DDSN\x02"))
	if v1, err := os.ReadFile("testdata/v1.snap"); err == nil {
		f.Add(v1)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<20 {
			return
		}
		h, recs, err := decode(b)
		if err != nil {
			return
		}
		// What decodes cleanly encodes to a snapshot that decodes to the
		// same header and records.
		h2, recs2, err := decode(encode(t, h, recs))
		if err != nil {
			t.Fatalf("re-encoded snapshot: %v", err)
		}
		if h2 != h || len(recs2) != len(recs) {
			t.Fatalf("round trip: %+v with %d records, want %+v with %d", h2, len(recs2), h, len(recs))
		}
		for i := range recs {
			if !same(recs[i], recs2[i]) {
				t.Fatalf("round trip: record %d = %+v, want %+v", i, recs2[i], recs[i])
			}
		}
	})
}

func BenchmarkRead(b *testing.B) {
	buf := encode(b, testHeader, testRecords(100_000))
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for b.Loop() {
		if _, _, err := decode(buf); err != nil {
			b.Fatal(err)
		}
	}
}
