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

// ScanRecords calls begin with the partition's cursor, then fn with every
// record up to it, in key order, from one Badger read transaction taken
// without the partition's lock; the key passed to fn is valid only during
// the call. Records past their Badger TTL are left out; some past the
// window may still come, and forgotten ones (Forget) come with their
// mark. A record that cannot be decoded ends the scan with an error
// wrapping ErrCorruptRecord.
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
	item, err := txn.Get(p.ks.cursor())
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
	_, err = eachItem(ctx, txn, p.ks.kind(prefixRecord), func(item *badger.Item) error {
		key := userKey(item.Key())
		var rec Record
		if err := item.Value(func(v []byte) (derr error) {
			rec, derr = decodeRecord(v)
			return derr
		}); err != nil {
			return p.wrap(fmt.Errorf("scan: key %q: %w", key, err))
		}
		return fn(key, rec)
	})
	return err
}

// eachItem calls fn with every item under prefix in txn, values
// prefetched, in key order, and stops at fn's first error or when ctx
// ends (looked at every scanCheckEvery items). It returns how many items
// it visited.
func eachItem(ctx context.Context, txn *badger.Txn, prefix []byte, fn func(*badger.Item) error) (int, error) {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 256})
	defer it.Close()
	n := 0
	for it.Rewind(); it.Valid(); it.Next() {
		if n++; n%scanCheckEvery == 0 {
			if err := ctx.Err(); err != nil {
				return n, err
			}
		}
		if err := fn(it.Item()); err != nil {
			return n, err
		}
	}
	return n, nil
}
