package state

import (
	"context"
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// scanCheckEvery is how many records ScanRecords reads between checks of
// its context.
const scanCheckEvery = 4096

// ScanRecords calls begin with the partition's cursor (see Cursor), then
// fn with every record the partition holds, all read in one consistent
// view of the store (a Badger read transaction): the view holds every
// record the partition's changelog holds up to the cursor, since a claim
// and its cursor are committed together, the cursor last. Records come in key order, expired
// ones (past their Badger TTL) left out; a record logically outside the
// window may still come. The key passed to fn is valid only during the
// call.
//
// It does not hold the partition's lock while it reads: claims go on
// beside it and are not in the view. A record that cannot be decoded ends
// the scan with an error wrapping ErrCorruptRecord; an error from fn or
// ctx ends it too.
func (p *Partition) ScanRecords(ctx context.Context, begin func(cursor uint64) error, fn func(key []byte, r Record) error) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	txn := p.db.NewTransaction(false)
	p.mu.Unlock()
	defer txn.Discard()
	var cursor uint64
	item, err := txn.Get(cursorKey)
	switch {
	case errors.Is(err, badger.ErrKeyNotFound):
	case err != nil:
		return p.wrap(fmt.Errorf("scan: read cursor: %w", err))
	default:
		if err := item.Value(func(v []byte) (derr error) {
			cursor, derr = decodeCursor(v)
			return derr
		}); err != nil {
			return p.wrap(fmt.Errorf("scan: %w", err))
		}
	}
	if err := begin(cursor); err != nil {
		return err
	}
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{prefixRecord}, PrefetchValues: true, PrefetchSize: 256})
	defer it.Close()
	n := 0
	for it.Rewind(); it.Valid(); it.Next() {
		if n++; n%scanCheckEvery == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		item := it.Item()
		key := item.Key()[1:]
		var rec Record
		if err := item.Value(func(v []byte) (derr error) {
			rec, derr = decodeRecord(v)
			return derr
		}); err != nil {
			return p.wrap(fmt.Errorf("scan: key %q: %w", key, err))
		}
		if err := fn(key, rec); err != nil {
			return err
		}
	}
	return nil
}
