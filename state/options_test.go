package state

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	bbloom "github.com/bits-and-blooms/bloom/v3"
	"github.com/dgraph-io/badger/v4/options"

	"github.com/dedupe-stage/dedupe-stage/bloom"
	"github.com/dedupe-stage/dedupe-stage/window"
)

func TestOptionsValidate(t *testing.T) {
	w := window.Window{W: time.Hour, NearFraction: 0.8}
	tests := []struct {
		name   string
		change func(o *Options)
		want   string // "" = valid; else a substring of the error
	}{
		{"defaults", func(*Options) {}, ""},
		{"one partition", func(o *Options) { o.Partitions = 1 }, ""},
		{"max partitions", func(o *Options) { o.Partitions = MaxPartitions }, ""},
		{"nil clock and logger", func(o *Options) { o.Clock, o.Logger = nil, nil }, ""},
		{"filter window zero", func(o *Options) { o.Filter.Window = 0 }, ""},
		{"intervals zero", func(o *Options) { o.GCInterval, o.SnapshotInterval = 0, 0 }, ""},
		{"bad filter ignored when disabled", func(o *Options) { o.DisableFilter, o.Filter.Generations = true, 0 }, ""},
		{"empty dir", func(o *Options) { o.Dir = "" }, "Dir is empty"},
		{"zero partitions", func(o *Options) { o.Partitions = 0 }, "Partitions is 0"},
		{"too many partitions", func(o *Options) { o.Partitions = MaxPartitions + 1 }, "Partitions is 1025"},
		{"zero window", func(o *Options) { o.Window.W = 0 }, "Window.W is 0s"},
		{"negative window", func(o *Options) { o.Window.W = -time.Second }, "Window.W is -1s"},
		{"small budget", func(o *Options) { o.MemoryBudget = 1 << 20 }, "MemoryBudget is 1048576"},
		{"negative progress interval", func(o *Options) { o.FilterProgressInterval = -time.Second }, "FilterProgressInterval is -1s"},
		{"negative GC interval", func(o *Options) { o.GCInterval = -time.Second }, "GCInterval is -1s"},
		{"negative snapshot interval", func(o *Options) { o.SnapshotInterval = -time.Second }, "SnapshotInterval is -1s"},
		{"filter window differs", func(o *Options) { o.Filter.Window = 2 * time.Hour }, "Filter.Window is 2h0m0s"},
		{"filter generations", func(o *Options) { o.Filter.Generations = 0 }, "Generations 0"},
		{"filter rate", func(o *Options) { o.Filter.FalsePositiveRate = 1.5 }, "FalsePositiveRate 1.5"},
		{"filter keys", func(o *Options) { o.Filter.ExpectedKeys = 0 }, "Filter.ExpectedKeys is 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultOptions("/tmp/x", w)
			tt.change(&o)
			err := o.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want ErrBadOptions mentioning %q", err, tt.want)
			}
		})
	}
}

func TestPartitionFilterOptions(t *testing.T) {
	w := window.Window{W: time.Hour, NearFraction: 0.8}
	o := DefaultOptions("/tmp/x", w)
	o.Filter.Window = 0
	o.Partitions = 8
	o.Filter.ExpectedKeys = 1000
	if f := o.partitionFilterOptions(); f.ExpectedKeys != 125 || f.Window != time.Hour {
		t.Errorf("partition filter options = %+v, want 125 keys over 1h", f)
	}
	o.Filter.ExpectedKeys = 3
	if f := o.partitionFilterOptions(); f.ExpectedKeys != 1 {
		t.Errorf("partition filter keys = %d for 3 keys over 8 partitions, want 1", f.ExpectedKeys)
	}
}

// TestBadgerSizing checks that the memtables the store can hold at once
// fit the budget, whatever the partition count, down to the floor, and
// that the Badger instance Open builds is configured as BadgerSizing says.
func TestBadgerSizing(t *testing.T) {
	o := DefaultOptions(t.TempDir(), window.Window{W: time.Hour, NearFraction: 0.8})
	o.Filter.ExpectedKeys = 1000
	for _, tc := range []struct {
		budget     int64
		partitions int
	}{{DefaultMemoryBudget, DefaultPartitions}, {256 << 20, 8}, {1 << 30, 32}, {MinMemoryBudget, 1}} {
		o.MemoryBudget, o.Partitions = tc.budget, tc.partitions
		s := o.BadgerSizing()
		if s.Budget != tc.budget {
			t.Errorf("budget %d over %d partitions: sized for %d", tc.budget, tc.partitions, s.Budget)
		}
		if s.MemTableSize > minMemTableSize {
			if total := int64(s.MaxMemtables) * s.MemtableBytes; total > tc.budget {
				t.Errorf("budget %d over %d partitions: %d memtables of %d bytes in RAM hold %d, more than the budget",
					tc.budget, tc.partitions, s.MaxMemtables, s.MemtableBytes, total)
			}
		}
		// A memtable's arena is MemTableSize plus Badger's largest batch
		// (15%) plus that batch's nodes (15%); its log up to MemTableSize.
		if s.MemtableBytes < s.MemTableSize*23/10 {
			t.Errorf("MemtableBytes %d below 2.3 x MemTableSize %d", s.MemtableBytes, s.MemTableSize)
		}
	}
	o.MemoryBudget = MinMemoryBudget / 2 // below what Validate accepts
	if s := o.BadgerSizing(); s.MemTableSize != minMemTableSize {
		t.Errorf("sizing %+v with a tiny budget, want the 1 MiB memtable floor", s)
	}

	o.MemoryBudget, o.Partitions = 48<<20, 3
	want := o.BadgerSizing()
	st := openStore(t, o)
	for i := range st.Partitions() {
		if st.Partition(i).db != st.db {
			t.Fatalf("partition %d has a Badger instance of its own", i)
		}
	}
	{
		got := st.db.Opts()
		if got.MemTableSize != want.MemTableSize || got.NumMemtables != want.NumMemtables ||
			got.NumLevelZeroTables != want.NumLevelZeroTables || got.BaseTableSize != want.BaseTableSize ||
			got.TableSizeMultiplier != want.TableSizeMultiplier ||
			got.BlockSize != want.BlockSize || got.BloomFalsePositive != want.BloomFalsePositive ||
			got.BlockCacheSize != want.BlockCacheSize || got.IndexCacheSize != want.IndexCacheSize ||
			got.ValueThreshold != want.ValueThreshold || got.Compression != options.None {
			t.Errorf("Badger options %+v, BadgerSizing %+v", got, want)
		}
	}
}

// TestFilterSizing checks the sizing of the filters a store builds (moved
// here from config, which now asks the store's options for it): each
// partition's filter is sized for ExpectedKeys/Partitions keys spread over
// G generations, at a per-generation rate whose union over G+1 generations
// meets the target.
func TestFilterSizing(t *testing.T) {
	o := DefaultOptions("/tmp/x", window.Window{W: time.Hour, NearFraction: 0.8})
	o.Partitions = 1
	o.Filter = bloom.Options{ExpectedKeys: 1_000_000, FalsePositiveRate: 0.01, Generations: 4}
	sz, err := o.FilterSizing()
	if err != nil {
		t.Fatal(err)
	}
	if sz.KeysPerGeneration != 250_000 {
		t.Fatalf("keys per generation %d, want 250000", sz.KeysPerGeneration)
	}
	// The union of G+1 generations meets the target rate.
	if union := 1 - math.Pow(1-sz.FalsePositiveRatePerGeneration, 5); math.Abs(union-0.01) > 1e-12 {
		t.Fatalf("union false-positive rate %v, want 0.01", union)
	}
	m, k := bbloom.EstimateParameters(250_000, sz.FalsePositiveRatePerGeneration)
	if sz.BitsPerGeneration != m || sz.Hashes != k {
		t.Fatalf("m=%d k=%d, want bloom's m=%d k=%d", sz.BitsPerGeneration, sz.Hashes, m, k)
	}
	// All G+1 bit arrays, each in whole 64-bit words.
	if want := 5 * 8 * ((uint64(m) + 63) / 64); sz.MemoryBytes != want {
		t.Fatalf("total %d bytes, want %d", sz.MemoryBytes, want)
	}
	if bpk := float64(sz.BitsPerGeneration) / float64(sz.KeysPerGeneration); bpk < 12 || bpk > 14 {
		t.Fatalf("bits per key %v, want about 12.9 for p_g of about 0.002", bpk)
	}
	// ceil(N/G).
	o.Filter.ExpectedKeys = 10
	if sz, _ := o.FilterSizing(); sz.KeysPerGeneration != 3 {
		t.Fatalf("ceil(10/4) = %d, want 3", sz.KeysPerGeneration)
	}
	// Each partition's filter takes its share of the keys.
	o.Filter.ExpectedKeys, o.Partitions = 1_000_000, 8
	if sz, _ := o.FilterSizing(); sz.KeysPerGeneration != 31_250 {
		t.Fatalf("8 partitions: keys per generation %d, want 1000000/8/4 = 31250", sz.KeysPerGeneration)
	}
	o.Filter.FalsePositiveRate = 0
	if _, err := o.FilterSizing(); !errors.Is(err, bloom.ErrBadOptions) {
		t.Fatalf("FilterSizing with a zero false-positive rate = %v, want ErrBadOptions", err)
	}
}
