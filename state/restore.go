package state

import (
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// Cursor returns the partition's cursor: the output stream sequence up to
// which its state is complete, as the last ClaimWithCursor or Restore
// stored it; 0 when none ever did. It is kept in Badger apart from the
// records (no TTL, never a key of Find, of a filter build or of a
// snapshot), so it survives a restart with them.
func (p *Partition) Cursor() (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	var cursor uint64
	err := p.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(cursorKey)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) (derr error) {
			cursor, derr = decodeCursor(v)
			return derr
		})
	})
	if err != nil {
		return 0, p.wrap(fmt.Errorf("read cursor: %w", err))
	}
	return cursor, nil
}

// Restore puts records read back from the output stream (the partition's
// changelog) into the partition, adds their keys to the filter, and stores
// cursor (when not 0) with the last of them, as ClaimWithCursor does. Each
// rec gives Key, Fingerprint and FirstSeen, which must not be zero; Total
// must be empty (ErrBadRestore otherwise).
//
// Restore is idempotent and order-free: a record already outside the
// window at the clock's now is skipped; a key the partition (or an
// earlier rec) already holds with the same or a later FirstSeen keeps that
// record; otherwise the record is written, with the Badger TTL a Claim
// gives. Keys the filter proves new skip the Badger read. The writes are
// split into as few transactions as Badger takes, like Claim's; when one
// fails, the ones before it stay, and restoring the same records again
// completes the partition.
func (p *Partition) Restore(recs []Claim, cursor uint64) error {
	for i, r := range recs {
		if err := checkKey(r.Key); err != nil {
			return p.wrap(fmt.Errorf("restore %d: %w", i, err))
		}
		if r.FirstSeen.IsZero() {
			return p.wrap(fmt.Errorf("restore %d (key %q): %w: no FirstSeen", i, r.Key, ErrBadRestore))
		}
		if r.Total.Group != "" {
			return p.wrap(fmt.Errorf("restore %d (key %q): %w: it carries a total", i, r.Key, ErrBadRestore))
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	now := p.clock.Now()
	if p.filter != nil {
		p.filter.Advance(now)
	}
	b := &batch{inBatch: make(map[string]Record, len(recs))}
	at := make(map[string]int, len(recs)) // key -> index in b.claimed
	rtxn := p.db.NewTransaction(false)
	defer rtxn.Discard()
	for i, r := range recs {
		if !p.win.Inside(r.FirstSeen, now) {
			continue
		}
		rec := Record{FirstSeen: r.FirstSeen, Fingerprint: r.Fingerprint}
		k := string(r.Key)
		if have, ok := b.inBatch[k]; ok {
			if !have.FirstSeen.Before(rec.FirstSeen) {
				continue
			}
		} else if p.filter == nil || p.filter.Test(r.Key) {
			have, ok, err := readRecord(rtxn, r.Key)
			if err != nil && !errors.Is(err, ErrCorruptRecord) {
				return p.wrap(fmt.Errorf("restore %d: %w", i, err))
			}
			// A corrupt record is replaced by the restored one.
			if err == nil && ok && !have.FirstSeen.Before(rec.FirstSeen) {
				b.inBatch[k] = have
				continue
			}
		}
		b.inBatch[k] = rec
		cw := claimWrites{
			key:       r.Key,
			firstSeen: rec.FirstSeen,
			writes:    []write{{key: recordKey(r.Key), value: encodeRecord(rec), ttl: p.ttl}},
		}
		if j, ok := at[k]; ok {
			b.claimed[j] = cw // a later record of a key this call writes
			continue
		}
		at[k] = len(b.claimed)
		b.claimed = append(b.claimed, cw)
	}
	if cursor > 0 {
		b.claimed = append(b.claimed, cursorWrites(cursor))
	}
	if err := p.commit(b); err != nil {
		return p.wrap(fmt.Errorf("restore: %w", err))
	}
	return nil
}
