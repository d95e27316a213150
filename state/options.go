package state

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/dedupe-stage/dedupe-stage/bloom"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// Defaults and limits of Options.
const (
	// DefaultPartitions is the default number of partitions P.
	DefaultPartitions = 8
	// MaxPartitions is the largest allowed number of partitions.
	MaxPartitions = 1024
	// DefaultMemoryBudget is the default total memory for all Badger
	// instances of a store: 256 MiB.
	DefaultMemoryBudget = 256 << 20
	// MinMemoryBudget is the smallest accepted MemoryBudget: 4 MiB.
	MinMemoryBudget = 4 << 20
	// DefaultGCInterval is the default period of value-log GC.
	DefaultGCInterval = 10 * time.Minute
	// DefaultSnapshotInterval is the default period of filter snapshots.
	DefaultSnapshotInterval = time.Minute
	// DefaultFilterProgressInterval is the default FilterProgressInterval.
	DefaultFilterProgressInterval = 5 * time.Second
	// DefaultMinFreeBytes is the default MinFreeBytes: 64 MiB.
	DefaultMinFreeBytes = 64 << 20
	// MaxTotalsBucket is the longest accepted TotalsBucket: 366 days.
	MaxTotalsBucket = 366 * 24 * time.Hour
)

// Options configure a Store. Build them with DefaultOptions and change what
// differs; the zero value is not valid (Dir and Window are required).
type Options struct {
	// Layout.

	// Dir is the data directory. Partition i lives in Dir/p%03d (Dir/p000,
	// Dir/p001, ...), each its own Badger directory and the unit of
	// ownership. Dir/LAYOUT records the partition count. Required.
	Dir string
	// Partitions is the number of partitions P, 1..MaxPartitions. Default
	// DefaultPartitions. It must match Dir/LAYOUT once the store exists.
	Partitions int
	// Partitioning says how keys are placed in partitions; it is recorded
	// in Dir/LAYOUT and must match it once the store exists. Default: the
	// zero value, PartitionOf (xxhash64) inside one instance.
	Partitioning Partitioning

	// Time.

	// Window is the dedupe window; Window.W > 0 is required. A record first
	// seen at t is logically expired from t+W on (judged by Clock).
	Window window.Window
	// Clock decides logical expiry and the first-seen time of new records.
	// Default window.SystemClock{}.
	Clock window.Clock

	// Pre-check filter.

	// Filter configures each partition's windowed Bloom filter. Filter.Window
	// zero means Window.W; otherwise it must equal Window.W. ExpectedKeys is
	// the number of new keys the WHOLE store records per window W (> 0):
	// each partition's filter is sized for ExpectedKeys/Partitions (at
	// least 1), spread over its generations, so keys arriving faster than
	// that raise the false-positive rate (never the miss rate). Default
	// bloom.DefaultOptions(W).
	Filter bloom.Options
	// DisableFilter turns the pre-check off: every Lookup reads Badger and
	// Claim reads Badger for every key. No filter is built, loaded or
	// snapshotted. For benchmarks and comparison. Default false.
	DisableFilter bool

	// FilterProgressInterval is how often a filter build at Open (a
	// rebuild from a full scan, or a snapshot's top-up) that is still
	// running logs its progress at info (records scanned, rate, estimated
	// time left) and calls OnFilterProgress. 0 means
	// DefaultFilterProgressInterval.
	FilterProgressInterval time.Duration
	// OnFilterProgress, if set, receives each progress report of a filter
	// build at Open, and a last one (Done) when the build's scan ends, also
	// when it read nothing. Partitions build in parallel, so it is called
	// from several goroutines at once. Default nil.
	OnFilterProgress func(FilterProgress)

	// Badger.

	// MemoryBudget is the total memory in bytes for ALL Badger instances
	// (memtables, block cache and index cache), split evenly over the
	// partitions. With B = MemoryBudget/Partitions per partition: half of B
	// goes to memtables (NumMemtables 2, each MemTableSize = B/4 * 10/13,
	// because a memtable's arena is 1.3x MemTableSize), a quarter to the
	// block cache and a quarter to the index cache. Floors of 1 MiB per
	// memtable and per cache apply, so with a small budget and many
	// partitions the real use can exceed the budget. Default
	// DefaultMemoryBudget; at least MinMemoryBudget.
	MemoryBudget int64
	// SyncWrites makes each Claim commit fsync before Claim returns (group
	// commit: one fsync per Claim batch, or per split of it). Default true.
	SyncWrites bool
	// GCInterval is the period of value-log GC (RunValueLogGC(0.5) until it
	// has nothing to rewrite) over every partition. 0 disables it. Default
	// DefaultGCInterval.
	GCInterval time.Duration
	// SnapshotInterval is the period of filter snapshots (Dir/p%03d/
	// filter.snap). 0 means a snapshot only at Close. Default
	// DefaultSnapshotInterval.
	SnapshotInterval time.Duration
	// MinFreeBytes is the space that must stay available on the file system
	// holding a partition (statfs f_bavail, on Linux and macOS; elsewhere it
	// is not checked): while less is available, Claim writes nothing and
	// returns an error wrapping ErrDiskFull, so that the caller can report
	// it and retry, and Open fails the same way. Badger writes its log and
	// tables through memory-mapped files, and a write into a full file
	// system kills the process with SIGBUS instead of returning an error;
	// the reserve keeps Badger's memtable flushes and compactions clear of
	// that. 0 disables the check. Default DefaultMinFreeBytes.
	MinFreeBytes int64

	// Totals.

	// TotalsBucket is the length of a totals bucket: a whole number of
	// seconds, at most MaxTotalsBucket. 0 (default) means totals are off,
	// and a Claim carrying a Contribution fails with ErrBadTotal.
	TotalsBucket time.Duration
	// TotalsKeep is how long a total is kept after its bucket closes (the
	// bucket's end + W): a total's Badger TTL runs to bucket end + W +
	// TotalsKeep, and is never shorter than a record's. ScanTotals finds
	// only totals still kept. Default DefaultTotalsKeep.
	TotalsKeep time.Duration

	// Logger receives the store's logs and Badger's warnings and errors.
	// Default slog.Default().
	Logger *slog.Logger
}

// DefaultOptions returns the default options for a store in dir with window
// w: DefaultPartitions partitions, the system clock,
// bloom.DefaultOptions(w.W), a DefaultMemoryBudget, synced writes, GC every
// DefaultGCInterval and a filter snapshot every DefaultSnapshotInterval.
func DefaultOptions(dir string, w window.Window) Options {
	return Options{
		Dir:              dir,
		Partitions:       DefaultPartitions,
		Window:           w,
		Clock:            window.SystemClock{},
		Filter:           bloom.DefaultOptions(w.W),
		MemoryBudget:     DefaultMemoryBudget,
		SyncWrites:       true,
		GCInterval:       DefaultGCInterval,
		SnapshotInterval: DefaultSnapshotInterval,
		MinFreeBytes:     DefaultMinFreeBytes,

		FilterProgressInterval: DefaultFilterProgressInterval,
		TotalsKeep:             DefaultTotalsKeep,
		Logger:                 slog.Default(),
	}
}

// Validate reports the first invalid field, naming the field and its value.
// The error wraps ErrBadOptions. Nil Clock and Logger are accepted (Open
// uses the defaults); a zero Filter.Window is accepted (Open uses Window.W).
func (o Options) Validate() error {
	switch {
	case o.Dir == "":
		return fmt.Errorf("%w: Dir is empty", ErrBadOptions)
	case o.Partitions < 1 || o.Partitions > MaxPartitions:
		return fmt.Errorf("%w: Partitions is %d, want 1..%d", ErrBadOptions, o.Partitions, MaxPartitions)
	case o.Window.W <= 0:
		return fmt.Errorf("%w: Window.W is %v, want > 0", ErrBadOptions, o.Window.W)
	case o.MemoryBudget < MinMemoryBudget:
		return fmt.Errorf("%w: MemoryBudget is %d, want >= %d", ErrBadOptions, o.MemoryBudget, MinMemoryBudget)
	case o.GCInterval < 0:
		return fmt.Errorf("%w: GCInterval is %v, want >= 0", ErrBadOptions, o.GCInterval)
	case o.SnapshotInterval < 0:
		return fmt.Errorf("%w: SnapshotInterval is %v, want >= 0", ErrBadOptions, o.SnapshotInterval)
	case o.FilterProgressInterval < 0:
		return fmt.Errorf("%w: FilterProgressInterval is %v, want >= 0 (0 means the default)", ErrBadOptions, o.FilterProgressInterval)
	case o.MinFreeBytes < 0:
		return fmt.Errorf("%w: MinFreeBytes is %d, want >= 0 (0 disables the check)", ErrBadOptions, o.MinFreeBytes)
	case o.TotalsBucket < 0 || o.TotalsBucket > MaxTotalsBucket || o.TotalsBucket%time.Second != 0:
		return fmt.Errorf("%w: TotalsBucket is %v, want 0 (off) or a whole number of seconds up to %v", ErrBadOptions, o.TotalsBucket, MaxTotalsBucket)
	case o.TotalsKeep < 0:
		return fmt.Errorf("%w: TotalsKeep is %v, want >= 0", ErrBadOptions, o.TotalsKeep)
	}
	if err := o.Partitioning.validate(); err != nil {
		return fmt.Errorf("%w: Partitioning: %w", ErrBadOptions, err)
	}
	if o.DisableFilter {
		return nil
	}
	if o.Filter.Window != 0 && o.Filter.Window != o.Window.W {
		return fmt.Errorf("%w: Filter.Window is %v, want 0 or Window.W (%v)", ErrBadOptions, o.Filter.Window, o.Window.W)
	}
	if o.Filter.ExpectedKeys == 0 {
		return fmt.Errorf("%w: Filter.ExpectedKeys is 0, want > 0", ErrBadOptions)
	}
	if err := o.partitionFilterOptions().Validate(); err != nil {
		return fmt.Errorf("%w: Filter: %w", ErrBadOptions, err)
	}
	return nil
}

// FilterSizing is the sizing of each partition's filter, the same for every
// partition: bloom's sizing of the store's window and ExpectedKeys/Partitions
// (at least 1) keys. The whole store holds Partitions of them. The error
// wraps bloom.ErrBadOptions when the filter options cannot build a filter.
// It is what Open builds; callers that describe a store (check-config) call
// it instead of sizing the filter themselves.
func (o Options) FilterSizing() (bloom.Sizing, error) {
	return o.partitionFilterOptions().Sizing()
}

// partitionFilterOptions returns the filter options of one partition: the
// store's window and ExpectedKeys/Partitions (at least 1).
func (o Options) partitionFilterOptions() bloom.Options {
	f := o.Filter
	if f.Window == 0 {
		f.Window = o.Window.W
	}
	if o.Partitions > 0 {
		f.ExpectedKeys /= uint(o.Partitions)
	}
	if f.ExpectedKeys < 1 {
		f.ExpectedKeys = 1
	}
	return f
}

// recordTTL is the Badger TTL of a record: W plus one filter span (W/G,
// rounded up) plus one second (Badger keeps expiry in whole seconds and
// truncates), so physical expiry lags logical expiry. It saturates instead
// of overflowing.
func (o Options) recordTTL() time.Duration {
	g := time.Duration(max(o.Filter.Generations, 1))
	span := o.Window.W / g
	if o.Window.W%g != 0 {
		span++
	}
	if o.Window.W > maxDuration-span-time.Second {
		return maxDuration
	}
	return o.Window.W + span + time.Second
}

const maxDuration = time.Duration(1<<63 - 1)

// badgerSizes is the per-partition split of MemoryBudget.
type badgerSizes struct {
	MemTableSize   int64
	NumMemtables   int
	BlockCacheSize int64
	IndexCacheSize int64
}

const minBadgerPart = 1 << 20

// badgerSizes splits MemoryBudget over the partitions as documented on
// Options.MemoryBudget.
func (o Options) badgerSizes() badgerSizes {
	per := o.MemoryBudget / int64(o.Partitions)
	s := badgerSizes{
		NumMemtables:   2,
		MemTableSize:   per / 4 * 10 / 13,
		BlockCacheSize: per / 4,
		IndexCacheSize: per / 4,
	}
	s.MemTableSize = max(s.MemTableSize, minBadgerPart)
	s.BlockCacheSize = max(s.BlockCacheSize, minBadgerPart)
	s.IndexCacheSize = max(s.IndexCacheSize, minBadgerPart)
	return s
}
