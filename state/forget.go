package state

import (
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Forget makes key's next copy New: it marks the key's record forgotten at
// the clock's now (an operator's time, which names the forget in the
// key's next forward id; it judges nothing), and returns the key's record
// (marked, when held) and whether it held the key: a record not forgotten
// before whose window has not ended at the partition's newest input time
// (Newest; any record when none was given yet). A key not held is left as
// it is, so Forget is idempotent.
//
// The forgotten record stays, with its FirstSeen, until Expire removes it,
// and its key stays in the filter: a lookup reads the store and finds it
// forgotten (LookupResult.Forgotten). The next New claim of the key
// replaces it. It commits in one transaction, fsynced with
// Options.SyncWrites, so a forget holds after a restart.
func (p *Partition) Forget(key []byte) (rec Record, held bool, err error) {
	return p.ForgetAt(key, time.Time{})
}

// ForgetAt is Forget with the forget's time at (zero: the clock's now). A
// scale-out group's owner publishes the forget's tombstone with that time
// before it marks its own record (docs/admin.md).
func (p *Partition) ForgetAt(key []byte, at time.Time) (rec Record, held bool, err error) {
	if err := checkKey(key); err != nil {
		return Record{}, false, p.wrap(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return Record{}, false, ErrClosed
	}
	if at.IsZero() {
		at = p.clock.Now()
	}
	rec, ok, err := p.get(key)
	if err != nil {
		return Record{}, false, p.wrap(err)
	}
	if !ok || !p.holdsNow(rec) {
		return rec, false, nil
	}
	forgotten := rec
	forgotten.Forgotten = at
	err = p.db.Update(func(txn *badger.Txn) error {
		return txn.SetEntry(badger.NewEntry(p.ks.record(key), encodeRecord(forgotten)))
	})
	if err != nil {
		return Record{}, false, p.wrap(fmt.Errorf("forget key %q: %w", key, err))
	}
	p.commits++
	return forgotten, true, nil
}

// Held returns key's record and whether the partition holds it: a record
// not forgotten whose window has not ended at the partition's newest input
// time (any, when none was given yet), which Forget would forget. A false
// with a record means its window ended or it is forgotten.
func (p *Partition) Held(key []byte) (Record, bool, error) {
	if err := checkKey(key); err != nil {
		return Record{}, false, p.wrap(err)
	}
	rec, ok, err := p.find(key)
	if err != nil || !ok {
		return rec, false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return rec, p.holdsNow(rec), nil
}

// holdsNow reports whether rec makes a copy at the partition's newest
// input time a repeat; with none given yet, whether it is not forgotten.
// Called with p.mu held.
func (p *Partition) holdsNow(rec Record) bool {
	if p.newest.IsZero() {
		return rec.Forgotten.IsZero()
	}
	return rec.holds(p.win, p.newest)
}
