package bloom

import (
	"fmt"
	"math"
	"time"

	bbloom "github.com/bits-and-blooms/bloom/v3"
)

const (
	// MaxGenerations is the largest accepted Options.Generations.
	MaxGenerations = 64
	// MaxHashes is the largest number of hash functions per key the sizing
	// may produce; a FalsePositiveRate so small that it needs more is
	// rejected by Validate.
	MaxHashes = 64
	// MaxMemoryBytes bounds the bit arrays of the whole ring (all G+1
	// generations). Options that need more are rejected by Validate; the
	// bound is a guard against a mistyped ExpectedKeys or FalsePositiveRate,
	// not a capacity plan.
	MaxMemoryBytes = 16 << 30
)

// Options configures a Filter. Build it with DefaultOptions and adjust
// fields; zero values are not filled in by New but rejected by Validate.
type Options struct {
	// Window is W: a key added with firstSeen t answers "maybe" at least
	// until t+W. Required, > 0.
	Window time.Duration

	// Generations is G: the window is split into G generations of span
	// W/G (rounded up to a whole nanosecond) and the ring holds G+1 of
	// them; the extra one is the guard that keeps the oldest keys until
	// they are past W. Keys are forgotten between W and W+W/G after they
	// were first seen. Larger G forgets closer to W, but every absent-key
	// Test probes G+1 filters and each generation needs a lower
	// false-positive rate; total bits per key are lowest around G=4..8.
	// 1..MaxGenerations, default 4.
	Generations int

	// ExpectedKeys is the number of keys added per Window. Each generation
	// is sized for ceil(ExpectedKeys/Generations) keys. Adding more keys
	// than this does not lose any, but raises the false-positive rate.
	// Required, > 0; default 1_000_000.
	ExpectedKeys uint

	// FalsePositiveRate is the target false-positive rate of the whole
	// filter (the union of all G+1 generations, each loaded with its share
	// of ExpectedKeys). In (0, 1); default 0.01.
	FalsePositiveRate float64
}

// DefaultOptions returns options for the given window with 4 generations,
// 1_000_000 expected keys per window and a 1% false-positive rate.
func DefaultOptions(window time.Duration) Options {
	return Options{
		Window:            window,
		Generations:       4,
		ExpectedKeys:      1_000_000,
		FalsePositiveRate: 0.01,
	}
}

// Validate reports whether o can build a Filter. The error wraps
// ErrBadOptions and names the offending field and its value.
func (o Options) Validate() error {
	_, err := o.Sizing()
	return err
}

// Sizing is what a set of Options implies for the filter.
type Sizing struct {
	// KeysPerGeneration is n_g = ceil(ExpectedKeys / Generations).
	KeysPerGeneration uint
	// FalsePositiveRatePerGeneration is p_g = 1 - (1-p)^(1/(G+1)), so that
	// the union of G+1 generations meets FalsePositiveRate.
	FalsePositiveRatePerGeneration float64
	// BitsPerGeneration is m, from bloom.EstimateParameters(n_g, p_g).
	BitsPerGeneration uint
	// Hashes is k, from bloom.EstimateParameters(n_g, p_g).
	Hashes uint
	// Span is the duration of one generation: Window / Generations, rounded
	// up to a whole nanosecond so that Generations spans cover Window.
	Span time.Duration
	// MemoryBytes is the size of the bit arrays of all G+1 generations
	// (each rounded up to whole 64-bit words).
	MemoryBytes uint64
}

// Sizing validates o and returns the per-generation parameters it implies.
// The error wraps ErrBadOptions and names the offending field and its value.
func (o Options) Sizing() (Sizing, error) {
	if o.Window <= 0 {
		return Sizing{}, fmt.Errorf("%w: Window %v must be > 0", ErrBadOptions, o.Window)
	}
	if o.Generations < 1 || o.Generations > MaxGenerations {
		return Sizing{}, fmt.Errorf("%w: Generations %d must be in 1..%d", ErrBadOptions, o.Generations, MaxGenerations)
	}
	// Rounded up so that G spans cover at least W: a generation is dropped
	// only once every key in it is at least G*span >= W old.
	span := o.Window / time.Duration(o.Generations)
	if o.Window%time.Duration(o.Generations) != 0 {
		span++
	}
	if o.ExpectedKeys == 0 {
		return Sizing{}, fmt.Errorf("%w: ExpectedKeys %d must be > 0", ErrBadOptions, o.ExpectedKeys)
	}
	p := o.FalsePositiveRate
	if !(p > 0 && p < 1) { // also rejects NaN
		return Sizing{}, fmt.Errorf("%w: FalsePositiveRate %v must be in (0, 1)", ErrBadOptions, p)
	}
	g := uint(o.Generations)
	ng := o.ExpectedKeys / g
	if o.ExpectedKeys%g != 0 {
		ng++
	}
	// 1-(1-p)^(1/(G+1)) computed without cancellation for tiny p.
	pg := -math.Expm1(math.Log1p(-p) / float64(g+1))
	if !(pg > 0) {
		return Sizing{}, fmt.Errorf("%w: FalsePositiveRate %v is too small to split over %d generations", ErrBadOptions, p, g+1)
	}
	// Bound the sizing in floating point before converting to integers,
	// mirroring bloom.EstimateParameters.
	mf := math.Ceil(-float64(ng) * math.Log(pg) / (math.Ln2 * math.Ln2))
	if bytes := math.Ceil(mf/64) * 8 * float64(g+1); !(bytes <= MaxMemoryBytes) {
		return Sizing{}, fmt.Errorf("%w: ExpectedKeys %d at FalsePositiveRate %v with Generations %d needs %.0f bytes, more than %d",
			ErrBadOptions, o.ExpectedKeys, p, o.Generations, bytes, int64(MaxMemoryBytes))
	}
	if kf := math.Ceil(math.Ln2 * mf / float64(ng)); kf > MaxHashes {
		return Sizing{}, fmt.Errorf("%w: FalsePositiveRate %v with Generations %d needs %.0f hashes per key, more than %d",
			ErrBadOptions, p, o.Generations, kf, MaxHashes)
	}
	m, k := bbloom.EstimateParameters(ng, pg)
	if m < 1 || k < 1 || k > MaxHashes {
		return Sizing{}, fmt.Errorf("%w: ExpectedKeys %d at FalsePositiveRate %v gives m=%d k=%d", ErrBadOptions, o.ExpectedKeys, p, m, k)
	}
	return Sizing{
		KeysPerGeneration:              ng,
		FalsePositiveRatePerGeneration: pg,
		BitsPerGeneration:              m,
		Hashes:                         k,
		Span:                           span,
		MemoryBytes:                    uint64(wordsFor(m)) * 8 * uint64(g+1),
	}, nil
}

// wordsFor is the number of 64-bit words holding m bits.
func wordsFor(m uint) int {
	return int((uint64(m) + 63) / 64)
}
