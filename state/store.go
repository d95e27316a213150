package state

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"

	"github.com/dedupe-stage/dedupe-stage/window"
)

// LayoutFile is the name of the file in Dir that records the partition
// count, as "partitions N\n", and how keys are placed and stored.
const LayoutFile = "LAYOUT"

// BadgerDir is the directory in Dir that holds the store's Badger
// instance, which every partition shares (each in a keyspace of its own).
const BadgerDir = "badger"

const (
	valueLogFileSize = 64 << 20 // modest value-log files
	numCompactors    = 2
)

// Store is a partitioned dedupe store: P partitions, each a keyspace of
// one shared Badger instance with its own windowed Bloom filter. It is safe
// for concurrent use.
type Store struct {
	opts  Options
	log   *slog.Logger
	db    *badger.DB
	parts []*Partition
	aside string // where a damaged store was moved (DamageRebuild); "" if none

	cancel    context.CancelFunc // stops the background goroutines
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// PartitionOf returns the partition of partitionKey among partitions:
// xxhash64(partitionKey) % partitions. partitions must be > 0.
func PartitionOf(partitionKey []byte, partitions int) int {
	return int(xxhash.Sum64(partitionKey) % uint64(partitions))
}

// PartitionDir returns the directory of partition i in dir: dir/p%03d. It
// holds the partition's filter snapshot.
func PartitionDir(dir string, i int) string {
	return filepath.Join(dir, fmt.Sprintf("p%03d", i))
}

// Open opens (creating if needed) the store in opts.Dir, and returns once
// every partition's filter answers "maybe" for every unexpired key
// (docs/state.md). Its errors wrap ErrBadOptions, ErrLayout, ErrLocked,
// ErrDiskFull or ErrDamaged (a *DamageError, with Options.OnDamage
// DamageRefuse), or name the directory it cannot write; cancelling ctx
// aborts a filter build, and ctx is not used after Open returns. With
// DamageRebuild, a damaged store is moved aside and Open returns an empty
// one (MovedAside says where the damaged one went).
func Open(ctx context.Context, opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Clock == nil {
		opts.Clock = window.SystemClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.FilterProgressInterval == 0 {
		opts.FilterProgressInterval = DefaultFilterProgressInterval
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("state: data dir %q is not usable: %w", opts.Dir, err)
	}
	have, err := checkLayout(opts.Dir, layout{partitions: opts.Partitions, how: opts.Partitioning})
	if err != nil {
		return nil, err
	}
	db, aside, err := openOrRebuild(opts)
	if err != nil {
		return nil, err
	}
	if err := migrate(ctx, opts, db, have); err != nil {
		db.Close()
		return nil, err
	}

	s := &Store{opts: opts, log: opts.Logger, db: db, parts: make([]*Partition, opts.Partitions), aside: aside}
	popts := opts
	popts.OnFilterProgress = newOpenProgress(opts).report
	errs := make([]error, opts.Partitions)
	sem := make(chan struct{}, max(2, runtime.GOMAXPROCS(0)))
	var wg sync.WaitGroup
	for i := range s.parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := ctx.Err(); err != nil {
				errs[i] = fmt.Errorf("state: partition %d: %w", i, err)
				return
			}
			s.parts[i], errs[i] = openPartition(ctx, popts, db, i)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		db.Close()
		return nil, err
	}
	fresh := 0
	for _, p := range s.parts {
		p.onProgress = opts.OnFilterProgress // the store's line is for Open only
		if p.FilterBuild().Fresh {
			fresh++
		}
	}
	if fresh > 0 {
		s.log.Info("state: new partitions start with empty filters (no snapshot, empty store: expected on a new data dir)",
			"new", fresh, "partitions", len(s.parts))
	}

	bg, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if opts.GCInterval > 0 {
		s.every(bg, opts.GCInterval, s.runGC)
	}
	if opts.SnapshotInterval > 0 && !opts.DisableFilter {
		s.every(bg, opts.SnapshotInterval, func(context.Context) {
			if err := s.Snapshot(); err != nil {
				s.log.Warn("state: periodic filter snapshot failed", "err", err)
			}
		})
	}
	return s, nil
}

// openProgress reports the filter builds of all partitions while Open
// runs. Partitions build a few at a time, and each logs its own progress
// only once its own scan has run for FilterProgressInterval, so a rebuild
// of many partitions that each scan quickly would run without a line: this
// logs one for the store when a partition's build ends, at most one per
// FilterProgressInterval (the first after one interval of Open).
type openProgress struct {
	log   *slog.Logger
	user  func(FilterProgress)
	every time.Duration
	start time.Time

	mu      sync.Mutex
	last    time.Time
	total   int
	done    int
	scanned []uint64 // per partition, as last reported
}

func newOpenProgress(opts Options) *openProgress {
	now := time.Now()
	return &openProgress{log: opts.Logger, user: opts.OnFilterProgress, every: opts.FilterProgressInterval,
		start: now, last: now, total: opts.Partitions, scanned: make([]uint64, opts.Partitions)}
}

// report is the Options.OnFilterProgress of every partition during Open:
// it passes fp on to the caller's, and logs the store's progress.
func (op *openProgress) report(fp FilterProgress) {
	op.mu.Lock()
	op.scanned[fp.Partition] = fp.Scanned
	if fp.Done {
		op.done++
		if now := time.Now(); now.Sub(op.last) >= op.every {
			op.last = now
			var scanned uint64
			for _, n := range op.scanned {
				scanned += n
			}
			elapsed := now.Sub(op.start)
			op.log.Info("state: opening partitions", "filters_built", op.done, "partitions", op.total,
				"records_scanned", scanned, "rate_per_second", int64(float64(scanned)/max(elapsed.Seconds(), 1e-9)),
				"elapsed", elapsed.Round(time.Millisecond))
		}
	}
	op.mu.Unlock()
	if op.user != nil {
		op.user(fp)
	}
}

// every runs fn every d until ctx is done.
func (s *Store) every(ctx context.Context, d time.Duration, fn func(context.Context)) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				fn(ctx)
			}
		}
	}()
}

// MovedAside returns the directory Open moved a damaged store into
// (Options.OnDamage DamageRebuild), or "" when the store opened was not
// damaged.
func (s *Store) MovedAside() string { return s.aside }

// openBadger opens the store's Badger instance in Dir/BadgerDir, after
// removing the empty log files a kill can leave and checking free space.
// A damaged store (a missing MANIFEST; a file Badger finds damaged,
// tables' checksums included) is a *DamageError; a lock held, a full disk
// or a file it cannot read or write are not.
func openBadger(opts Options) (db *badger.DB, err error) {
	dir := filepath.Join(opts.Dir, BadgerDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("state: dir %q is not usable: %w", dir, err)
	}
	removed, err := removeEmptyLogFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("state: dir %q is not usable: %w", dir, err)
	}
	if len(removed) > 0 {
		opts.Logger.Warn("state: removed empty Badger log files left by a crash", "dir", dir, "files", removed)
	}
	if opts.MinFreeBytes > 0 {
		// Badger writes while it opens; on a full file system that is a SIGBUS.
		if err := checkFreeSpace(dir, opts.MinFreeBytes); err != nil {
			return nil, fmt.Errorf("state: %w", err)
		}
	}
	if err := checkBadgerFiles(dir); err != nil {
		return nil, err
	}
	defer func() {
		// Some damage (a table's index that decodes to nonsense) makes
		// Badger panic while it opens, in this goroutine.
		if r := recover(); r != nil {
			db, err = nil, &DamageError{Dir: dir, Err: fmt.Errorf("badger panicked while opening it: %v", r)}
		}
	}()
	db, err = badger.Open(badgerOptions(opts, dir, opts.Logger))
	if err != nil {
		if strings.Contains(err.Error(), "Cannot acquire directory lock") {
			return nil, fmt.Errorf("%w: dir %q: %v", ErrLocked, dir, err)
		}
		if de := classifyOpenError(dir, err); de != err {
			return nil, de
		}
		return nil, fmt.Errorf("state: open badger in %q: %w", dir, err)
	}
	return db, nil
}

// openPartition makes partition i of db and builds its filter.
func openPartition(ctx context.Context, opts Options, db *badger.DB, i int) (*Partition, error) {
	dir := PartitionDir(opts.Dir, i)
	log := opts.Logger.With("partition", i)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("state: partition %d: dir %q is not usable: %w", i, dir, err)
	}
	p := &Partition{
		index:      i,
		partitions: opts.Partitions,
		dir:        dir,
		db:         db,
		ks:         keyspaceOf(i),
		log:        log,
		clock:      opts.Clock,
		win:        opts.Window,

		refresh: opts.RefreshOnRepeat,
		fopts:   opts.partitionFilterOptions(),
		build:   FilterBuild{Source: SourceDisabled},

		minFree: opts.MinFreeBytes,

		progressEvery: opts.FilterProgressInterval,
		onProgress:    opts.OnFilterProgress,

		totalsBucket: opts.TotalsBucket,
		totalsKeep:   opts.TotalsKeep,
	}
	if !opts.DisableFilter {
		if err := p.buildFilter(ctx); err != nil {
			return nil, p.wrap(err)
		}
	}
	return p, nil
}

// badgerOptions returns the options of the store's Badger: the sizes
// and choices of Options.BadgerSizing (see BadgerSizing for why each),
// every table's block checksums verified when the table is opened (at
// Open, and after each flush and compaction), so that a damaged table is
// found before the store judges with it (Badger's default verifies none),
// two compactors, 64 MiB value-log files (values stay in the LSM tree, so
// the value log stays nearly empty), no conflict detection (the partition
// locks serialise writers of a keyspace), no expvar metrics, and Badger's warnings and
// errors routed to log.
func badgerOptions(opts Options, dir string, log *slog.Logger) badger.Options {
	sz := opts.BadgerSizing()
	o := badger.DefaultOptions(dir).
		WithSyncWrites(opts.SyncWrites).
		WithMemTableSize(sz.MemTableSize).
		WithNumMemtables(sz.NumMemtables).
		WithNumLevelZeroTables(sz.NumLevelZeroTables).
		WithBaseTableSize(sz.BaseTableSize).
		WithBlockSize(sz.BlockSize).
		WithBloomFalsePositive(sz.BloomFalsePositive).
		WithCompression(options.None).
		WithBlockCacheSize(sz.BlockCacheSize).
		WithIndexCacheSize(sz.IndexCacheSize).
		WithValueThreshold(sz.ValueThreshold).
		WithNumCompactors(numCompactors).
		WithValueLogFileSize(valueLogFileSize).
		WithDetectConflicts(false).
		WithMetricsEnabled(false).
		WithChecksumVerificationMode(opts.tableChecksums()).
		WithLogger(badgerLogger{log})
	o.TableSizeMultiplier = sz.TableSizeMultiplier
	return o
}

// badgerLogger routes Badger's warnings and errors to slog and drops its
// info and debug lines.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any) {
	b.l.Error("badger: " + strings.TrimSpace(fmt.Sprintf(f, a...)))
}

func (b badgerLogger) Warningf(f string, a ...any) {
	b.l.Warn("badger: " + strings.TrimSpace(fmt.Sprintf(f, a...)))
}

func (badgerLogger) Infof(string, ...any)  {}
func (badgerLogger) Debugf(string, ...any) {}

var partitionDirRE = regexp.MustCompile(`^p[0-9]{3,}$`)

// checkLayout compares Dir/LAYOUT with want (the partition count and how
// keys are placed), or writes it on first open, and returns what it holds.
// Without LAYOUT, partition directories already in dir must number exactly
// want.partitions; a dir without either is new, and its LAYOUT records the
// shared store at once.
func checkLayout(dir string, want layout) (layout, error) {
	have, write, err := compareLayout(dir, want)
	if err != nil || !write {
		return have, err
	}
	if err := writeFileAtomic(filepath.Join(dir, LayoutFile), formatLayout(have)); err != nil {
		return have, fmt.Errorf("state: data dir %q is not usable: %w", dir, err)
	}
	return have, nil
}

// compareLayout is checkLayout without writing: write says that LAYOUT is
// missing and have is what it is to record.
func compareLayout(dir string, want layout) (have layout, write bool, err error) {
	path := filepath.Join(dir, LayoutFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		have, perr := parseLayout(b)
		if perr != nil {
			return have, false, fmt.Errorf("%w: %s: %v", ErrLayout, path, perr)
		}
		if have.partitions != want.partitions {
			return have, false, fmt.Errorf("%w: the data dir was made with %d partitions (%s), and %d were asked for", ErrLayout, have.partitions, path, want.partitions)
		}
		if have.how.hash() != want.how.hash() || have.how.Group != want.how.Group {
			return have, false, fmt.Errorf("%w: the data dir's keys were placed in partitions by %s (%s), and %s was asked for: "+
				"partition i of one is not partition i of the other", ErrLayout, have.how, path, want.how)
		}
		return have, false, nil
	case errors.Is(err, fs.ErrNotExist):
		entries, err := os.ReadDir(dir)
		if err != nil {
			return want, false, fmt.Errorf("state: data dir %q is not usable: %w", dir, err)
		}
		found := 0
		for _, e := range entries {
			if e.IsDir() && partitionDirRE.MatchString(e.Name()) {
				found++
			}
		}
		if found > 0 && found != want.partitions {
			return want, false, fmt.Errorf("%w: %s is missing and %q holds %d partition dirs, and %d partitions were asked for",
				ErrLayout, path, dir, found, want.partitions)
		}
		if found > 0 && want.how.hash() != HashXXHash64 {
			return want, false, fmt.Errorf("%w: %s is missing and %q holds partition dirs written without a record of how keys were placed (%s was asked for)",
				ErrLayout, path, dir, want.how)
		}
		want.shared = found == 0
		return want, true, nil
	default:
		return want, false, fmt.Errorf("state: data dir %q is not usable: %w", dir, err)
	}
}

// Partitions returns the number of partitions P.
func (s *Store) Partitions() int { return len(s.parts) }

// Partition returns partition i. It panics if i is outside 0..P-1.
func (s *Store) Partition(i int) *Partition { return s.parts[i] }

// Window returns the store's dedupe window.
func (s *Store) Window() window.Window { return s.opts.Window }

// Find looks for key's record in every partition, in order, and returns the
// first one found with its partition. found reports whether Badger still
// holds a record, whatever its logical expiry: judge it with
// Window().Inside(rec.WindowStart(), now). It bypasses the filters and does
// not count in Stats. It is meant for inspection.
func (s *Store) Find(key []byte) (rec Record, partition int, found bool, err error) {
	if err := checkKey(key); err != nil {
		return Record{}, 0, false, fmt.Errorf("state: %w", err)
	}
	for _, p := range s.parts {
		rec, ok, err := p.find(key)
		if err != nil {
			return Record{}, p.index, false, err
		}
		if ok {
			return rec, p.index, true, nil
		}
	}
	return Record{}, 0, false, nil
}

// Stats returns the counters and filter figures summed over the partitions
// (FilterEstimatedFP is their mean).
func (s *Store) Stats() Stats {
	var t Stats
	for _, p := range s.parts {
		ps := p.Stats()
		t.Lookups += ps.Lookups
		t.FilterNegatives += ps.FilterNegatives
		t.FilterPositives += ps.FilterPositives
		t.StoreReads += ps.StoreReads
		t.FalsePositives += ps.FalsePositives
		t.FilterBypassed += ps.FilterBypassed
		t.Claims += ps.Claims
		t.ClaimsNew += ps.ClaimsNew
		t.ClaimStoreReads += ps.ClaimStoreReads
		t.FilterBytes += ps.FilterBytes
		t.FilterKeys += ps.FilterKeys
		t.FilterEstimatedFP += ps.FilterEstimatedFP
	}
	if len(s.parts) > 0 {
		t.FilterEstimatedFP /= float64(len(s.parts))
	}
	return t
}

// Snapshot writes every partition's filter snapshot now (atomically: temp
// file, fsync, rename, fsync of the directory). It is a no-op with
// DisableFilter and on a closed store. Open also takes snapshots every
// SnapshotInterval, and Close takes a last one.
func (s *Store) Snapshot() error {
	var errs []error
	for _, p := range s.parts {
		if err := p.snapshot(false); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Close stops the GC and snapshot goroutines, writes each partition's
// filter snapshot and closes the Badger instance. Calls after the first
// return the first call's result. Claims and lookups after Close return
// ErrClosed; Stats keeps working.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		s.wg.Wait()
		errs := make([]error, len(s.parts))
		var wg sync.WaitGroup
		for i, p := range s.parts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = p.close()
			}()
		}
		wg.Wait()
		if err := s.db.Close(); err != nil {
			errs = append(errs, fmt.Errorf("state: close badger: %w", err))
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// runGC runs value-log GC until Badger has nothing to rewrite.
func (s *Store) runGC(ctx context.Context) {
	for ctx.Err() == nil {
		err := s.db.RunValueLogGC(0.5)
		if err == nil {
			continue
		}
		if !errors.Is(err, badger.ErrNoRewrite) && !errors.Is(err, badger.ErrRejected) {
			s.log.Warn("state: value-log GC failed", "err", err)
		}
		return
	}
}
