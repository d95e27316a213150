package state

import (
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// Forget makes key's next copy New: it marks the key's record forgotten at
// the clock's now, and returns the key's record (marked, when held) and
// whether it held the key (an unexpired record not forgotten before). A key not held is
// left as it is, so Forget is idempotent.
//
// The forgotten record stays, with its FirstSeen, until its Badger TTL
// (now + the record TTL), and its key stays in the filter: a lookup reads
// the store and finds it forgotten (LookupResult.Forgotten). The next New
// claim of the key replaces it. It commits in one transaction, fsynced
// with Options.SyncWrites, so a forget holds after a restart.
func (p *Partition) Forget(key []byte) (rec Record, held bool, err error) {
	if err := checkKey(key); err != nil {
		return Record{}, false, p.wrap(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return Record{}, false, ErrClosed
	}
	now := p.clock.Now()
	rec, ok, err := p.get(key)
	if err != nil {
		return Record{}, false, p.wrap(err)
	}
	if !ok || !rec.holds(p.win, now) {
		return rec, false, nil
	}
	forgotten := rec
	forgotten.Forgotten = now
	err = p.db.Update(func(txn *badger.Txn) error {
		return txn.SetEntry(badger.NewEntry(p.ks.record(key), encodeRecord(forgotten)).WithTTL(p.ttl))
	})
	if err != nil {
		return Record{}, false, p.wrap(fmt.Errorf("forget key %q: %w", key, err))
	}
	p.commits++
	return forgotten, true, nil
}
