package bloom

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand"
	"sync"
	"testing"
	"time"

	bbloom "github.com/bits-and-blooms/bloom/v3"
)

// testKey returns a distinct key for (space, i).
func testKey(space byte, i uint64) []byte {
	k := make([]byte, 9)
	k[0] = space
	binary.BigEndian.PutUint64(k[1:], i)
	return k
}

// floorDiv is floor(a/b) for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// newTestFilter builds a filter or fails the test.
func newTestFilter(tb testing.TB, opts Options, now time.Time) *Filter {
	tb.Helper()
	f, err := New(opts, now)
	if err != nil {
		tb.Fatalf("New(%+v): %v", opts, err)
	}
	return f
}

// checkRing asserts the ring holds exactly generations cur-G..cur, each in
// its slot.
func checkRing(tb testing.TB, f *Filter, cur int64) {
	tb.Helper()
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.cur != cur {
		tb.Fatalf("cur = %d, want %d", f.cur, cur)
	}
	for i := cur - f.g; i <= cur; i++ {
		if got := f.gens[f.slot(i)].index; got != i {
			tb.Fatalf("slot %d holds generation %d, want %d", f.slot(i), got, i)
		}
	}
}

// allClear reports whether every bit of every generation is clear.
func allClear(f *Filter) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, g := range f.gens {
		for _, w := range g.bf.BitSet().Words() {
			if w != 0 {
				return false
			}
		}
	}
	return true
}

func TestSetBitsMatchesBloomAdd(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, m := range []uint{1, 2, 63, 64, 65, 1000, 12345, 1 << 20} {
		for _, k := range []uint{1, 2, 3, 7, 13, 32, 64} {
			t.Run(fmt.Sprintf("m=%d,k=%d", m, k), func(t *testing.T) {
				want := bbloom.New(m, k)
				got := bbloom.New(m, k)
				for i := 0; i < 50; i++ {
					key := make([]byte, rng.Intn(40))
					rng.Read(key)
					want.Add(key)
					locs := hashLocations(key, k, uint64(m))
					setBits(got, locs)
					if !got.Equal(want) {
						t.Fatalf("after key %x: bits differ from bloom's own Add", key)
					}
					if !testBits(want, locs) || !want.TestLocations(bbloom.Locations(key, k)) {
						t.Fatalf("key %x: testBits/TestLocations false after Add", key)
					}
				}
			})
		}
	}
}

func TestFilterAddSetsBloomBits(t *testing.T) {
	opts := Options{Window: time.Minute, Generations: 3, ExpectedKeys: 3000, FalsePositiveRate: 0.01}
	now := time.Unix(1_700_000_000, 0)
	f := newTestFilter(t, opts, now)
	want := bbloom.New(uint(f.m), f.k)
	for i := uint64(0); i < 1000; i++ {
		f.Add(testKey(1, i), now)
		want.Add(testKey(1, i))
	}
	got := f.gens[f.slot(f.cur)].bf
	if !got.Equal(want) {
		t.Fatal("current generation differs from a bloom/v3 filter given the same keys")
	}
}

func TestGenerationOf(t *testing.T) {
	f := newTestFilter(t, Options{Window: 40, Generations: 4, ExpectedKeys: 10, FalsePositiveRate: 0.01}, time.Unix(0, 0))
	tests := []struct {
		t    time.Time
		want int64
	}{
		{time.Unix(0, 0), 0},
		{time.Unix(0, 9), 0},
		{time.Unix(0, 10), 1},
		{time.Unix(0, -1), -1},
		{time.Unix(0, -10), -1},
		{time.Unix(0, -11), -2},
		{time.Time{}, minGen},
		{time.Unix(0, math.MinInt64), math.MinInt64/10 - 1}, // floor, not truncation
		{time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), maxGen},
	}
	for _, tt := range tests {
		if got := f.generationOf(tt.t); got != max(min(tt.want, maxGen), minGen) {
			t.Errorf("generationOf(%v) = %d, want %d", tt.t, got, tt.want)
		}
	}
}

// TestNoFalseNegatives moves a fake clock in random steps (within a span,
// across spans, past the whole window) and checks that every key added less
// than W ago tests true, across every rotation.
func TestNoFalseNegatives(t *testing.T) {
	windows := []struct {
		w time.Duration
		g int
	}{
		{11, 3}, // span rounds up: 4ns
		{100, 4},
		{7*time.Second + 1, 3},
		{time.Hour, 1},
		{time.Hour, 8},
		{time.Minute, 64},
	}
	starts := []time.Time{
		time.Unix(1_700_000_000, 0),
		time.Unix(1_700_000_000, 123_456_789),
		time.Unix(-100, 5), // before 1970
		time.Unix(0, -3),
	}
	seeds := 2
	steps := 2000
	if testing.Short() {
		seeds, steps = 1, 800
	}
	type added struct {
		key       []byte
		firstSeen time.Time
	}
	for _, win := range windows {
		for si, start := range starts {
			for seed := int64(0); seed < int64(seeds); seed++ {
				name := fmt.Sprintf("W=%v,G=%d,start=%d,seed=%d", win.w, win.g, si, seed)
				t.Run(name, func(t *testing.T) {
					rng := rand.New(rand.NewSource(seed*1000 + int64(si)))
					opts := Options{Window: win.w, Generations: win.g, ExpectedKeys: 5000, FalsePositiveRate: 0.01}
					f := newTestFilter(t, opts, start)
					span := f.Span()
					now := start
					wantCur := floorDiv(start.UnixNano(), int64(span))
					var live []added
					var next uint64
					for step := 0; step < steps; step++ {
						switch r := rng.Float64(); {
						case r < 0.6:
							now = now.Add(time.Duration(rng.Int63n(int64(span)/3 + 1)))
						case r < 0.8:
							now = now.Add(time.Duration(rng.Int63n(2*int64(span) + 1)))
						case r < 0.9:
							// Land just before or on the next generation boundary.
							g := f.generationOf(now)
							now = time.Unix(0, (g+1)*int64(span)-rng.Int63n(2))
						case r < 0.98:
							now = now.Add(win.w + time.Duration(rng.Int63n(2*int64(win.w))))
						default:
							// Stay put.
						}
						if rng.Float64() < 0.85 {
							f.Advance(now)
							wantCur = max(wantCur, floorDiv(now.UnixNano(), int64(span)))
							if rng.Float64() < 0.1 {
								// Backwards: a no-op.
								f.Advance(now.Add(-time.Duration(rng.Int63n(int64(win.w) + 1))))
							}
							for n := rng.Intn(4); n > 0; n-- {
								seen := now
								if rng.Float64() < 0.3 {
									seen = now.Add(-time.Duration(rng.Int63n(int64(win.w))))
								}
								k := testKey(2, next)
								next++
								f.Add(k, seen)
								live = append(live, added{k, seen})
							}
						}
						kept := live[:0]
						for _, a := range live {
							if now.Before(a.firstSeen.Add(win.w)) {
								kept = append(kept, a)
							}
						}
						live = kept
						for _, a := range live {
							if !f.Test(a.key) {
								t.Fatalf("step %d: key first seen %v ago (W=%v) tests false", step, now.Sub(a.firstSeen), win.w)
							}
						}
						checkRing(t, f, wantCur)
					}
				})
			}
		}
	}
}

// TestForgetBoundaries checks the exact retention of a lone key: kept until
// its generation leaves the ring, then gone (the ring is then empty, so the
// answer is certain).
func TestForgetBoundaries(t *testing.T) {
	opts := Options{Window: 4 * time.Second, Generations: 4, ExpectedKeys: 100, FalsePositiveRate: 0.01}
	t0 := time.Unix(1000, 0) // first nanosecond of generation 1000
	tests := []struct {
		name      string
		firstSeen time.Time
	}{
		{"first nanosecond of a generation", t0},
		{"middle of a generation", t0.Add(500 * time.Millisecond)},
		{"last nanosecond of a generation", t0.Add(time.Second - 1)},
	}
	drop := t0.Add(5 * time.Second) // (1000+G+1)*span
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newTestFilter(t, opts, tt.firstSeen)
			key := []byte("lone key")
			f.Add(key, tt.firstSeen)
			f.Advance(tt.firstSeen.Add(opts.Window - 1))
			if !f.Test(key) {
				t.Fatal("key tests false 1ns before firstSeen+W")
			}
			f.Advance(drop.Add(-1))
			if !f.Test(key) {
				t.Fatal("key tests false before its generation left the ring")
			}
			f.Advance(drop)
			if f.Test(key) {
				t.Fatal("key still tests true after its generation left the ring")
			}
			if f.Keys() != 0 || !allClear(f) {
				t.Fatalf("ring not empty after the only key was dropped: Keys=%d", f.Keys())
			}
		})
	}
}

// TestOldKeysForgotten adds a batch of keys, keeps adding fresh ones, and
// checks that once W+span has passed the old batch is gone (up to false
// positives, negligible at this size).
func TestOldKeysForgotten(t *testing.T) {
	opts := Options{Window: time.Hour, Generations: 4, ExpectedKeys: 100_000, FalsePositiveRate: 1e-6}
	t0 := time.Unix(1_700_000_000, 0)
	f := newTestFilter(t, opts, t0)
	const n = 10_000
	for i := uint64(0); i < n; i++ {
		f.Add(testKey(3, i), t0)
	}
	// Fresh keys every minute until W+span after t0.
	var fresh uint64
	end := t0.Add(opts.Window + f.Span())
	for now := t0; !now.After(end); now = now.Add(time.Minute) {
		f.Advance(now)
		if now.Before(t0.Add(opts.Window)) {
			for i := uint64(0); i < n; i += 1000 {
				if !f.Test(testKey(3, i)) {
					t.Fatalf("old key %d tests false %v after it was added, within W", i, now.Sub(t0))
				}
			}
		}
		for i := 0; i < 100; i++ {
			f.Add(testKey(4, fresh), now)
			fresh++
		}
	}
	remembered := 0
	for i := uint64(0); i < n; i++ {
		if f.Test(testKey(3, i)) {
			remembered++
		}
	}
	if frac := float64(remembered) / n; frac > 0.001 {
		t.Fatalf("%d of %d keys older than W+span still test true (%.4f); expected only false positives", remembered, n, frac)
	}
	if f.Keys() == 0 || f.Keys() > fresh {
		t.Fatalf("Keys() = %d, want the fresh keys still live (0 < Keys <= %d)", f.Keys(), fresh)
	}
}

func TestAddOutsideRing(t *testing.T) {
	opts := Options{Window: time.Hour, Generations: 4, ExpectedKeys: 1000, FalsePositiveRate: 0.01}
	now := time.Unix(1_700_000_000, 0)

	t.Run("older than the ring is ignored", func(t *testing.T) {
		f := newTestFilter(t, opts, now)
		f.Add([]byte("old"), now.Add(-2*opts.Window))
		f.Add([]byte("zero"), time.Time{})
		if f.Test([]byte("old")) || f.Test([]byte("zero")) || f.Keys() != 0 || !allClear(f) {
			t.Fatal("a key older than the ring was added")
		}
	})

	t.Run("future goes into the newest generation", func(t *testing.T) {
		f := newTestFilter(t, opts, now)
		key := []byte("future")
		f.Add(key, now.Add(10*opts.Window))
		if !f.Test(key) {
			t.Fatal("future key tests false right after Add")
		}
		if got := f.gens[f.slot(f.cur)].adds; got != 1 {
			t.Fatalf("newest generation has %d adds, want 1", got)
		}
		f.Advance(now.Add(opts.Window - 1))
		if !f.Test(key) {
			t.Fatal("future key forgotten within W of the Advance time it was added at")
		}
		f.Advance(now.Add(opts.Window + f.Span()))
		if f.Test(key) {
			t.Fatal("future key kept after W+span (documented limitation changed?)")
		}
	})
}

func TestAdvance(t *testing.T) {
	opts := Options{Window: 4 * time.Second, Generations: 4, ExpectedKeys: 1000, FalsePositiveRate: 0.01}
	t0 := time.Unix(1000, 0)

	t.Run("never moves backwards", func(t *testing.T) {
		f := newTestFilter(t, opts, t0)
		f.Add([]byte("a"), t0)
		f.Advance(t0.Add(-time.Hour))
		checkRing(t, f, 1000)
		f.Advance(t0.Add(2 * time.Second))
		checkRing(t, f, 1002)
		f.Advance(t0)
		checkRing(t, f, 1002)
		if !f.Test([]byte("a")) {
			t.Fatal("key lost")
		}
	})

	t.Run("step by step drops one generation each", func(t *testing.T) {
		f := newTestFilter(t, opts, t0)
		for i := 0; i <= 4; i++ {
			at := t0.Add(time.Duration(i) * time.Second)
			f.Advance(at)
			f.Add(testKey(5, uint64(i)), at)
		}
		for i := 0; i <= 4; i++ {
			f.Advance(t0.Add(time.Duration(5+i) * time.Second))
			checkRing(t, f, int64(1005+i))
			// Few keys in a filter sized for 1000: a false positive here
			// is about 1e-14 likely, and the keys are fixed.
			if f.Test(testKey(5, uint64(i))) {
				t.Fatalf("key of generation %d survived its drop", 1000+i)
			}
			if got, want := f.Keys(), uint64(4-i); got != want {
				t.Fatalf("Keys() = %d after dropping generation %d, want %d", got, 1000+i, want)
			}
		}
	})

	t.Run("jump past the ring clears all and reuses arrays", func(t *testing.T) {
		f := newTestFilter(t, opts, t0)
		before := make(map[*uint64]bool)
		for _, g := range f.gens {
			before[&g.bf.BitSet().Words()[0]] = true
		}
		for i := uint64(0); i < 500; i++ {
			f.Add(testKey(6, i), t0)
		}
		f.Advance(t0.Add(5 * time.Second))
		checkRing(t, f, 1005)
		if f.Keys() != 0 || !allClear(f) {
			t.Fatal("jump of G+1 spans left bits behind")
		}
		f.Add(testKey(6, 0), t0.Add(5*time.Second))
		f.Advance(t0.Add(1000 * time.Hour))
		checkRing(t, f, 1000+3_600_000)
		if f.Keys() != 0 || !allClear(f) {
			t.Fatal("jump of many windows left bits behind")
		}
		for _, g := range f.gens {
			if !before[&g.bf.BitSet().Words()[0]] {
				t.Fatal("a bit array was reallocated")
			}
		}
	})
}

// TestFalsePositiveRate fills every generation of the ring to its sized
// load, the worst case the sizing plans for, and measures the rate on keys
// never added.
func TestFalsePositiveRate(t *testing.T) {
	tests := []struct {
		opts   Options
		probes uint64
	}{
		{Options{Window: time.Hour, Generations: 4, ExpectedKeys: 200_000, FalsePositiveRate: 0.01}, 200_000},
		// 1.5x the target is more than 5 standard deviations away in
		// every case.
		{Options{Window: time.Hour, Generations: 2, ExpectedKeys: 50_000, FalsePositiveRate: 0.05}, 50_000},
		{Options{Window: time.Hour, Generations: 8, ExpectedKeys: 50_000, FalsePositiveRate: 0.001}, 100_000},
	}
	for _, tt := range tests {
		opts, probes := tt.opts, tt.probes
		t.Run(fmt.Sprintf("G=%d,p=%g", opts.Generations, opts.FalsePositiveRate), func(t *testing.T) {
			t0 := time.Unix(1_700_006_400, 0) // aligned to every span above
			f := newTestFilter(t, opts, t0)
			sz, _ := opts.Sizing()
			total := sz.KeysPerGeneration * uint(opts.Generations+1)
			step := (time.Duration(opts.Generations+1) * sz.Span) / time.Duration(total)
			for i := uint(0); i < total; i++ {
				now := t0.Add(time.Duration(i) * step)
				f.Advance(now)
				f.Add(testKey(7, uint64(i)), now)
			}
			if got := f.Keys(); got != uint64(total) {
				t.Fatalf("Keys() = %d, want all %d keys live", got, total)
			}
			fp := 0
			for i := uint64(0); i < probes; i++ {
				if f.Test(testKey(8, i)) {
					fp++
				}
			}
			observed := float64(fp) / float64(probes)
			est := f.EstimatedFalsePositiveRate()
			t.Logf("target %g, observed %g, estimated %g, bits/key %.2f", opts.FalsePositiveRate, observed, est, f.BitsPerKey())
			if observed > 1.5*opts.FalsePositiveRate {
				t.Errorf("observed false-positive rate %g > 1.5 x target %g", observed, opts.FalsePositiveRate)
			}
			if est > 1.5*opts.FalsePositiveRate || est < opts.FalsePositiveRate/2 {
				t.Errorf("estimated rate %g at the sized load, want near target %g", est, opts.FalsePositiveRate)
			}
			if ratio := observed / est; ratio < 0.5 || ratio > 2 {
				t.Errorf("observed %g and estimated %g differ by a factor %.2f", observed, est, ratio)
			}
		})
	}
}

func TestEstimatedFalsePositiveRateEmpty(t *testing.T) {
	f := newTestFilter(t, DefaultOptions(time.Hour), time.Unix(0, 0))
	if got := f.EstimatedFalsePositiveRate(); got != 0 {
		t.Fatalf("EstimatedFalsePositiveRate() of an empty filter = %g, want 0", got)
	}
	if f.Test([]byte("anything")) {
		t.Fatal("empty filter answers maybe")
	}
}

func TestMemory(t *testing.T) {
	tests := []Options{
		DefaultOptions(time.Hour),
		{Window: time.Minute, Generations: 1, ExpectedKeys: 1, FalsePositiveRate: 0.5},
		{Window: time.Minute, Generations: 7, ExpectedKeys: 123_457, FalsePositiveRate: 0.003},
		{Window: time.Minute, Generations: 64, ExpectedKeys: 10_000_000, FalsePositiveRate: 0.01},
	}
	for _, opts := range tests {
		t.Run(fmt.Sprintf("G=%d,n=%d,p=%g", opts.Generations, opts.ExpectedKeys, opts.FalsePositiveRate), func(t *testing.T) {
			f := newTestFilter(t, opts, time.Unix(0, 0))
			g := uint(opts.Generations)
			m, _ := bbloom.EstimateParameters((opts.ExpectedKeys+g-1)/g, 1-math.Pow(1-opts.FalsePositiveRate, 1/float64(g+1)))
			var held uint64
			for _, gen := range f.gens {
				held += 8 * uint64(len(gen.bf.BitSet().Words()))
			}
			if got := f.MemoryBytes(); got != held {
				t.Errorf("MemoryBytes() = %d, bit arrays hold %d bytes", got, held)
			}
			ideal := float64(m) * float64(g+1) / 8
			if got := float64(f.MemoryBytes()); got < ideal || got >= ideal+8*float64(g+1) {
				t.Errorf("MemoryBytes() = %.0f, want m*(G+1)/8 = %.0f rounded up to words", got, ideal)
			}
			if got, want := f.BitsPerKey(), float64(m)*float64(g+1)/float64(opts.ExpectedKeys); math.Abs(got-want) > 1e-9*want {
				t.Errorf("BitsPerKey() = %g, want %g", got, want)
			}
			if f.Window() != opts.Window || f.Options() != opts {
				t.Errorf("Window() = %v, Options() = %+v, want %v, %+v", f.Window(), f.Options(), opts.Window, opts)
			}
		})
	}
}

// TestConcurrent runs writers, readers, Advance and WriteSnapshot together
// (meant for -race) and checks no writer's key is lost.
func TestConcurrent(t *testing.T) {
	opts := Options{Window: time.Hour, Generations: 4, ExpectedKeys: 100_000, FalsePositiveRate: 0.01}
	t0 := time.Unix(1_700_000_000, 0)
	f := newTestFilter(t, opts, t0)
	const writers, perWriter = 4, 2000
	var wg sync.WaitGroup
	errs := make(chan error, writers+1)
	stop := make(chan struct{})
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := uint64(0); i < perWriter; i++ {
				k := testKey(byte(10+w), i)
				f.Add(k, t0)
				if !f.Test(k) {
					errs <- fmt.Errorf("writer %d key %d tests false right after Add", w, i)
					return
				}
			}
		}(w)
	}
	var side sync.WaitGroup
	side.Add(1)
	go func() {
		defer side.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Stay within W of t0 so no writer's key may expire.
			f.Advance(t0.Add(time.Duration(i%50) * time.Minute))
			if _, err := f.WriteSnapshot(io.Discard, uint64(i)); err != nil {
				errs <- err
				return
			}
			_ = f.Keys()
			_ = f.EstimatedFalsePositiveRate()
		}
	}()
	wg.Wait()
	close(stop)
	side.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for w := 0; w < writers; w++ {
		for i := uint64(0); i < perWriter; i++ {
			if !f.Test(testKey(byte(10+w), i)) {
				t.Fatalf("writer %d key %d lost", w, i)
			}
		}
	}
	if got := f.Keys(); got != writers*perWriter {
		t.Fatalf("Keys() = %d, want %d", got, writers*perWriter)
	}
}

// TestSince: every key added at or after Since answers "maybe", and Since
// moves with Advance.
func TestSince(t *testing.T) {
	opts := DefaultOptions(time.Hour)
	opts.ExpectedKeys = 1000
	f, err := New(opts, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if !f.Since().Before(time.Unix(0, 0)) {
		t.Fatalf("a filter that never advanced: Since %v, want before 1970", f.Since())
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Advance(t0)
	f.Add([]byte("a"), t0)
	span := f.Span()
	if s := f.Since(); s.After(t0.Add(-time.Hour)) || s.Before(t0.Add(-time.Hour-span)) {
		t.Fatalf("Since %v after Advance(%v), want within one span before %v", s, t0, t0.Add(-time.Hour))
	}
	later := t0.Add(time.Hour + 2*span)
	f.Advance(later)
	if s := f.Since(); !s.After(t0) {
		t.Fatalf("Since %v after Advance(%v), want after %v (the key added at %v is gone)", s, later, t0, t0)
	}
	if f.Test([]byte("a")) {
		t.Fatalf("key first seen at %v still answers maybe at %v", t0, later)
	}
}
