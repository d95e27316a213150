package state

import (
	"errors"
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// storeKeyspace is the keyspace of the store's own keys, which belong to
// no partition: above every partition's (MaxPartitions < 0xffff), so no
// partition's prefix scan, DropPrefix, filter build, snapshot check or
// migration meets them.
var storeKeyspace = keyspace{0xff, 0xff}

// watermarkKey is the Badger key of the store's watermark (Watermark).
var watermarkKey = storeKeyspace.kind(prefixCursor)

// Watermark returns the store's watermark, as the last SetWatermark or
// ClaimWithWatermark stored it: an output stream sequence up to which
// every forward of the stage is recorded in the store (docs/state.md,
// "The watermark"). ok is false when none was ever stored (a new store,
// or one written by a version without it). It is kept apart from the
// records, with no TTL.
func (s *Store) Watermark() (seq uint64, ok bool, err error) {
	err = s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(watermarkKey)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		ok = true
		return item.Value(func(v []byte) (derr error) {
			seq, derr = decodeCursor(v)
			return derr
		})
	})
	if err != nil {
		if errors.Is(err, badger.ErrDBClosed) {
			return 0, false, ErrClosed
		}
		return 0, false, fmt.Errorf("state: read watermark: %w", err)
	}
	return seq, ok, nil
}

// SetWatermark stores seq as the store's watermark (see Watermark), in a
// transaction of its own.
func (s *Store) SetWatermark(seq uint64) error {
	err := s.db.Update(func(txn *badger.Txn) error {
		return txn.Set(watermarkKey, encodeCursor(seq))
	})
	if err != nil {
		if errors.Is(err, badger.ErrDBClosed) {
			return ErrClosed
		}
		return fmt.Errorf("state: store watermark: %w", err)
	}
	return nil
}

// ClaimWithWatermark is Claim that also stores the store's watermark (see
// Watermark) in the same transaction as the claims' records, the last one
// when the batch is split: the watermark is stored only with every claim
// of the batch. It is a blind write: partitions claiming at the same time
// never conflict over it (the store's Badger detects no conflicts; the
// partition locks order each keyspace's writers), and the last commit's
// value stands, which may be smaller than one committed just before. 0
// leaves the stored watermark as it is.
func (p *Partition) ClaimWithWatermark(claims []Claim, watermark uint64) ([]ClaimResult, error) {
	var extra []write
	if watermark > 0 {
		extra = []write{{key: watermarkKey, value: encodeCursor(watermark)}}
	}
	return p.claimWith(claims, extra)
}
