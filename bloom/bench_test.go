package bloom

import (
	"bytes"
	"encoding/binary"
	"io"
	"sync"
	"testing"
	"time"
)

// benchOpts is the production-sized filter: 10M keys per window, 1%, G=4.
var benchOpts = Options{Window: time.Hour, Generations: 4, ExpectedKeys: 10_000_000, FalsePositiveRate: 0.01}

var benchT0 = time.Unix(1_700_006_400, 0) // aligned to the 15-minute span

// benchKey writes key i of a key space into buf.
func benchKey(buf []byte, space byte, i uint64) []byte {
	buf[0] = space
	binary.BigEndian.PutUint64(buf[1:], i)
	return buf[:9]
}

var (
	benchFilledOnce sync.Once
	benchFilled     *Filter
)

// filledBenchFilter returns a filter holding the sized load of benchOpts,
// ExpectedKeys spread over the window with Advance as time goes; built once
// and shared by the read-only benchmarks.
func filledBenchFilter(b *testing.B) *Filter {
	b.Helper()
	benchFilledOnce.Do(func() {
		f := newTestFilter(b, benchOpts, benchT0)
		n := uint64(benchOpts.ExpectedKeys)
		step := benchOpts.Window / time.Duration(n)
		buf := make([]byte, 9)
		for i := uint64(0); i < n; i++ {
			now := benchT0.Add(time.Duration(i) * step)
			if i%1024 == 0 {
				f.Advance(now)
			}
			f.Add(benchKey(buf, 1, i), now)
		}
		benchFilled = f
	})
	return benchFilled
}

// BenchmarkTest probes keys that were added (every generation but the
// newest holds some of them).
func BenchmarkTest(b *testing.B) {
	f := filledBenchFilter(b)
	n := uint64(benchOpts.ExpectedKeys)
	buf := make([]byte, 9)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if !f.Test(benchKey(buf, 1, uint64(i)*7919%n)) {
			b.Fatal("added key tests false")
		}
	}
	b.StopTimer()
	b.ReportMetric(f.BitsPerKey(), "bits/key")
}

// BenchmarkTestAbsent probes keys never added: every generation is asked.
func BenchmarkTestAbsent(b *testing.B) {
	f := filledBenchFilter(b)
	buf := make([]byte, 9)
	fp := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if f.Test(benchKey(buf, 2, uint64(i))) {
			fp++
		}
	}
	b.StopTimer()
	b.ReportMetric(f.BitsPerKey(), "bits/key")
	b.ReportMetric(float64(fp)/float64(b.N), "fp-rate")
}

// BenchmarkTestParallel is BenchmarkTestAbsent from all cores at once,
// to show the cost of the read lock under contention.
func BenchmarkTestParallel(b *testing.B) {
	f := filledBenchFilter(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 9)
		var i uint64
		for pb.Next() {
			f.Test(benchKey(buf, 3, i))
			i++
		}
	})
}

// BenchmarkAdd adds keys at the sized rate (ExpectedKeys per window),
// advancing the ring as time goes, into a fresh filter.
func BenchmarkAdd(b *testing.B) {
	f := newTestFilter(b, benchOpts, benchT0)
	step := benchOpts.Window / time.Duration(benchOpts.ExpectedKeys)
	buf := make([]byte, 9)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now := benchT0.Add(time.Duration(i) * step)
		if i%1024 == 0 {
			f.Advance(now)
		}
		f.Add(benchKey(buf, 1, uint64(i)), now)
	}
	b.StopTimer()
	b.ReportMetric(f.BitsPerKey(), "bits/key")
}

// BenchmarkWriteSnapshot writes the filled 10M-key filter to memory.
func BenchmarkWriteSnapshot(b *testing.B) {
	f := filledBenchFilter(b)
	b.SetBytes(int64(f.MemoryBytes()))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := f.WriteSnapshot(io.Discard, uint64(i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadSnapshot loads the filled 10M-key filter from memory.
func BenchmarkReadSnapshot(b *testing.B) {
	f := filledBenchFilter(b)
	var buf bytes.Buffer
	if _, err := f.WriteSnapshot(&buf, 1); err != nil {
		b.Fatal(err)
	}
	snap := buf.Bytes()
	b.SetBytes(int64(len(snap)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, err := ReadSnapshot(bytes.NewReader(snap), benchOpts); err != nil {
			b.Fatal(err)
		}
	}
}
