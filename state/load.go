package state

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// ErrNotEmpty means a Loader was asked of a partition that holds a record,
// a total or a cursor: only an empty partition is loaded in bulk (Restore
// merges into one that is not).
var ErrNotEmpty = errors.New("state: partition not empty")

// Loader writes a snapshot's records, sorted by key, into an empty
// partition in Badger write batches: what Restore would store from them,
// without totals, and faster. It holds the partition from NewLoader until
// Finish or Cancel (call Cancel in a defer) and is not safe for concurrent use.
type Loader struct {
	p     *Partition
	wb    *badger.WriteBatch
	now   time.Time // the partition's newest input time when the load began; zero: none
	last  []byte    // Badger key of the last record added
	added int
	ended bool
}

// NewLoader prepares a bulk load of the partition. It returns an error
// wrapping ErrNotEmpty when the partition holds anything, ErrDiskFull as
// Claim does, ErrClosed when the store is closed.
func (p *Partition) NewLoader() (*Loader, error) {
	p.mu.Lock()
	l, err := p.newLoader()
	if err != nil {
		p.mu.Unlock()
		return nil, p.wrap(fmt.Errorf("load: %w", err))
	}
	return l, nil
}

// newLoader is NewLoader with p.mu held.
func (p *Partition) newLoader() (*Loader, error) {
	if p.closed {
		return nil, ErrClosed
	}
	if err := p.empty(); err != nil {
		return nil, err
	}
	if p.minFree > 0 {
		if err := checkFreeSpace(p.dir, p.minFree); err != nil {
			return nil, err
		}
	}
	// Badger gives each of the batch's commits a version above every
	// version the store has had: a filter snapshot on disk covers at most
	// that one, so a later filter build tops it up with the loaded
	// records instead of taking them as covered.
	return &Loader{p: p, wb: p.db.NewWriteBatch(), now: p.newest}, nil
}

// empty returns an error wrapping ErrNotEmpty when the partition holds any
// key Badger still serves.
func (p *Partition) empty() error {
	txn := p.db.NewTransaction(false)
	defer txn.Discard()
	it := txn.NewIterator(badger.IteratorOptions{Prefix: p.ks[:]})
	defer it.Close()
	if it.Rewind(); it.Valid() {
		return fmt.Errorf("%w: it holds key %q", ErrNotEmpty, it.Item().Key()[keyspaceLen:])
	}
	return nil
}

// Add adds recs, which continue the load in ascending key order with no
// key twice. A record whose window ended at the partition's newest input
// time when the load began is left out (it carries no total to keep);
// with none given yet, every record is loaded and Expire removes the ended
// ones later. It refuses recs, with an error wrapping
// ErrBadRestore, when a record has a bad key, no FirstSeen, a total
// contribution, or a key not after the one before; the load must then be
// cancelled.
func (l *Loader) Add(recs []Restored) error {
	p := l.p
	if l.ended {
		return fmt.Errorf("state: partition %d: load: Add after Finish or Cancel", p.index)
	}
	if err := p.checkRestored(recs); err != nil {
		return err
	}
	for i, r := range recs {
		if r.Total.Group != "" {
			return p.wrap(fmt.Errorf("load %d (key %q): %w: a load carries no totals", l.added+i, r.Key, ErrBadRestore))
		}
		rec := r.record()
		if !l.now.IsZero() && !p.win.Inside(rec.WindowStart(), l.now) {
			continue
		}
		key := p.ks.record(r.Key)
		if l.last != nil && bytes.Compare(key, l.last) <= 0 {
			return p.wrap(fmt.Errorf("load %d (key %q): %w: not after the key before it", l.added+i, r.Key, ErrBadRestore))
		}
		if err := l.wb.SetEntry(badger.NewEntry(key, encodeRecord(rec))); err != nil {
			return p.wrap(fmt.Errorf("load: write: %w", err))
		}
		p.observe(rec.WindowStart())
		if p.filter != nil {
			p.filter.Add(r.Key, rec.WindowStart())
		}
		l.last = key
	}
	l.added += len(recs)
	return nil
}

// Finish waits for the batch's last commits, then stores cursor (when not
// 0) in a transaction of its own, as Restore's last call would, and gives
// the partition back. After a crash before the cursor's commit the
// partition holds records without a cursor: restoring the changelog from
// its start again merges into them.
func (l *Loader) Finish(cursor uint64) error {
	p := l.p
	if l.ended {
		return fmt.Errorf("state: partition %d: load: Finish after Finish or Cancel", p.index)
	}
	l.ended = true
	defer p.mu.Unlock()
	if err := l.wb.Flush(); err != nil {
		return p.wrap(fmt.Errorf("load: flush: %w", err))
	}
	p.commits++
	if cursor == 0 {
		return nil
	}
	if err := p.commit(&batch{claimed: []claimWrites{p.cursorWrites(cursor)}}); err != nil {
		return p.wrap(fmt.Errorf("load: cursor: %w", err))
	}
	return nil
}

// Cancel ends a load that was not finished: it drops what the load wrote
// (Badger's DropPrefix of the partition's keyspace, which holds the
// store's writes, every partition's, while it runs), leaving the
// partition empty, and gives the partition back. The filter keeps the
// keys added, which can only make it answer "maybe" for them. After
// Finish it does nothing.
func (l *Loader) Cancel() error {
	if l.ended {
		return nil
	}
	l.ended = true
	p := l.p
	defer p.mu.Unlock()
	l.wb.Cancel()
	if err := p.db.DropPrefix(p.ks[:]); err != nil {
		return p.wrap(fmt.Errorf("load: drop what a cancelled load wrote: %w", err))
	}
	return nil
}
