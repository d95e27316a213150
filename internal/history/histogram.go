package history

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"time"
)

// Percentiles come from a histogram of fixed logarithmic buckets: each
// bucket from 1 ms up is growth times as wide as the one before, and a
// percentile is reported as its bucket's geometric middle, clamped to the
// exact smallest and largest ages. So a percentile is within
// RelativeError of the true one; below 1 ms it is reported as 0.
const (
	growth    = 1.02
	bucketMin = time.Millisecond
	// numBuckets covers ages up to about 30 years.
	numBuckets = 1400
)

// RelativeError bounds the relative error of a reported percentile of
// at least 1 ms: sqrt(growth) - 1, under 1 %.
var RelativeError = math.Sqrt(growth) - 1

// histogram counts ages in fixed logarithmic buckets: bucket 0 holds ages
// under bucketMin, bucket i >= 1 ages in [bound(i-1), bound(i)).
type histogram struct {
	counts   [numBuckets + 1]uint64
	n        uint64
	min, max time.Duration
}

// bound returns the upper bound of bucket i (exclusive): bucketMin *
// growth^i, in whole nanoseconds.
func bound(i int) time.Duration {
	v := float64(bucketMin) * math.Pow(growth, float64(i))
	if v >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(v)
}

// bucketOf returns the bucket of age.
func bucketOf(age time.Duration) int {
	if age < bucketMin {
		return 0
	}
	i := int(math.Log(float64(age)/float64(bucketMin))/math.Log(growth)) + 1
	// The logarithm is computed in floating point: settle the edges on the
	// integer bounds.
	for i > 1 && age < bound(i-1) {
		i--
	}
	for i < numBuckets && age >= bound(i) {
		i++
	}
	return min(i, numBuckets)
}

func (h *histogram) add(age time.Duration) {
	if h.n == 0 || age < h.min {
		h.min = age
	}
	h.max = max(h.max, age)
	h.counts[bucketOf(age)]++
	h.n++
}

// rankBucket returns the bucket holding the age of rank ceil(q*n) (the
// smallest age at least a fraction q of the ages are at most).
func (h *histogram) rankBucket(q float64) int {
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum >= rank {
			return i
		}
	}
	return numBuckets
}

// quantile returns the q-quantile of the ages, within RelativeError (0
// below 1 ms).
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	i := h.rankBucket(q)
	var v time.Duration
	if i > 0 {
		v = time.Duration(float64(bucketMin) * math.Pow(growth, float64(i)-0.5))
	}
	return min(max(v, h.min), h.max)
}

// catching returns the smallest bucket bound W (W > age, as run's window
// holds a key while its age is under W) that catches at least a fraction
// q of the ages: every age of the quantile's bucket is under it.
func (h *histogram) catching(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	return min(bound(h.rankBucket(q)), h.max+1)
}

// agesFile keeps every repeat's age, 8 bytes each, in a temporary file,
// so that how many repeats a window forwards again is counted exactly
// for any W, after the history is read.
type agesFile struct {
	f *os.File
	w *bufio.Writer
	b [8]byte
}

func newAgesFile(dir string) (*agesFile, error) {
	f, err := os.CreateTemp(dir, "dedupe-analyze-ages-")
	if err != nil {
		return nil, fmt.Errorf("history: temporary ages file: %w", err)
	}
	return &agesFile{f: f, w: bufio.NewWriterSize(f, 1<<20)}, nil
}

func (a *agesFile) add(age time.Duration) error {
	binary.LittleEndian.PutUint64(a.b[:], uint64(age))
	_, err := a.w.Write(a.b[:])
	return err
}

// each calls fn with every age, in the order added.
func (a *agesFile) each(fn func(time.Duration)) error {
	if err := a.w.Flush(); err != nil {
		return fmt.Errorf("history: write ages file: %w", err)
	}
	if _, err := a.f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("history: read ages file: %w", err)
	}
	r := bufio.NewReaderSize(a.f, 1<<20)
	var b [8]byte
	for {
		if _, err := io.ReadFull(r, b[:]); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("history: read ages file: %w", err)
		}
		fn(time.Duration(binary.LittleEndian.Uint64(b[:])))
	}
}

func (a *agesFile) close() error {
	name := a.f.Name()
	err := a.f.Close()
	if rerr := os.Remove(name); err == nil {
		err = rerr
	}
	return err
}
