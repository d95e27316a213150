package bloom

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	bbloom "github.com/bits-and-blooms/bloom/v3"
)

func TestDefaultOptions(t *testing.T) {
	o := DefaultOptions(time.Hour)
	want := Options{Window: time.Hour, Generations: 4, ExpectedKeys: 1_000_000, FalsePositiveRate: 0.01}
	if o != want {
		t.Fatalf("DefaultOptions(1h) = %+v, want %+v", o, want)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("DefaultOptions(1h).Validate() = %v", err)
	}
}

func TestValidate(t *testing.T) {
	def := DefaultOptions(time.Hour)
	with := func(change func(*Options)) Options {
		o := def
		change(&o)
		return o
	}
	tests := []struct {
		name string
		opts Options
		// want is a substring of the error; empty means valid.
		want []string
	}{
		{"default", def, nil},
		{"one generation", with(func(o *Options) { o.Generations = 1 }), nil},
		{"max generations", with(func(o *Options) { o.Generations = MaxGenerations }), nil},
		{"one nanosecond window one generation", with(func(o *Options) { o.Window = 1; o.Generations = 1 }), nil},
		{"window shorter than generations", with(func(o *Options) { o.Window = 3; o.Generations = 4 }), nil},
		{"one key", with(func(o *Options) { o.ExpectedKeys = 1 }), nil},
		{"tiny fp", with(func(o *Options) { o.FalsePositiveRate = 1e-15 }), nil},
		{"fp near one", with(func(o *Options) { o.FalsePositiveRate = 0.999 }), nil},
		{"zero window", with(func(o *Options) { o.Window = 0 }), []string{"Window", "0s"}},
		{"negative window", with(func(o *Options) { o.Window = -time.Second }), []string{"Window", "-1s"}},
		{"zero generations", with(func(o *Options) { o.Generations = 0 }), []string{"Generations", "0"}},
		{"too many generations", with(func(o *Options) { o.Generations = 65 }), []string{"Generations", "65"}},
		{"negative generations", with(func(o *Options) { o.Generations = -1 }), []string{"Generations", "-1"}},
		{"zero keys", with(func(o *Options) { o.ExpectedKeys = 0 }), []string{"ExpectedKeys", "0"}},
		{"zero fp", with(func(o *Options) { o.FalsePositiveRate = 0 }), []string{"FalsePositiveRate", "0"}},
		{"fp one", with(func(o *Options) { o.FalsePositiveRate = 1 }), []string{"FalsePositiveRate", "1"}},
		{"negative fp", with(func(o *Options) { o.FalsePositiveRate = -0.1 }), []string{"FalsePositiveRate", "-0.1"}},
		{"NaN fp", with(func(o *Options) { o.FalsePositiveRate = math.NaN() }), []string{"FalsePositiveRate", "NaN"}},
		{"fp needs too many hashes", with(func(o *Options) { o.FalsePositiveRate = 1e-30 }), []string{"FalsePositiveRate", "1e-30", "hashes"}},
		{"too much memory", with(func(o *Options) { o.ExpectedKeys = 1 << 40 }), []string{"ExpectedKeys", "1099511627776", "bytes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.opts.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate(%+v) = %v, want nil", tt.opts, err)
				}
				return
			}
			if !errors.Is(err, ErrBadOptions) {
				t.Fatalf("Validate(%+v) = %v, want an error wrapping ErrBadOptions", tt.opts, err)
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Validate(%+v) = %q, want it to mention %q", tt.opts, err, s)
				}
			}
			if _, err := New(tt.opts, time.Now()); !errors.Is(err, ErrBadOptions) {
				t.Errorf("New(%+v) error = %v, want ErrBadOptions", tt.opts, err)
			}
		})
	}
}

func TestSizing(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		span time.Duration
	}{
		{"default", DefaultOptions(time.Hour), 15 * time.Minute},
		{"uneven keys and window", Options{Window: 11, Generations: 3, ExpectedKeys: 1001, FalsePositiveRate: 0.001}, 4},
		{"one generation", Options{Window: time.Minute, Generations: 1, ExpectedKeys: 10, FalsePositiveRate: 0.5}, time.Minute},
		{"many generations", Options{Window: 64 * time.Second, Generations: 64, ExpectedKeys: 10_000_000, FalsePositiveRate: 1e-4}, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sz, err := tt.opts.Sizing()
			if err != nil {
				t.Fatal(err)
			}
			g := uint(tt.opts.Generations)
			if want := (tt.opts.ExpectedKeys + g - 1) / g; sz.KeysPerGeneration != want {
				t.Errorf("KeysPerGeneration = %d, want %d", sz.KeysPerGeneration, want)
			}
			// The union of G+1 generations at p_g meets p.
			union := 1 - math.Pow(1-sz.FalsePositiveRatePerGeneration, float64(g+1))
			if math.Abs(union-tt.opts.FalsePositiveRate) > 1e-9*tt.opts.FalsePositiveRate {
				t.Errorf("union of %d generations at p_g=%g is %g, want %g", g+1, sz.FalsePositiveRatePerGeneration, union, tt.opts.FalsePositiveRate)
			}
			m, k := bbloom.EstimateParameters(sz.KeysPerGeneration, sz.FalsePositiveRatePerGeneration)
			if sz.BitsPerGeneration != m || sz.Hashes != k {
				t.Errorf("m, k = %d, %d, want bloom.EstimateParameters = %d, %d", sz.BitsPerGeneration, sz.Hashes, m, k)
			}
			if sz.Span != tt.span {
				t.Errorf("Span = %v, want %v", sz.Span, tt.span)
			}
			if sz.Span*time.Duration(g) < tt.opts.Window {
				t.Errorf("G*Span = %v is shorter than Window %v", sz.Span*time.Duration(g), tt.opts.Window)
			}
			if want := uint64((m+63)/64) * 8 * uint64(g+1); sz.MemoryBytes != want {
				t.Errorf("MemoryBytes = %d, want %d", sz.MemoryBytes, want)
			}
		})
	}
}
