package state

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/dedupe-stage/dedupe-stage/bloom"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// LookupResult is the outcome of a Lookup.
type LookupResult struct {
	// Found is true when the partition holds an unexpired record of the key.
	Found bool
	// Record is the record when Found, and the record whose window ended
	// when Ended is set.
	Record Record
	// FilterSaidMaybe is true when the filter answered "maybe seen". It is
	// always false with Options.DisableFilter (there is no filter).
	FilterSaidMaybe bool
	// StoreRead is true when Badger was read: the filter said maybe, or
	// there is no filter.
	StoreRead bool
	// Forgotten is when an operator forgot the key (Partition.Forget), when
	// its forgotten record is still inside the window; zero otherwise. The
	// key is then not Found, and its next forward needs an id of its own
	// (the output's duplicate window may still hold the first).
	Forgotten time.Time
	// Ended is when the window of the key's record ended, when the
	// partition still holds that record but the copy came at or after its
	// end (or after its forget): the key is not Found, and its next
	// forward needs an id of its own, as after a forget (the output's
	// duplicate window runs on the wall clock and may still hold the
	// key's last forward, which can be seconds old when a backlog is
	// judged). Zero otherwise.
	Ended time.Time
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
	// FilterBypassed is the number of lookups and claims of a copy too old
	// for the filter (its time minus W is before the filter's oldest
	// generation, bloom.Filter.Since): they read the store without asking
	// the filter. Copies redelivered long after newer ones were judged
	// take this path.
	FilterBypassed uint64
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

// Partition is one partition of a Store: its own keyspace in the store's
// Badger instance, its own directory for its filter snapshot, and its own
// filter. It is safe for concurrent use; Lookup,
// Claim and snapshots are serialised by a per-partition mutex, which is
// uncontended when one goroutine owns the partition.
type Partition struct {
	index      int
	partitions int // the store's partition count
	dir        string
	db         *badger.DB // the store's, shared by every partition
	ks         keyspace   // the prefix of every Badger key of the partition
	log        *slog.Logger
	clock      window.Clock // the time of a call that carries none (Options.Clock)
	win        window.Window
	fopts      bloom.Options // the partition's filter options

	refresh bool // Options.RefreshOnRepeat

	minFree int64 // Options.MinFreeBytes; 0 = not checked

	progressEvery time.Duration        // Options.FilterProgressInterval
	onProgress    func(FilterProgress) // Options.OnFilterProgress; may be nil

	mu     sync.Mutex // held across Lookup, Claim and the snapshot's capture
	filter *bloom.Filter
	closed bool
	build  FilterBuild
	// unreadable holds the keys of records a filter build could not
	// decode: they always read the store. Guarded by mu.
	unreadable map[string]struct{}
	// newest is the newest input time a Lookup, Claim or Restore of the
	// partition was given since Open (zero: none yet): the partition's
	// clock for expiry (Newest, Expire). Guarded by mu.
	newest time.Time

	snapMu sync.Mutex // serialises snapshot file writes
	// snapVersion is the Badger version the snapshot file on disk covers,
	// valid when snapOnDisk; guarded by snapMu.
	snapVersion uint64
	snapOnDisk  bool
	// snapCommits is commits when the snapshot on disk was captured;
	// guarded by snapMu.
	snapCommits uint64
	// commits counts the partition's Badger commits since Open: the
	// store's version also moves with other partitions' writes, so it
	// cannot tell whether this one wrote. Guarded by mu.
	commits uint64

	totalsBucket time.Duration // Options.TotalsBucket; 0 = totals off
	totalsKeep   time.Duration // Options.TotalsKeep
	// dirty holds the Badger keys of the totals changed since the last
	// TakeDirtyTotals; guarded by mu.
	dirty map[string]struct{}

	lookups, filterNeg, filterPos, storeReads, falsePos, bypassed atomic.Uint64
	claims, claimsNew, claimStoreReads                            atomic.Uint64
}

// Index returns the partition's number, 0..Partitions-1.
func (p *Partition) Index() int { return p.index }

// Dir returns the partition's directory, which holds its filter snapshot.
func (p *Partition) Dir() string { return p.dir }

// SyncWrites reports whether the store's Badger instance was opened to
// fsync every commit before it returns (Badger's own option, as opened).
func (p *Partition) SyncWrites() bool { return p.db.Opts().SyncWrites }

// version returns a Badger version at or above every version committed so
// far, this partition's included: the read timestamp of a new read
// transaction, which waits until every commit below it is applied.
// (Badger's MaxVersion reads the memtable's highest version without the
// lock its writer holds, so it races with the other partitions' commits.)
func (p *Partition) version() uint64 {
	txn := p.db.NewTransaction(false)
	defer txn.Discard()
	return txn.ReadTs()
}

// Lookup reports whether the partition holds a record of key that makes a
// copy stored by the input stream at at a repeat: one not forgotten whose
// window has not ended at at (window.Inside(WindowStart(), at); a copy
// older than the record's window start is a repeat too). at is the copy's
// input time, on the input stream's clock; zero means the clock's now
// (Options.Clock), for tools and tests. The filter answers first:
// "definitely not" returns Found=false without reading Badger; "maybe", or
// a copy too old for the filter (at - W before bloom.Filter.Since), reads
// Badger. Lookup on a closed store returns ErrClosed; a record that cannot
// be decoded returns an error wrapping ErrCorruptRecord.
func (p *Partition) Lookup(key []byte, at time.Time) (LookupResult, error) {
	if err := checkKey(key); err != nil {
		return LookupResult{}, p.wrap(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return LookupResult{}, ErrClosed
	}
	p.lookups.Add(1)
	at = p.observe(at)
	var res LookupResult
	if p.filterAnswers(at, key) {
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
	switch {
	case ok && rec.holds(p.win, at):
		res.Found, res.Record = true, rec
		return res, nil
	case ok && !rec.Forgotten.IsZero() && p.win.Inside(rec.WindowStart(), at):
		res.Forgotten = rec.Forgotten
		return res, nil
	case ok:
		res.Ended, res.Record = p.win.ExpiresAt(rec.WindowStart()), rec
	}
	if res.FilterSaidMaybe {
		p.falsePos.Add(1)
	}
	return res, nil
}

// observe returns at, or the clock's now when at is zero, and moves the
// partition's newest input time (and its filter) to it when it is newer.
// Called with p.mu held.
func (p *Partition) observe(at time.Time) time.Time {
	if at.IsZero() {
		at = p.clock.Now()
	}
	if at.After(p.newest) {
		p.newest = at
		if p.filter != nil {
			p.filter.Advance(at)
		}
	}
	return at
}

// filterAnswers reports whether the filter can answer for a copy of key at
// at: there is one, key's record is not one a filter build could not read,
// and every record that can make that copy a repeat (window start after
// at - W) was added at or after the filter's oldest generation. Else the
// copy is counted in Stats.FilterBypassed and the store is read. Called
// with p.mu held.
func (p *Partition) filterAnswers(at time.Time, key []byte) bool {
	if p.filter == nil {
		return false
	}
	if len(p.unreadable) > 0 {
		if _, ok := p.unreadable[string(key)]; ok {
			return false
		}
	}
	if at.Add(-p.win.W).Before(p.filter.Since()) {
		p.bypassed.Add(1)
		return false
	}
	return true
}

// Newest returns the newest input time a Lookup, Claim or Restore of the
// partition was given since Open; zero when none was.
func (p *Partition) Newest() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.newest
}

// get reads key's record from Badger, whatever its logical expiry.
func (p *Partition) get(key []byte) (rec Record, found bool, err error) {
	err = p.db.View(func(txn *badger.Txn) error {
		rec, found, err = readRecord(txn, p.ks, key)
		return err
	})
	return rec, found, err
}

// readRecord reads key's record in txn.
func readRecord(txn *badger.Txn, ks keyspace, key []byte) (Record, bool, error) {
	item, err := txn.Get(ks.record(key))
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

// Stats returns the partition's counters and filter figures.
func (p *Partition) Stats() Stats {
	s := Stats{
		Lookups:         p.lookups.Load(),
		FilterNegatives: p.filterNeg.Load(),
		FilterPositives: p.filterPos.Load(),
		StoreReads:      p.storeReads.Load(),
		FalsePositives:  p.falsePos.Load(),
		FilterBypassed:  p.bypassed.Load(),
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

// close writes the snapshot and marks the partition closed; the store
// closes Badger after every partition.
func (p *Partition) close() error {
	serr := p.snapshot(true)
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	return serr
}
