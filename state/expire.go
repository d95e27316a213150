package state

import (
	"context"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// expireChunk is how many keys Expire looks at per hold of the partition
// lock: a claim waits for at most one chunk.
const expireChunk = 1024

// ExpireStats is what one Expire removed.
type ExpireStats struct {
	// Scanned is how many records and totals Expire read.
	Scanned int
	// Records is how many records it removed.
	Records int
	// Totals is how many totals it removed.
	Totals int
}

// Expire removes, for good, the records whose window ended at or before
// upTo (WindowStart()+W <= upTo), and the totals kept until upTo or
// before (bucket end + W + TotalsKeep; a total a flush has not taken yet
// stays), of those written at Badger version maxVersion or before (see
// Version); 0 means any version.
//
// upTo is a time on the input's clock: the caller passes one that no copy
// still to be judged is older than (the stage: the partition's newest
// input time, held back by the oldest message its consumer has not had
// acknowledged). A record whose window has ended already makes no copy a
// repeat (Lookup), so Expire changes no answer: it frees the disk. Records
// carry no Badger TTL: Badger's runs on the host's wall clock, which would
// drop a key while the input still holds copies inside its window (a stage
// stopped for longer than W), and Expire is how a record leaves.
//
// Expire holds the partition lock for expireChunk keys at a time, so
// Lookup and Claim go on between chunks; a record a claim rewrote since
// Expire read it (a refresh, a new version) has a version above
// maxVersion, or is read again under the lock, and stays.
func (p *Partition) Expire(ctx context.Context, upTo time.Time, maxVersion uint64) (ExpireStats, error) {
	var st ExpireStats
	if err := p.expireKind(ctx, prefixRecord, upTo, maxVersion, &st); err != nil {
		return st, err
	}
	if p.totalsBucket > 0 {
		if err := p.expireKind(ctx, prefixTotal, upTo, maxVersion, &st); err != nil {
			return st, err
		}
	}
	return st, nil
}

// Version returns a Badger version at or above every version committed so
// far, for Expire's maxVersion.
func (p *Partition) Version() uint64 { return p.version() }

// expireKind is Expire of the partition's keys of one kind.
func (p *Partition) expireKind(ctx context.Context, kind byte, upTo time.Time, maxVersion uint64, st *ExpireStats) error {
	prefix := p.ks.kind(kind)
	next := prefix
	for next != nil {
		if err := ctx.Err(); err != nil {
			return err
		}
		var err error
		if next, err = p.expireChunk(prefix, next, kind, upTo, maxVersion, st); err != nil {
			return p.wrap(fmt.Errorf("expire: %w", err))
		}
	}
	return nil
}

// expireChunk removes what has expired among the next expireChunk keys of
// prefix from key from on, under the partition lock, and returns the key
// to go on from (nil at the end).
func (p *Partition) expireChunk(prefix, from []byte, kind byte, upTo time.Time, maxVersion uint64, st *ExpireStats) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	var drop [][]byte
	var next []byte
	err := p.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true, PrefetchSize: 256})
		defer it.Close()
		n := 0
		for it.Seek(from); it.Valid(); it.Next() {
			item := it.Item()
			if n == expireChunk {
				next = item.KeyCopy(nil)
				return nil
			}
			n++
			st.Scanned++
			if maxVersion > 0 && item.Version() > maxVersion {
				continue
			}
			ended, err := p.ended(item, kind, upTo)
			if err != nil {
				return err
			}
			if ended {
				drop = append(drop, item.KeyCopy(nil))
			}
		}
		return nil
	})
	if err != nil || len(drop) == 0 {
		return next, err
	}
	wb := p.db.NewWriteBatch()
	defer wb.Cancel()
	for _, k := range drop {
		if err := wb.Delete(k); err != nil {
			return nil, err
		}
	}
	if err := wb.Flush(); err != nil {
		return nil, err
	}
	if kind == prefixRecord {
		st.Records += len(drop)
	} else {
		st.Totals += len(drop)
	}
	return next, nil
}

// ended reports whether item, a record or a total of the partition, has
// expired at upTo. A record that cannot be decoded stays (Lookup reports
// it); a total a flush has not taken yet stays.
func (p *Partition) ended(item *badger.Item, kind byte, upTo time.Time) (bool, error) {
	if kind == prefixTotal {
		if _, dirty := p.dirty[string(item.Key())]; dirty {
			return false, nil
		}
		_, bucket, err := parseTotalKey(item.Key())
		if err != nil {
			return false, nil
		}
		return !p.totalKeptUntil(bucket).After(upTo), nil
	}
	var rec Record
	err := item.Value(func(v []byte) (derr error) {
		rec, derr = decodeRecord(v)
		return derr
	})
	if err != nil {
		return false, nil
	}
	return !p.win.ExpiresAt(rec.WindowStart()).After(upTo), nil
}
