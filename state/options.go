package state

import (
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/dgraph-io/badger/v4/options"

	"github.com/dedupe-stage/dedupe-stage/bloom"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// Defaults and limits of Options.
const (
	// DefaultPartitions is the default number of partitions P.
	DefaultPartitions = 8
	// MaxPartitions is the largest allowed number of partitions.
	MaxPartitions = 1024
	// DefaultMemoryBudget is the default memory of the store's Badger
	// instance, shared by its partitions: 64 MiB.
	DefaultMemoryBudget = 64 << 20
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

	// Dir is the data directory. Every partition's records live in one
	// Badger instance in Dir/BadgerDir, each partition under a key prefix
	// of its own; partition i's filter snapshot lives in Dir/p%03d
	// (Dir/p000, Dir/p001, ...). Dir/LAYOUT records the partition count.
	// Required.
	Dir string
	// Partitions is the number of partitions P, 1..MaxPartitions. Default
	// DefaultPartitions. It must match Dir/LAYOUT once the store exists.
	Partitions int
	// Partitioning says how keys are placed in partitions; it is recorded
	// in Dir/LAYOUT and must match it once the store exists. Default: the
	// zero value, PartitionOf (xxhash64) inside one instance.
	Partitioning Partitioning

	// Time.

	// Window is the dedupe window; Window.W > 0 is required. A record
	// whose window starts at t makes a copy stored by the input at a time
	// before t+W a repeat (Lookup); Expire removes it once the partition's
	// input clock passes t+W.
	Window window.Window
	// Clock gives the time of a Lookup, Claim or forget that carries none
	// (tools and tests); the stage always passes the input's stored time,
	// so that no decision depends on its host's clock. Default
	// window.SystemClock{}.
	Clock window.Clock
	// RefreshOnRepeat makes a repeat move its key's window: Claim rewrites
	// the record with Refreshed = the claim's time, so the key stays a
	// repeat until that time + W (a sliding window). Default false: the
	// window ends at FirstSeen + W whatever comes after.
	RefreshOnRepeat bool

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

	// MemoryBudget is the memory in bytes of the store's Badger instance,
	// which every partition shares. It goes to memtables: it bounds them
	// in memory, arenas and write-ahead-log pages both. Tables stay on
	// disk, read in place through their memory maps: there is no block or
	// index cache, and no per-table Bloom filter. BadgerSizing derives
	// every Badger size from it and says why, and what Badger's table
	// builders add while it writes. A floor of 1 MiB per memtable
	// applies, so below 8 MiB the real use can exceed the budget. Default
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

	// OnDamage says what Open does with a damaged store (ErrDamaged): a
	// table whose checksums fail, a MANIFEST missing or unreadable, a table
	// it lists gone. DamageRefuse (the default; "" means it too) fails
	// with a *DamageError naming the file; DamageRebuild moves the damaged
	// store aside (Dir/damaged-<time>, never deleted) and opens an empty
	// one, which the stage restores from the output stream. A lock held,
	// a full disk or an unreadable file are not damage and always fail.
	OnDamage DamagePolicy

	// Logger receives the store's logs and Badger's warnings and errors.
	// Default slog.Default().
	Logger *slog.Logger

	// skipTableChecksums turns off the verification of tables' checksums
	// when they are opened: for the benchmark that measures its cost.
	skipTableChecksums bool
}

// tableChecksums returns Badger's checksum mode: every block of a table
// verified when the table is opened, unless skipTableChecksums.
func (o Options) tableChecksums() options.ChecksumVerificationMode {
	if o.skipTableChecksums {
		return options.NoVerification
	}
	return options.OnTableRead
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
	case o.OnDamage != "" && o.OnDamage != DamageRefuse && o.OnDamage != DamageRebuild:
		return fmt.Errorf("%w: OnDamage is %q, want %q or %q", ErrBadOptions, o.OnDamage, DamageRefuse, DamageRebuild)
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

// Fixed Badger settings of the store; BadgerSizing documents each.
const (
	badgerBlockSize           = 64 << 10
	badgerBaseTableSize       = 4 << 20
	badgerTableSizeMultiplier = 1
	badgerNumLevelZeroTables  = 2
	badgerNumMemtables        = 1
	badgerValueThreshold      = 1 << 10
	minMemTableSize           = 1 << 20
	// badgerCompactionBuilders is how many table builders one Badger
	// compaction runs at once before its splits (Badger 4.9.6, levels.go:
	// y.NewThrottle(8 + len(cd.splits))).
	badgerCompactionBuilders = 8
	// badgerAllocatorPool is how many table builders' buffers Badger keeps
	// for reuse between writes (Badger 4.9.6, db.go:
	// z.NewAllocatorPool(8)).
	badgerAllocatorPool = 8
)

// BadgerSizing is the configuration of the Badger instance every partition
// shares: the sizes derived from Options.MemoryBudget and the fixed choices
// that go with them. Open configures it and check-config prints it; the
// reasons and measurements behind each choice are in docs/state.md.
type BadgerSizing struct {
	// Budget is MemoryBudget: the bytes the store's memtables may hold,
	// shared by every partition.
	Budget int64
	// NumMemtables is Badger's NumMemtables: how many full memtables may
	// wait for their flush before writes wait. 1: claims arrive in
	// fsynced batches far slower than a flush writes a table, so one
	// waiting memtable absorbs a burst.
	NumMemtables int
	// MaxMemtables is how many memtables can be in memory at once:
	// NumMemtables waiting, plus the one taking writes and the one being
	// flushed (Badger's flush queue holds NumMemtables and the flusher has
	// taken one off it).
	MaxMemtables int
	// MemtableBytes is what one full memtable holds: its skiplist arena,
	// allocated in full when the memtable opens (MemTableSize plus 30% for
	// the largest write batch), and its write-ahead log, a memory-mapped
	// file whose written pages (up to MemTableSize) stay resident until
	// the memtable is flushed: 2.3 x MemTableSize.
	MemtableBytes int64
	// MemTableSize is Badger's MemTableSize: Budget / MaxMemtables / 2.3,
	// at least 1 MiB. It is also the size of an L0 table (a flushed
	// memtable) and bounds a write transaction to 15% of it (a larger
	// Claim batch commits in several transactions).
	MemTableSize int64
	// NumLevelZeroTables is Badger's NumLevelZeroTables: L0 tables are
	// compacted into the level below when there are this many. 2: without
	// per-table Bloom filters a read of a key searches every L0 table (its
	// keys are random, so every L0 table's range holds it) and one table
	// per deeper level; few L0 tables keep that short.
	NumLevelZeroTables int
	// BaseTableSize is Badger's BaseTableSize: 4 MiB, on every level
	// (TableSizeMultiplier 1). Each table builder holds twice this in the
	// Go heap, and while the store writes fast those buffers are most of
	// its memory; docs/state.md has the fills that chose it.
	BaseTableSize int64
	// TableSizeMultiplier is Badger's TableSizeMultiplier: 1, tables of
	// BaseTableSize on every level (see BaseTableSize).
	TableSizeMultiplier int
	// BuilderPool is the Go heap Badger's table builders keep on top of
	// Budget while the store writes: the buffers of its pool of 8, each
	// twice BaseTableSize. A compaction holds more for as long as it runs
	// (see BaseTableSize); right after fills of 10M and 50M keys as fast
	// as the disk allows, the builders held exactly this (bench --scale
	// --memprofile: 64 MiB of z.Calloc).
	BuilderPool int64
	// BlockSize is Badger's BlockSize: the uncompressed size of a table's
	// blocks. 64 KiB: a table's index holds one key per block and is read
	// in full when the table opens, so larger blocks make it smaller
	// (0.06 B per key instead of 1 B at Badger's 4 KiB); a read binary-
	// searches inside the block, in place.
	BlockSize int
	// BloomFalsePositive is Badger's BloomFalsePositive: 0, no per-table
	// Bloom filters. The partition's own filter already skips the store for
	// new keys; per-table ones would cost 1.2 B per key of index for about
	// 4 µs per repeat that reads the store (docs/state.md).
	BloomFalsePositive float64
	// BlockCacheSize is Badger's BlockCacheSize: 0. Badger needs a block
	// cache only for compressed or encrypted blocks; for plain blocks it
	// would hold copies of what the memory map already holds.
	BlockCacheSize int64
	// IndexCacheSize is Badger's IndexCacheSize: 0. Without encryption
	// Badger reads every table's index in place from its memory map
	// whatever this is; the index cache holds only decrypted indexes. The
	// index costs the pages of the map it covers (see BlockSize).
	IndexCacheSize int64
	// ValueThreshold is Badger's ValueThreshold: 1 KiB. Values (17 bytes,
	// a total's 8) are far below it, so they stay in the LSM tree next to
	// their keys: a read is one table search, never a value-log read, and
	// the value log stays empty.
	ValueThreshold int64
}

// BadgerSizing returns the Badger configuration of the store, as
// documented on BadgerSizing.
func (o Options) BadgerSizing() BadgerSizing {
	s := BadgerSizing{
		Budget:              o.MemoryBudget,
		NumMemtables:        badgerNumMemtables,
		MaxMemtables:        badgerNumMemtables + 2,
		NumLevelZeroTables:  badgerNumLevelZeroTables,
		BaseTableSize:       badgerBaseTableSize,
		TableSizeMultiplier: badgerTableSizeMultiplier,
		BuilderPool:         badgerAllocatorPool * 2 * badgerBaseTableSize,
		BlockSize:           badgerBlockSize,
		ValueThreshold:      badgerValueThreshold,
	}
	s.MemTableSize = max(s.Budget/int64(s.MaxMemtables)*10/23, minMemTableSize)
	s.MemtableBytes = s.MemTableSize * 23 / 10
	return s
}

// BuildersNote describes, in one line, the Go heap Badger's table
// builders take on top of Budget while the store writes (see BuilderPool
// and BaseTableSize), as check-config prints it.
func (s BadgerSizing) BuildersNote() string {
	return fmt.Sprintf("%s kept in a pool of %d buffers of %s (twice a %s table); a compaction in flight holds up to %d plus one per key range it splits into, on each of %d compactors",
		humanBytes(s.BuilderPool), badgerAllocatorPool, humanBytes(2*s.BaseTableSize), humanBytes(s.BaseTableSize), badgerCompactionBuilders, numCompactors)
}

// String describes the sizing in one line, as check-config prints it.
func (s BadgerSizing) String() string {
	return fmt.Sprintf("one instance, %s for all partitions: up to %d memtables of %s (%s each in RAM with arena and log); "+
		"tables read in place: %s blocks, uncompressed, no per-table Bloom filter, no block or index cache, %d L0 tables, %s tables on every level",
		humanBytes(s.Budget), s.MaxMemtables, humanBytes(s.MemTableSize), humanBytes(s.MemtableBytes),
		humanBytes(s.BlockSize), s.NumLevelZeroTables, humanBytes(s.BaseTableSize))
}

// humanBytes formats n in binary units, e.g. "8 MiB", "1.16 MiB".
func humanBytes[T int | int64](n T) string {
	v, unit := float64(n), "B"
	for _, u := range []string{"KiB", "MiB", "GiB"} {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f %s", v, unit)
	}
	return fmt.Sprintf("%.2f %s", v, unit)
}
