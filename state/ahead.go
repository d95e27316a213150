package state

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/dgraph-io/badger/v4"
)

// OutputSeqs returns the output sequences of the forwards of the
// partition's records (Record.OutputSeq) that are in 1..upTo, in ascending
// order; records that carry none (0: written before records carried it)
// are left out. It reads every record, without the partition's lock.
func (p *Partition) OutputSeqs(ctx context.Context, upTo uint64) ([]uint64, error) {
	var seqs []uint64
	err := p.ScanRecords(ctx, func(uint64) error { return nil }, func(_ []byte, r Record) error {
		if r.OutputSeq > 0 && r.OutputSeq <= upTo {
			seqs = append(seqs, r.OutputSeq)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(seqs)
	return seqs, nil
}

// DropAfter removes, for good, every record whose forward's output
// sequence (Record.OutputSeq) is above seq, and lowers the partition's
// cursor to seq when it is above: the output stream no longer holds those
// forwards (a server that lost writes it had acknowledged), so their keys'
// next copies are judged New and forwarded again. Records that carry no
// output sequence stay. Their keys stay in the filter, which answers
// "maybe" for them: a lookup reads the store and finds nothing. It returns
// how many records it removed; it commits in write batches, synced with
// Options.SyncWrites, and a crash part way leaves some of them, which a
// second call removes (the cursor is lowered last).
func (p *Partition) DropAfter(ctx context.Context, seq uint64) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	var drop [][]byte
	var cursor uint64
	err := p.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(p.ks.cursor())
		switch {
		case errors.Is(err, badger.ErrKeyNotFound):
		case err != nil:
			return fmt.Errorf("read cursor: %w", err)
		default:
			if err := item.Value(func(v []byte) (derr error) {
				cursor, derr = decodeCursor(v)
				return derr
			}); err != nil {
				return err
			}
		}
		_, err = eachItem(ctx, txn, p.ks.kind(prefixRecord), func(item *badger.Item) error {
			return item.Value(func(v []byte) error {
				rec, err := decodeRecord(v)
				if err != nil {
					return fmt.Errorf("key %q: %w", userKey(item.Key()), err)
				}
				if rec.OutputSeq > seq {
					drop = append(drop, item.KeyCopy(nil))
				}
				return nil
			})
		})
		return err
	})
	if err != nil {
		return 0, p.wrap(fmt.Errorf("drop records after output sequence %d: %w", seq, err))
	}
	wb := p.db.NewWriteBatch()
	defer wb.Cancel()
	for _, k := range drop {
		if err := wb.Delete(k); err != nil {
			return 0, p.wrap(fmt.Errorf("drop records after output sequence %d: %w", seq, err))
		}
	}
	if cursor > seq {
		if err := wb.Set(p.ks.cursor(), encodeCursor(seq)); err != nil {
			return 0, p.wrap(fmt.Errorf("drop records after output sequence %d: lower the cursor: %w", seq, err))
		}
	}
	if err := wb.Flush(); err != nil {
		return 0, p.wrap(fmt.Errorf("drop records after output sequence %d: %w", seq, err))
	}
	if len(drop) > 0 {
		p.commits++
	}
	return len(drop), nil
}
