// Package bloom is a sliding-window Bloom filter: it answers "maybe seen" for
// every key added within the last window W, and forgets keys some time
// between W and W+W/G after they were first seen.
//
// A plain Bloom filter cannot forget, so the filter is a ring of G+1
// generations of bits-and-blooms/bloom/v3 filters that share m and k. The
// generations are aligned to absolute time: with span = W/G, a time t
// belongs to generation floor(t.UnixNano() / span). Advance(now) makes the
// generation of now the current one, cur, and the ring keeps generations
// cur-G .. cur. Add puts a key into the generation of its firstSeen time;
// Test asks every live generation, newest first. A generation i is dropped
// only when now reaches (i+G+1)*span, when every key in it is at least W
// old. That is the invariant the filter keeps:
//
//	a key added with firstSeen t answers "maybe" at every now < t+W,
//	as long as Advance was only ever called with times <= now
//	and firstSeen was not after the latest Advance time.
//
// Each generation is sized for ExpectedKeys/G keys at a per-generation
// false-positive rate chosen so that the union of all G+1 generations meets
// FalsePositiveRate. A key is hashed once per Add or Test and the locations
// are reused for every generation. A caller that tests a key and then adds
// it hashes it once with Hash, and uses TestHash and AddHash.
//
// Use:
//
//	f, err := bloom.New(bloom.DefaultOptions(72*time.Hour), clock.Now())
//	if err != nil { ... }
//	now := clock.Now()
//	f.Advance(now)
//	if !f.Test(key) {
//		// definitely not added in the last 72h: no need to read the store
//	}
//	f.Add(key, now)
//
// The filter can be saved with WriteSnapshot and loaded with ReadSnapshot;
// the snapshot carries an opaque uint64 for the caller (for example the
// store version it covers) and a CRC-32C, and a snapshot that is corrupt,
// truncated, foreign or made with other parameters is refused.
package bloom

import (
	"errors"
	"math"
	"sync"
	"time"

	bbloom "github.com/bits-and-blooms/bloom/v3"
)

// Errors returned by this package. Test with errors.Is; the returned errors
// wrap these with details.
var (
	// ErrBadOptions means Options failed validation; the message names the
	// field and its value.
	ErrBadOptions = errors.New("bloom: bad options")
	// ErrBadMagic means the input does not start like a snapshot of this
	// package.
	ErrBadMagic = errors.New("bloom: not a filter snapshot")
	// ErrUnsupportedVersion means the snapshot has a format version this
	// code cannot read.
	ErrUnsupportedVersion = errors.New("bloom: unsupported snapshot version")
	// ErrChecksum means the snapshot's CRC-32C does not match its content.
	ErrChecksum = errors.New("bloom: snapshot checksum mismatch")
	// ErrTruncated means the input ended before the snapshot did.
	ErrTruncated = errors.New("bloom: snapshot truncated")
	// ErrMismatch means the snapshot was made with a Window, Generations,
	// m or k other than the options given to ReadSnapshot imply.
	ErrMismatch = errors.New("bloom: snapshot does not match options")
	// ErrCorrupt means the snapshot's checksum matched but its content is
	// inconsistent (generation indices out of order, bits past m, bits in a
	// generation with no adds, ...). It was not written by WriteSnapshot.
	ErrCorrupt = errors.New("bloom: snapshot content invalid")
)

// Generation indices are clamped to [minGen, maxGen] so that cur-G, cur+1
// and differences of indices never overflow an int64.
const (
	minGen = -(1 << 62)
	maxGen = 1 << 62
)

// Times outside [minTime, maxTime] have no int64 UnixNano.
var (
	minTime = time.Unix(0, math.MinInt64)
	maxTime = time.Unix(0, math.MaxInt64)
)

// generation is one filter of the ring.
type generation struct {
	bf *bbloom.BloomFilter
	// index is the absolute generation number this filter covers.
	index int64
	// adds counts Add calls that went into this filter since it was last
	// cleared. adds == 0 implies every bit is clear.
	adds uint64
}

// Filter is a sliding-window Bloom filter over Options.Window; see the
// package comment for the model. A *Filter is safe for concurrent use by
// multiple goroutines: Test, the accessors and WriteSnapshot take a read
// lock, Add and Advance a write lock, and keys are hashed outside the lock.
type Filter struct {
	opts Options
	span int64 // nanoseconds per generation, > 0
	g    int64 // G; the ring holds G+1 generations
	m    uint64
	k    uint

	mu  sync.RWMutex
	cur int64 // generation of the latest Advance (or of New's now)
	// gens[slot(i)] holds generation i for every i in [cur-G, cur].
	gens []generation
}

// New returns an empty filter positioned so that the current generation is
// the one holding now. It fails with an error wrapping ErrBadOptions if opts
// does not validate.
func New(opts Options, now time.Time) (*Filter, error) {
	f, err := newFilter(opts)
	if err != nil {
		return nil, err
	}
	f.cur = f.generationOf(now)
	for i := f.cur - f.g; i <= f.cur; i++ {
		f.gens[f.slot(i)].index = i
	}
	return f, nil
}

// newFilter allocates a filter for opts with all bits clear and cur and the
// generation indices left zero.
func newFilter(opts Options) (*Filter, error) {
	sz, err := opts.Sizing()
	if err != nil {
		return nil, err
	}
	f := &Filter{
		opts: opts,
		span: int64(sz.Span),
		g:    int64(opts.Generations),
		m:    uint64(sz.BitsPerGeneration),
		k:    sz.Hashes,
		gens: make([]generation, opts.Generations+1),
	}
	for i := range f.gens {
		f.gens[i].bf = bbloom.New(sz.BitsPerGeneration, sz.Hashes)
		if len(f.gens[i].bf.BitSet().Words()) != wordsFor(sz.BitsPerGeneration) {
			// bitset.New returns an empty set when the allocation fails.
			return nil, errors.New("bloom: cannot allocate bit array")
		}
	}
	return f, nil
}

// generationOf returns the absolute generation holding t:
// floor(t.UnixNano()/span), clamped to [minGen, maxGen]. Times before 1970
// floor towards earlier generations; times whose UnixNano does not fit an
// int64 (before 1678 or after 2262, including the zero time.Time) clamp to
// the extremes, so a zero firstSeen counts as long expired.
func (f *Filter) generationOf(t time.Time) int64 {
	if t.Before(minTime) {
		return minGen
	}
	if t.After(maxTime) {
		return maxGen
	}
	ns := t.UnixNano()
	q := ns / f.span
	if ns%f.span != 0 && ns < 0 {
		q--
	}
	return min(max(q, minGen), maxGen)
}

// slot returns the position in gens of generation i.
func (f *Filter) slot(i int64) int {
	n := f.g + 1
	s := i % n
	if s < 0 {
		s += n
	}
	return int(s)
}

// locations hashes key once and returns its k bit positions, already
// reduced modulo m, for use in every generation.
func (f *Filter) locations(key []byte) []uint64 {
	return hashLocations(key, f.k, f.m)
}

// hashLocations returns the k bit positions of key in a bloom/v3 filter of
// m bits: exactly the bits its Add(key) sets and its Test(key) checks.
//
// bloom.Locations allocates its result (one small slice per call); the
// underlying hash is unexported, so the allocation cannot be avoided
// without copying bloom/v3's murmur3 code.
func hashLocations(key []byte, k uint, m uint64) []uint64 {
	locs := bbloom.Locations(key, k)
	for i := range locs {
		locs[i] %= m
	}
	return locs
}

// setBits sets the bits at locs (already reduced modulo m) in bf.
func setBits(bf *bbloom.BloomFilter, locs []uint64) {
	bs := bf.BitSet()
	for _, l := range locs {
		bs.Set(uint(l))
	}
}

// Add records key as first seen at firstSeen, in the generation covering
// firstSeen. Add does not advance the ring; call Advance(now) first.
//
// If firstSeen's generation is older than cur-G the key is already past the
// window and Add ignores it. If firstSeen is newer than the current
// generation (a record from the future, or a clock that stepped back after
// Advance), the key goes into the newest generation: it is then kept for at
// least W after the latest Advance time, but may be forgotten before
// firstSeen+W. Keeping firstSeen <= the latest Advance time avoids this.
func (f *Filter) Add(key []byte, firstSeen time.Time) {
	f.AddHash(f.Hash(key), firstSeen)
}

// Hash is a key's bit locations in a Filter: what Add and Test compute from
// the key. Its zero value is no key's: pass only a Hash from Filter.Hash.
type Hash struct{ locs []uint64 }

// Hash returns key's Hash. It is valid for f and for every filter with the
// same Options.
func (f *Filter) Hash(key []byte) Hash { return Hash{locs: f.locations(key)} }

// IsZero reports whether h is the zero Hash, not one from Filter.Hash.
func (h Hash) IsZero() bool { return h.locs == nil }

// AddHash is Add of the key h was computed from.
func (f *Filter) AddHash(h Hash, firstSeen time.Time) {
	g := f.generationOf(firstSeen)
	locs := h.locs
	f.mu.Lock()
	defer f.mu.Unlock()
	if g < f.cur-f.g {
		return
	}
	g = min(g, f.cur)
	gen := &f.gens[f.slot(g)]
	setBits(gen.bf, locs)
	gen.adds++
}

// Test reports whether key may have been added to a live generation. True
// means "maybe seen" (it may be a false positive); false means key was
// definitely not added to any generation still in the ring, so in
// particular not with a firstSeen within the last W (see the package
// invariant). Generations are probed newest first and Test stops at the
// first that answers maybe.
func (f *Filter) Test(key []byte) bool {
	return f.TestHash(f.Hash(key))
}

// TestHash is Test of the key h was computed from.
func (f *Filter) TestHash(h Hash) bool {
	locs := h.locs
	f.mu.RLock()
	defer f.mu.RUnlock()
	for i := f.cur; i >= f.cur-f.g; i-- {
		if testBits(f.gens[f.slot(i)].bf, locs) {
			return true
		}
	}
	return false
}

// testBits reports whether every location (already reduced modulo m) is set
// in bf; it is bf.TestLocations without the repeated modulo.
func testBits(bf *bbloom.BloomFilter, locs []uint64) bool {
	bs := bf.BitSet()
	for _, l := range locs {
		if !bs.Test(uint(l)) {
			return false
		}
	}
	return true
}

// Advance rotates the ring forward so that the current generation is the
// one holding now, clearing the generations that fall out of [cur-G, cur].
// It never moves backwards: a now in the current generation or earlier is a
// no-op. A jump past the whole ring clears every generation. Bit arrays are
// reused, never reallocated.
func (f *Filter) Advance(now time.Time) {
	n := f.generationOf(now)
	f.mu.Lock()
	defer f.mu.Unlock()
	if n <= f.cur {
		return
	}
	from := f.cur + 1
	if n-f.cur > f.g {
		from = n - f.g
	}
	for i := from; i <= n; i++ {
		gen := &f.gens[f.slot(i)]
		if gen.adds != 0 {
			gen.bf.ClearAll()
		}
		gen.index = i
		gen.adds = 0
	}
	f.cur = n
}

// Since returns the earliest first-seen time the filter answers for: the
// start of its oldest live generation. Every key added with a firstSeen at
// or after Since (and not after the latest Advance time) answers "maybe";
// a Test of a key that may have been first seen before Since proves
// nothing, and the caller must ask the store instead.
func (f *Filter) Since() time.Time {
	f.mu.RLock()
	defer f.mu.RUnlock()
	first := f.cur - f.g
	if first <= math.MinInt64/f.span {
		return minTime // a ring that never advanced past the earliest times
	}
	return time.Unix(0, first*f.span)
}

// Window returns Options.Window, W.
func (f *Filter) Window() time.Duration {
	return f.opts.Window
}

// Span returns the duration of one generation, W/G rounded up to a whole
// nanosecond.
func (f *Filter) Span() time.Duration {
	return time.Duration(f.span)
}

// Options returns the options the filter was built with.
func (f *Filter) Options() Options {
	return f.opts
}

// MemoryBytes returns the bytes of bit arrays held by all G+1 generations
// (m bits each, rounded up to whole 64-bit words).
func (f *Filter) MemoryBytes() uint64 {
	return uint64(wordsFor(uint(f.m))) * 8 * uint64(f.g+1)
}

// BitsPerKey returns m*(G+1) / ExpectedKeys: the filter's bits per key of
// the load it was sized for.
func (f *Filter) BitsPerKey() float64 {
	return float64(f.m) * float64(f.g+1) / float64(f.opts.ExpectedKeys)
}

// Keys returns the number of Add calls that went into live generations.
// It is approximate as a count of distinct keys: a key added twice counts
// twice.
func (f *Filter) Keys() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var n uint64
	for i := range f.gens {
		n += f.gens[i].adds
	}
	return n
}

// EstimatedFalsePositiveRate estimates the probability that Test answers
// true for a key never added: 1 - prod(1 - fp_i) over the live generations,
// where fp_i = (1 - e^(-k*n_i/m))^k and n_i is generation i's add count.
func (f *Filter) EstimatedFalsePositiveRate() float64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	k := float64(f.k)
	m := float64(f.m)
	miss := 1.0
	for i := range f.gens {
		if n := f.gens[i].adds; n > 0 {
			miss *= 1 - math.Pow(-math.Expm1(-k*float64(n)/m), k)
		}
	}
	return 1 - miss
}
