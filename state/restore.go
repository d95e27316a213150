package state

import (
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/dedupe-stage/dedupe-stage/bloom"
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
		item, err := txn.Get(p.ks.cursor())
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

// Restored is one record read back from the output stream (the
// partition's changelog), for Restore.
type Restored struct {
	// Key is the dedupe key, 1..MaxKeySize bytes.
	Key []byte
	// Fingerprint is the payload fingerprint stored with the key.
	Fingerprint uint64
	// FirstSeen is the key's first-seen time, decided at judge time; not
	// zero.
	FirstSeen time.Time
	// Total is what the record's forward added to its (group, bucket)
	// total; empty when it added to none. It is checked as a Claim's.
	Total Contribution
	// Seq is the record's output stream sequence. Within one Restore call
	// the records come in stream order; 0 means unknown.
	Seq uint64
	// Refreshed is when a repeat last moved the key's window; zero: never.
	Refreshed time.Time
	// Version is the key's version when HasVersion (version-wins).
	Version uint64
	// HasVersion is true when the record carries a Version.
	HasVersion bool
	// Forgotten is when an operator forgot the key (a forget's tombstone,
	// or a forgotten record in a snapshot); zero: never. Restored after
	// the key's record, it marks that record forgotten; with no record
	// held, it stores the key's record marked, so that every owner gives
	// the key's next forward the same id.
	Forgotten time.Time
	// OutputSeq is the output stream sequence of the key's forward: Seq
	// for a forward read back, the one a key-state record or a snapshot
	// carries otherwise; 0 when unknown, and a record restored over the
	// partition's record of the same FirstSeen then keeps that record's.
	OutputSeq uint64
}

// record is the Record r restores.
func (r Restored) record() Record {
	return Record{FirstSeen: r.FirstSeen, Fingerprint: r.Fingerprint, Refreshed: r.Refreshed, Version: r.Version, HasVersion: r.HasVersion,
		Forgotten: r.Forgotten, OutputSeq: r.OutputSeq}
}

// Restore puts records read back from the partition's changelog into the
// partition, with their keys in the filter and their totals added, and
// stores cursor (when not 0) with the last of them. A record adds nothing
// when the partition holds its key as early (or at a greater version), so restoring the same records
// again, or again from the stored cursor + 1 after a failure, changes
// nothing. docs/state.md says which records are stored and which only counted.
func (p *Partition) Restore(recs []Restored, cursor uint64) error {
	_, err := p.RestoreCounted(recs, cursor)
	return err
}

// RestoreCounted is Restore that also returns how many keys it stored a
// record of: keys the partition did not hold as early (or at as great a
// version) before the call.
func (p *Partition) RestoreCounted(recs []Restored, cursor uint64) (stored int, err error) {
	if err := p.checkRestored(recs); err != nil {
		return 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	// A record whose window ended at the partition's newest input time is
	// not stored (with none yet, every record is, and Expire removes the
	// ended ones later); the records then move that time themselves.
	now := p.newest
	for _, r := range recs {
		p.observe(r.record().WindowStart())
	}
	b := &batch{inBatch: make(map[string]Record, len(recs)), at: make(map[string]int, len(recs))}
	rtxn := p.db.NewTransaction(false)
	defer rtxn.Discard()
	for i, r := range recs {
		rec := r.record()
		if !now.IsZero() && !p.win.Inside(rec.WindowStart(), now) {
			cw, err := p.restoreExpired(rtxn, b, r, rec, now)
			if err != nil {
				return 0, p.wrap(fmt.Errorf("restore %d: %w", i, err))
			}
			if cw != nil {
				b.claimed = append(b.claimed, *cw)
			}
			continue
		}
		k := string(r.Key)
		h, have, held, err := p.alreadyHolds(rtxn, b, r.Key, rec)
		if err != nil {
			return 0, p.wrap(fmt.Errorf("restore %d: %w", i, err))
		}
		if held {
			continue
		}
		if rec.OutputSeq == 0 && have.FirstSeen.Equal(rec.FirstSeen) {
			rec.OutputSeq = have.OutputSeq // a key-state record of the same forward
		}
		b.inBatch[k] = rec
		cw := claimWrites{
			key:       r.Key,
			hash:      h,
			firstSeen: rec.WindowStart(),
			writes:    []write{{key: p.ks.record(r.Key), value: encodeRecord(rec)}},
		}
		if r.Total.Group != "" {
			_, w, err := p.addTotal(rtxn, b, r.Total)
			if err != nil {
				return 0, p.wrap(fmt.Errorf("restore %d: %w", i, err))
			}
			cw.writes = append(cw.writes, w)
			cw.total = string(w.key)
		}
		// A later record of a key this call writes replaces the earlier
		// one's record, in stream order (its total write, if any, holds
		// both contributions).
		b.add(r.Key, cw)
	}
	if cursor > 0 {
		b.claimed = append(b.claimed, p.cursorWrites(cursor))
	}
	if err := p.commit(b); err != nil {
		return 0, p.wrap(fmt.Errorf("restore: %w", err))
	}
	return len(b.at), nil
}

// alreadyHolds reports whether the partition, or b (the records of this
// Restore call before), holds key with a record that supersedes rec (see
// supersedes): rec then adds nothing. It returns key's filter hash when it
// tested the filter (zero otherwise), hashed once for the test and the
// add, and the record held (zero when none). A corrupt stored record is
// replaced by rec.
func (p *Partition) alreadyHolds(rtxn *badger.Txn, b *batch, key []byte, rec Record) (bloom.Hash, Record, bool, error) {
	var h bloom.Hash
	if have, ok := b.inBatch[string(key)]; ok {
		return h, have, supersedes(have, rec), nil
	}
	if p.filterAnswers(rec.WindowStart(), key) {
		if h = p.filter.Hash(key); !p.filter.TestHash(h) {
			return h, Record{}, false, nil
		}
	}
	have, ok, err := readRecord(rtxn, p.ks, key)
	if err != nil && !errors.Is(err, ErrCorruptRecord) {
		return h, Record{}, false, err
	}
	if err != nil || !ok {
		return h, Record{}, false, nil
	}
	if supersedes(have, rec) {
		b.inBatch[string(key)] = have
		return h, have, true, nil
	}
	return h, have, false, nil
}

// supersedes reports whether have, a record held, makes rec, one restored,
// add nothing. A record first seen after a forgotten have is a forward
// after the forget, and replaces it whatever its version; a rec that
// carries a later forget of have's record marks it, and one that forgets
// an earlier record adds nothing. Otherwise: both carry
// versions and have's is greater, or else have was first seen at rec's
// FirstSeen or later and carries its refresh.
func supersedes(have, rec Record) bool {
	if !have.Forgotten.IsZero() && rec.FirstSeen.After(have.FirstSeen) {
		return false
	}
	if !rec.Forgotten.IsZero() {
		// A forget of have's own record marks it; one of an earlier record
		// (read again) changes nothing.
		if have.FirstSeen.Equal(rec.FirstSeen) {
			return !have.Forgotten.IsZero() && !have.Forgotten.Before(rec.Forgotten)
		}
		if have.FirstSeen.After(rec.FirstSeen) {
			return true
		}
	}
	if have.HasVersion && rec.HasVersion && have.Version != rec.Version {
		return have.Version > rec.Version
	}
	return !have.FirstSeen.Before(rec.FirstSeen) && !have.WindowStart().Before(rec.WindowStart())
}

// checkRestored refuses recs, whole, when one of them has a bad key, no
// FirstSeen or a contribution to a total this partition cannot hold.
func (p *Partition) checkRestored(recs []Restored) error {
	for i, r := range recs {
		if err := checkKey(r.Key); err != nil {
			return p.wrap(fmt.Errorf("restore %d: %w", i, err))
		}
		if r.FirstSeen.IsZero() {
			return p.wrap(fmt.Errorf("restore %d (key %q): %w: no FirstSeen", i, r.Key, ErrBadRestore))
		}
		if err := checkContribution(r.Total, p.totalsBucket); err != nil {
			return p.wrap(fmt.Errorf("restore %d (key %q): %w: %w", i, r.Key, ErrBadRestore, err))
		}
	}
	return nil
}

// restoreExpired decides a restored record r that is outside the window
// at now: nil when it adds nothing (no total, its bucket's total no longer
// kept, or its key still held with this FirstSeen), else the writes of its
// contribution and, when r has a Seq, of the cursor at r.Seq.
func (p *Partition) restoreExpired(rtxn *badger.Txn, b *batch, r Restored, rec Record, now time.Time) (*claimWrites, error) {
	if r.Total.Group == "" || !r.Total.Bucket.Add(p.totalsBucket).Add(p.win.W).Add(p.totalsKeep).After(now) {
		return nil, nil
	}
	if have, ok := b.inBatch[string(r.Key)]; ok && have.FirstSeen.Equal(rec.FirstSeen) {
		return nil, nil
	}
	have, ok, err := readRecord(rtxn, p.ks, r.Key)
	if err != nil && !errors.Is(err, ErrCorruptRecord) {
		return nil, err
	}
	if err == nil && ok && have.FirstSeen.Equal(rec.FirstSeen) {
		return nil, nil // counted when the key was claimed or restored
	}
	_, w, err := p.addTotal(rtxn, b, r.Total)
	if err != nil {
		return nil, err
	}
	cw := &claimWrites{writes: []write{w}, total: string(w.key)}
	if r.Seq > 0 {
		cw.writes = append(cw.writes, write{key: p.ks.cursor(), value: encodeCursor(r.Seq)})
	}
	return cw, nil
}
