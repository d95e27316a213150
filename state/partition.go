package state

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/dedupe-stage/dedupe-stage/bloom"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// SnapshotFile is the name of a partition's filter snapshot inside its
// directory.
const SnapshotFile = "filter.snap"

// FilterSource tells how a partition's filter was built by Open.
type FilterSource string

// How a partition's filter was built.
const (
	// SourceDisabled: Options.DisableFilter is set; there is no filter.
	SourceDisabled FilterSource = "disabled"
	// SourceSnapshot: loaded from the snapshot, and the store held no
	// record written after it.
	SourceSnapshot FilterSource = "snapshot"
	// SourceSnapshotTopUp: loaded from the snapshot, then topped up with
	// the records written after the Badger version the snapshot covers.
	SourceSnapshotTopUp FilterSource = "snapshot+topup"
	// SourceRebuild: the snapshot was missing, corrupt or mismatched, so the
	// filter was rebuilt from a full scan of the partition.
	SourceRebuild FilterSource = "rebuild"
)

// FilterBuild describes how Open built a partition's filter.
type FilterBuild struct {
	// Source is how the filter was built.
	Source FilterSource
	// Reason says why the snapshot was not used when Source is
	// SourceRebuild; it is empty otherwise.
	Reason string
	// SnapshotVersion is the Badger version the loaded snapshot covered (0
	// unless Source is SourceSnapshot or SourceSnapshotTopUp).
	SnapshotVersion uint64
	// Scanned is how many records the top-up or the full scan read.
	Scanned uint64
	// Added is how many of them were unexpired and added to the filter.
	Added uint64
	// Elapsed is how long the build took (snapshot load included).
	Elapsed time.Duration
}

// Claim asks to record a key as seen.
type Claim struct {
	// Key is the dedupe key, 1..MaxKeySize bytes.
	Key []byte
	// Fingerprint identifies the payload; it is stored with a new record.
	Fingerprint uint64
	// Total, when Total.Group is set, is added to its (group, bucket) total
	// if the claim is New, in the same transaction that records the key.
	Total Contribution
}

// ClaimResult is the outcome of one Claim.
type ClaimResult struct {
	// New is true when this claim recorded the key: the key had no
	// unexpired record and no earlier claim in the same batch had it.
	New bool
	// Existing is the record that made the claim a repeat; zero when New.
	Existing Record
	// Total is the absolute total of the claim's (group, bucket) after its
	// contribution, when New and the claim carried one; 0 otherwise.
	Total int64
}

// LookupResult is the outcome of a Lookup.
type LookupResult struct {
	// Found is true when the partition holds an unexpired record of the key.
	Found bool
	// Record is the record when Found.
	Record Record
	// FilterSaidMaybe is true when the filter answered "maybe seen". It is
	// always false with Options.DisableFilter (there is no filter).
	FilterSaidMaybe bool
	// StoreRead is true when Badger was read: the filter said maybe, or
	// there is no filter.
	StoreRead bool
}

// Stats are counters since Open. Lookup counters count Lookup calls only;
// Claim's own reads are in ClaimStoreReads.
type Stats struct {
	// Lookups is the number of Lookup calls on an open store with a valid key.
	Lookups uint64
	// FilterNegatives is the number of lookups the filter answered
	// "definitely not seen"; they did not read Badger.
	FilterNegatives uint64
	// FilterPositives is the number of lookups the filter answered "maybe".
	FilterPositives uint64
	// StoreReads is the number of lookups that read Badger.
	StoreReads uint64
	// FalsePositives is the number of lookups where the filter said maybe
	// and the store had no unexpired record.
	FalsePositives uint64
	// Claims is the number of claims in successful Claim calls.
	Claims uint64
	// ClaimsNew is how many of them were New.
	ClaimsNew uint64
	// ClaimStoreReads is the number of Badger reads Claim made (claims the
	// filter could not prove new).
	ClaimStoreReads uint64
	// FilterBytes is the memory held by the filters.
	FilterBytes uint64
	// FilterKeys is the number of keys added to the filters and not yet
	// dropped with their generation.
	FilterKeys uint64
	// FilterEstimatedFP is the filters' estimated false-positive rate; for a
	// store, the mean over its partitions.
	FilterEstimatedFP float64
}

// Partition is one partition of a Store: its own Badger instance in its own
// directory, and its own filter. It is safe for concurrent use; Lookup,
// Claim and snapshots are serialised by a per-partition mutex, which is
// uncontended when one goroutine owns the partition.
type Partition struct {
	index int
	dir   string
	db    *badger.DB
	log   *slog.Logger
	clock window.Clock
	win   window.Window
	ttl   time.Duration
	fopts bloom.Options // the partition's filter options

	minFree int64 // Options.MinFreeBytes; 0 = not checked

	mu     sync.Mutex // held across Lookup, Claim and the snapshot's capture
	filter *bloom.Filter
	closed bool
	build  FilterBuild

	snapMu sync.Mutex // serialises snapshot file writes
	// snapVersion is the Badger version the snapshot file on disk covers,
	// valid when snapOnDisk; guarded by snapMu.
	snapVersion uint64
	snapOnDisk  bool

	totalsBucket time.Duration // Options.TotalsBucket; 0 = totals off
	totalsKeep   time.Duration // Options.TotalsKeep
	// dirty holds the Badger keys of the totals changed since the last
	// TakeDirtyTotals; guarded by mu.
	dirty map[string]struct{}

	lookups, filterNeg, filterPos, storeReads, falsePos atomic.Uint64
	claims, claimsNew, claimStoreReads                  atomic.Uint64
}

// Index returns the partition's number, 0..Partitions-1.
func (p *Partition) Index() int { return p.index }

// FilterOptions returns the options the partition's filter was built with;
// false when Options.DisableFilter is set (there is no filter).
func (p *Partition) FilterOptions() (bloom.Options, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.filter == nil {
		return bloom.Options{}, false
	}
	return p.filter.Options(), true
}

// Dir returns the partition's directory.
func (p *Partition) Dir() string { return p.dir }

// FilterBuild tells how Open built the partition's filter.
func (p *Partition) FilterBuild() FilterBuild {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.build
}

// Lookup reports whether the partition holds an unexpired record of key.
// It advances the filter to the clock's now and tests it: "definitely not"
// returns Found=false without reading Badger; "maybe" reads Badger. A
// record with window.Inside(FirstSeen, now) false is not Found even while
// Badger still holds it. Lookup on a closed store returns ErrClosed; a
// record that cannot be decoded returns an error wrapping ErrCorruptRecord.
func (p *Partition) Lookup(key []byte) (LookupResult, error) {
	if err := checkKey(key); err != nil {
		return LookupResult{}, p.wrap(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return LookupResult{}, ErrClosed
	}
	p.lookups.Add(1)
	now := p.clock.Now()
	var res LookupResult
	if p.filter != nil {
		p.filter.Advance(now)
		if !p.filter.Test(key) {
			p.filterNeg.Add(1)
			return res, nil
		}
		p.filterPos.Add(1)
		res.FilterSaidMaybe = true
	}
	res.StoreRead = true
	p.storeReads.Add(1)
	rec, ok, err := p.get(key)
	if err != nil {
		return res, p.wrap(err)
	}
	if ok && p.win.Inside(rec.FirstSeen, now) {
		res.Found, res.Record = true, rec
		return res, nil
	}
	if p.filter != nil {
		p.falsePos.Add(1)
	}
	return res, nil
}

// get reads key's record from Badger, whatever its logical expiry.
func (p *Partition) get(key []byte) (rec Record, found bool, err error) {
	err = p.db.View(func(txn *badger.Txn) error {
		rec, found, err = readRecord(txn, key)
		return err
	})
	return rec, found, err
}

// readRecord reads key's record in txn.
func readRecord(txn *badger.Txn, key []byte) (Record, bool, error) {
	item, err := txn.Get(recordKey(key))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read key %q: %w", key, err)
	}
	var rec Record
	err = item.Value(func(v []byte) error {
		var derr error
		rec, derr = decodeRecord(v)
		return derr
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("key %q: %w", key, err)
	}
	return rec, true, nil
}

// find reads key's record for Store.Find.
func (p *Partition) find(key []byte) (Record, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return Record{}, false, ErrClosed
	}
	rec, ok, err := p.get(key)
	if err != nil {
		return Record{}, false, p.wrap(err)
	}
	return rec, ok, nil
}

// Claim records the keys of claims that are not yet seen, in one Badger
// transaction, and returns one result per claim in order.
//
// A claim is a repeat (New=false, Existing set) when the partition holds an
// unexpired record of its key, or when an earlier claim in the same batch
// has the same key (then Existing is the record that claim found or wrote):
// copies inside one batch resolve to exactly one New. Otherwise the claim is
// New and its record is written with FirstSeen = the clock's now and a
// Badger TTL of W + W/Generations + 1s, so physical expiry lags logical
// expiry (Badger's TTL runs on the wall clock, from the time of the write,
// in whole seconds). Keys the
// filter proves new skip the Badger read. After the commit succeeds the new
// keys are added to the filter.
//
// When the file system holding the partition has less than
// Options.MinFreeBytes available, Claim writes nothing and returns an error
// wrapping ErrDiskFull.
//
// With Options.SyncWrites the commit is fsynced before Claim returns. A
// batch too big for one Badger transaction is split into several commits,
// each holding whole claims; if a later commit fails, the earlier ones stay
// committed (and in the filter) and Claim returns the error: a retry of the
// batch then sees those keys as repeats of the records already written.
func (p *Partition) Claim(claims []Claim) ([]ClaimResult, error) {
	for i := range claims {
		if err := checkKey(claims[i].Key); err != nil {
			return nil, p.wrap(fmt.Errorf("claim %d: %w", i, err))
		}
		if err := checkContribution(claims[i].Total, p.totalsBucket); err != nil {
			return nil, p.wrap(fmt.Errorf("claim %d: %w", i, err))
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	now := p.clock.Now()
	if p.filter != nil {
		p.filter.Advance(now)
	}

	b := &batch{
		results: make([]ClaimResult, len(claims)),
		inBatch: make(map[string]Record, len(claims)),
	}
	rtxn := p.db.NewTransaction(false)
	defer rtxn.Discard()
	for i, c := range claims {
		if err := p.claim(rtxn, b, i, c, now); err != nil {
			return nil, p.wrap(err)
		}
	}
	if err := p.commit(b, now); err != nil {
		return nil, p.wrap(err)
	}
	p.claims.Add(uint64(len(claims)))
	p.claimsNew.Add(uint64(len(b.groups)))
	return b.results, nil
}

// batch collects the decisions and writes of one Claim call.
type batch struct {
	results []ClaimResult
	// inBatch maps each key claimed so far in the batch to its record: the
	// one found in the store, or the one this batch writes.
	inBatch map[string]Record
	// groups hold the writes of each New claim. A group commits whole: it
	// never straddles two commits of a split batch.
	groups []group
	// totals maps the Badger key of each total the batch wrote to its new
	// absolute value.
	totals map[string]int64
}

// group is everything one New claim writes.
type group struct {
	key    []byte // the claim's key, added to the filter after commit
	writes []write
	total  string // Badger key of the total the claim added to, or ""
}

// write is one Badger write.
type write struct {
	key, value []byte
	ttl        time.Duration // 0 = no TTL
}

// claim decides claim i of batch b: it reads the store (through rtxn, a
// read transaction opened under the partition lock, so nothing else writes
// meanwhile) unless the filter proves the key new, fills b.results[i], and
// for a New claim appends its group of writes.
//
// Every write that belongs with a new key (for example the totals it adds)
// goes into the same group, so it commits in the same transaction as the
// key's record.
func (p *Partition) claim(rtxn *badger.Txn, b *batch, i int, c Claim, now time.Time) error {
	if rec, ok := b.inBatch[string(c.Key)]; ok {
		b.results[i] = ClaimResult{Existing: rec}
		return nil
	}
	if p.filter == nil || p.filter.Test(c.Key) {
		p.claimStoreReads.Add(1)
		rec, ok, err := readRecord(rtxn, c.Key)
		if err != nil {
			return fmt.Errorf("claim %d: %w", i, err)
		}
		if ok && p.win.Inside(rec.FirstSeen, now) {
			b.results[i] = ClaimResult{Existing: rec}
			b.inBatch[string(c.Key)] = rec
			return nil
		}
	}
	rec := Record{FirstSeen: now, Fingerprint: c.Fingerprint}
	b.results[i] = ClaimResult{New: true}
	b.inBatch[string(c.Key)] = rec
	g := group{
		key:    c.Key,
		writes: []write{{key: recordKey(c.Key), value: encodeRecord(rec), ttl: p.ttl}},
	}
	if c.Total.Group != "" {
		v, w, err := p.addTotal(rtxn, b, c.Total, now)
		if err != nil {
			return fmt.Errorf("claim %d: %w", i, err)
		}
		g.writes = append(g.writes, w)
		g.total = string(w.key)
		b.results[i].Total = v
	}
	b.groups = append(b.groups, g)
	return nil
}

// commit writes b's groups in as few transactions as Badger accepts and adds
// each committed group's key to the filter with FirstSeen now.
func (p *Partition) commit(b *batch, now time.Time) error {
	if len(b.groups) > 0 && p.minFree > 0 {
		if err := checkFreeSpace(p.dir, p.minFree); err != nil {
			return err
		}
	}
	for start := 0; start < len(b.groups); {
		end, err := p.commitFrom(b.groups, start)
		if err != nil {
			return err
		}
		if p.filter != nil {
			for _, g := range b.groups[start:end] {
				p.filter.Add(g.key, now)
			}
		}
		p.markDirty(b.groups[start:end])
		start = end
	}
	return nil
}

// commitFrom commits groups[start:end] in one transaction, with end as large
// as fits, and returns end.
func (p *Partition) commitFrom(groups []group, start int) (int, error) {
	txn := p.db.NewTransaction(true)
	defer func() { txn.Discard() }()
	end := start
	for ; end < len(groups); end++ {
		err := setGroup(txn, groups[end])
		if err == nil {
			continue
		}
		if !errors.Is(err, badger.ErrTxnTooBig) || end == start {
			return start, fmt.Errorf("write: %w", err)
		}
		// groups[end] is partly in txn: redo the whole groups in a fresh one.
		txn.Discard()
		txn = p.db.NewTransaction(true)
		for _, g := range groups[start:end] {
			if err := setGroup(txn, g); err != nil {
				return start, fmt.Errorf("write: %w", err)
			}
		}
		break
	}
	if err := txn.Commit(); err != nil {
		return start, fmt.Errorf("commit: %w", err)
	}
	return end, nil
}

func setGroup(txn *badger.Txn, g group) error {
	for _, w := range g.writes {
		e := badger.NewEntry(w.key, w.value)
		if w.ttl > 0 {
			e = e.WithTTL(w.ttl)
		}
		if err := txn.SetEntry(e); err != nil {
			return err
		}
	}
	return nil
}

// Stats returns the partition's counters and filter figures.
func (p *Partition) Stats() Stats {
	s := Stats{
		Lookups:         p.lookups.Load(),
		FilterNegatives: p.filterNeg.Load(),
		FilterPositives: p.filterPos.Load(),
		StoreReads:      p.storeReads.Load(),
		FalsePositives:  p.falsePos.Load(),
		Claims:          p.claims.Load(),
		ClaimsNew:       p.claimsNew.Load(),
		ClaimStoreReads: p.claimStoreReads.Load(),
	}
	if f := p.filter; f != nil {
		s.FilterBytes = f.MemoryBytes()
		s.FilterKeys = f.Keys()
		s.FilterEstimatedFP = f.EstimatedFalsePositiveRate()
	}
	return s
}

func (p *Partition) wrap(err error) error {
	return fmt.Errorf("state: partition %d: %w", p.index, err)
}

// buildFilter makes the filter answer "maybe" for every unexpired record in
// the partition: it loads the snapshot and tops it up with the records
// written after the version the snapshot covers, or rebuilds the filter
// from a full scan when the snapshot cannot be used.
func (p *Partition) buildFilter(ctx context.Context) error {
	start := time.Now()
	now := p.clock.Now()
	snapPath := filepath.Join(p.dir, SnapshotFile)
	f, meta, err := loadSnapshot(snapPath, p.fopts)
	if err == nil {
		if maxV := p.db.MaxVersion(); meta > maxV {
			err = fmt.Errorf("snapshot covers store version %d but the store ends at version %d (writes lost after the snapshot?)", meta, maxV)
		}
	}
	if err == nil {
		f.Advance(now)
		err = snapshotHolds(p.db, f, meta, p.win, now)
	}
	var b FilterBuild
	if err == nil {
		b = FilterBuild{Source: SourceSnapshot, SnapshotVersion: meta}
		if b.Scanned, b.Added, err = scanInto(ctx, p.db, f, meta, p.win, now, p.log); err != nil {
			return fmt.Errorf("top up filter from version %d: %w", meta, err)
		}
		if b.Scanned > 0 {
			b.Source = SourceSnapshotTopUp
		} else {
			p.snapMu.Lock()
			p.snapVersion, p.snapOnDisk = meta, true
			p.snapMu.Unlock()
		}
	} else {
		if errors.Is(err, fs.ErrNotExist) && p.db.MaxVersion() == 0 {
			p.log.Debug("state: new partition, starting with an empty filter", "path", snapPath)
		} else {
			p.log.Warn("state: filter snapshot unusable, rebuilding the filter from the store", "path", snapPath, "err", err)
		}
		b = FilterBuild{Source: SourceRebuild, Reason: err.Error()}
		if f, err = bloom.New(p.fopts, now); err != nil {
			return fmt.Errorf("new filter: %w", err)
		}
		if b.Scanned, b.Added, err = scanInto(ctx, p.db, f, 0, p.win, now, p.log); err != nil {
			return fmt.Errorf("rebuild filter: %w", err)
		}
	}
	b.Elapsed = time.Since(start)
	p.mu.Lock()
	p.filter, p.build = f, b
	p.mu.Unlock()
	p.log.Info("state: filter ready", "source", string(b.Source), "snapshot_version", b.SnapshotVersion,
		"scanned", b.Scanned, "added", b.Added, "elapsed", b.Elapsed)
	return nil
}

// loadSnapshot reads the filter snapshot at path.
func loadSnapshot(path string, opts bloom.Options) (*bloom.Filter, uint64, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer fh.Close()
	return bloom.ReadSnapshot(bufio.NewReaderSize(fh, 1<<20), opts)
}

// scanInto adds to f every record written after version since (0 = all)
// that is inside the window at now. A record that cannot be decoded is
// added as if first seen now (the filter must not say "definitely not" for
// a key the store holds) and logged. It returns how many records it read
// and how many it added.
func scanInto(ctx context.Context, db *badger.DB, f *bloom.Filter, since uint64, win window.Window, now time.Time, log *slog.Logger) (scanned, added uint64, err error) {
	txn := db.NewTransaction(false)
	defer txn.Discard()
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{prefixRecord}, SinceTs: since})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		if scanned%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return scanned, added, err
			}
		}
		scanned++
		item := it.Item()
		key := item.Key()[1:]
		var rec Record
		err := item.Value(func(v []byte) error {
			var derr error
			rec, derr = decodeRecord(v)
			return derr
		})
		if err != nil {
			log.Warn("state: unreadable record kept in the filter", "key", fmt.Sprintf("%q", key), "err", err)
			f.Add(key, now)
			added++
			continue
		}
		if win.Inside(rec.FirstSeen, now) {
			f.Add(key, rec.FirstSeen)
			added++
		}
	}
	return scanned, added, nil
}

// snapshot writes the filter to the partition's snapshot file atomically.
// The filter and the Badger version it covers are captured together under
// the partition lock, so every record with a version up to meta is in the
// snapshot. With closing, the partition is marked closed in the same lock
// hold, so no Claim can slip in after the capture.
func (p *Partition) snapshot(closing bool) error {
	p.snapMu.Lock()
	defer p.snapMu.Unlock()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = closing
	if p.filter == nil {
		p.mu.Unlock()
		return nil
	}
	meta := p.db.MaxVersion()
	if p.snapOnDisk && meta == p.snapVersion {
		// Nothing written since: the file on disk still covers the store
		// (the filter has at most rotated, which loading redoes).
		p.mu.Unlock()
		return nil
	}
	var buf bytes.Buffer
	_, err := p.filter.WriteSnapshot(&buf, meta)
	p.mu.Unlock()
	if err != nil {
		return p.wrap(fmt.Errorf("encode filter snapshot: %w", err))
	}
	if err := writeFileAtomic(filepath.Join(p.dir, SnapshotFile), buf.Bytes()); err != nil {
		return p.wrap(err)
	}
	p.snapVersion, p.snapOnDisk = meta, true
	return nil
}

// close writes the snapshot, then closes Badger.
func (p *Partition) close() error {
	serr := p.snapshot(true)
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	if err := p.db.Close(); err != nil {
		return errors.Join(serr, p.wrap(fmt.Errorf("close badger: %w", err)))
	}
	return serr
}

// runGC runs value-log GC until Badger has nothing to rewrite.
func (p *Partition) runGC(ctx context.Context) {
	for ctx.Err() == nil {
		err := p.db.RunValueLogGC(0.5)
		if err == nil {
			continue
		}
		if !errors.Is(err, badger.ErrNoRewrite) && !errors.Is(err, badger.ErrRejected) {
			p.log.Warn("state: value-log GC failed", "err", err)
		}
		return
	}
}

// writeFileAtomic replaces path with data: it writes path+".tmp", fsyncs
// it, renames it over path and fsyncs the directory.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}
