package state

import (
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/dedupe-stage/dedupe-stage/bloom"
)

// Claim asks to record a key as seen.
type Claim struct {
	// Key is the dedupe key, 1..MaxKeySize bytes.
	Key []byte
	// Fingerprint identifies the payload; it is stored with a new record.
	Fingerprint uint64
	// Total, when Total.Group is set, is added to its (group, bucket) total
	// if the claim is New, in the same transaction that records the key.
	Total Contribution
	// At is the copy's input time: when the input stream stored it, on the
	// input stream's clock. Whether the key's record makes the claim a
	// repeat is judged at At (Lookup); a New claim's record stores it as
	// its FirstSeen, and a repeat refreshed (Options.RefreshOnRepeat) as
	// its Refreshed time. The forwarded message carries it too, so that a
	// record restored from it equals this one. Zero: the clock's now
	// (Options.Clock), for tools and tests.
	At time.Time
	// Versioned makes the claim version-wins: it is New when the key's
	// unexpired record carries no version or one smaller than Version
	// (the record is then replaced), and a Stale repeat otherwise.
	Versioned bool
	// Version is the copy's version, when Versioned.
	Version uint64
	// OutputSeq is the output stream sequence of the key's forward (its
	// PubAck's), which a New claim's record keeps for inspection; 0 when
	// unknown.
	OutputSeq uint64
}

// ClaimResult is the outcome of one Claim.
type ClaimResult struct {
	// New is true when this claim recorded the key: the key had no
	// unexpired record and no earlier claim in the same batch had it.
	New bool
	// Existing is the record that made the claim a repeat; zero when New.
	Existing Record
	// Total is the absolute total of the claim's (group, bucket) after its
	// contribution, when New and the claim carried one; 0 otherwise.
	Total int64
	// Stale is true for a repeat of a Versioned claim: the key's record
	// carries the claim's version or a greater one.
	Stale bool
	// Refreshed is true for a repeat whose key's window this claim moved
	// (Options.RefreshOnRepeat): Existing is the record as it was before.
	Refreshed bool
}

// Claim records the keys of claims that are not yet seen, in one Badger
// transaction, and returns one result per claim in order: copies of a key
// inside the batch resolve to one New. A batch too big for one transaction
// commits in several, and a failed later one leaves the earlier committed
// (a retry sees them as repeats). With too little disk it writes nothing and
// returns an error wrapping ErrDiskFull. docs/state.md gives the record's TTL.
// A Versioned claim is New over a record OlderThan its version, and a
// Stale repeat otherwise; with Options.RefreshOnRepeat a repeat rewrites
// its record's Refreshed (and TTL) in the same transaction
// (docs/state.md, "Policies").
func (p *Partition) Claim(claims []Claim) ([]ClaimResult, error) {
	return p.ClaimWithCursor(claims, 0)
}

// ClaimWithCursor is Claim that also stores the partition's cursor (see
// Cursor) in the same transaction as the claims' records, the last one
// when the batch is split: the cursor is stored only with every claim of
// the batch. The cursor is the output stream sequence of the batch's
// forwards; it is stored as given (a stream recreated from sequence 1
// makes it go back), and 0 leaves the stored cursor as it is.
func (p *Partition) ClaimWithCursor(claims []Claim, cursor uint64) ([]ClaimResult, error) {
	var extra []write
	if cursor > 0 {
		extra = []write{{key: p.ks.cursor(), value: encodeCursor(cursor)}}
	}
	return p.claimWith(claims, extra)
}

// claimWith is Claim that also writes extra (a cursor, a watermark) with
// the last transaction of the batch.
func (p *Partition) claimWith(claims []Claim, extra []write) ([]ClaimResult, error) {
	for i := range claims {
		if err := checkKey(claims[i].Key); err != nil {
			return nil, p.wrap(fmt.Errorf("claim %d: %w", i, err))
		}
		if err := checkContribution(claims[i].Total, p.totalsBucket); err != nil {
			return nil, p.wrap(fmt.Errorf("claim %d: %w", i, err))
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	b := &batch{
		results: make([]ClaimResult, len(claims)),
		inBatch: make(map[string]Record, len(claims)),
	}
	rtxn := p.db.NewTransaction(false)
	defer rtxn.Discard()
	for i, c := range claims {
		c.At = p.observe(c.At)
		if err := p.claim(rtxn, b, i, c); err != nil {
			return nil, p.wrap(err)
		}
	}
	claimsNew := 0
	for _, r := range b.results {
		if r.New {
			claimsNew++
		}
	}
	if len(extra) > 0 {
		b.claimed = append(b.claimed, claimWrites{writes: extra})
	}
	if err := p.commit(b); err != nil {
		return nil, p.wrap(err)
	}
	p.claims.Add(uint64(len(claims)))
	p.claimsNew.Add(uint64(claimsNew))
	return b.results, nil
}

// batch collects the decisions and writes of one Claim call.
type batch struct {
	results []ClaimResult
	// inBatch maps each key claimed so far in the batch to its record: the
	// one found in the store, or the one this batch writes.
	inBatch map[string]Record
	// claimed holds the writes of each New or refreshed claim, in claim
	// order. A claim's writes commit whole: they never straddle two
	// commits of a split batch.
	claimed []claimWrites
	// at maps each key whose record b writes to its index in claimed, so
	// that a later version of the key in the batch replaces that write.
	at map[string]int
	// totals maps the Badger key of each total the batch wrote to its new
	// absolute value.
	totals map[string]int64
}

// claimWrites is everything one New claim writes: its record and what it
// adds to a total; or, with key nil, the cursor or the watermark alone.
type claimWrites struct {
	key       []byte     // the claim's key, added to the filter after commit; nil for the cursor
	hash      bloom.Hash // key's filter hash if the claim tested it; zero: hash key to add it
	firstSeen time.Time  // the record's FirstSeen, the time key is added to the filter with
	writes    []write
	total     string // Badger key of the total the claim added to, or ""
}

// cursorWrites returns the write of the partition's cursor.
func (p *Partition) cursorWrites(cursor uint64) claimWrites {
	return claimWrites{writes: []write{{key: p.ks.cursor(), value: encodeCursor(cursor)}}}
}

// write is one Badger write. Nothing the partition writes now has a
// Badger TTL: expiry runs on the input's clock (Expire).
type write struct {
	key, value []byte
}

// claim decides claim i of batch b: it reads the store (through rtxn, a
// read transaction opened under the partition lock, so nothing else writes
// meanwhile) unless the filter proves the key new, fills b.results[i], and
// for a New claim appends its claimWrites.
//
// Every write that belongs with a new key (for example the totals it adds)
// goes into the claim's claimWrites, so it commits in the same transaction
// as the key's record.
func (p *Partition) claim(rtxn *badger.Txn, b *batch, i int, c Claim) error {
	if rec, ok := b.inBatch[string(c.Key)]; ok && rec.holds(p.win, c.At) {
		if !c.Versioned || !rec.OlderThan(c.Version) {
			b.results[i] = ClaimResult{Existing: rec, Stale: c.Versioned}
			return nil
		}
		return p.claimNew(rtxn, b, i, c, bloom.Hash{})
	} else if ok {
		return p.claimNew(rtxn, b, i, c, bloom.Hash{}) // the batch's record of the key ended before c.At
	}
	var h bloom.Hash // hashed once: tested now, added after the commit
	if p.filter != nil {
		h = p.filter.Hash(c.Key)
	}
	if !p.filterAnswers(c.At, c.Key) || p.filter.TestHash(h) {
		p.claimStoreReads.Add(1)
		rec, ok, err := readRecord(rtxn, p.ks, c.Key)
		if err != nil {
			return fmt.Errorf("claim %d: %w", i, err)
		}
		if ok && rec.holds(p.win, c.At) && (!c.Versioned || !rec.OlderThan(c.Version)) {
			b.results[i] = ClaimResult{Existing: rec, Stale: c.Versioned}
			b.inBatch[string(c.Key)] = rec
			if p.refresh {
				p.refreshRecord(b, i, c, rec, h)
			}
			return nil
		}
	}
	return p.claimNew(rtxn, b, i, c, h)
}

// claimNew records claim i of batch b as New, h its key's filter hash if
// the claim tested it. A record of the key that b already writes (an
// older version in the same batch) is replaced: its write is dropped.
func (p *Partition) claimNew(rtxn *badger.Txn, b *batch, i int, c Claim, h bloom.Hash) error {
	rec := Record{FirstSeen: c.At, Fingerprint: c.Fingerprint, Version: c.Version, HasVersion: c.Versioned, OutputSeq: c.OutputSeq}
	b.results[i] = ClaimResult{New: true}
	b.inBatch[string(c.Key)] = rec
	cw := claimWrites{
		key:       c.Key,
		hash:      h,
		firstSeen: rec.FirstSeen,
		writes:    []write{{key: p.ks.record(c.Key), value: encodeRecord(rec)}},
	}
	if c.Total.Group != "" {
		v, w, err := p.addTotal(rtxn, b, c.Total)
		if err != nil {
			return fmt.Errorf("claim %d: %w", i, err)
		}
		cw.writes = append(cw.writes, w)
		cw.total = string(w.key)
		b.results[i].Total = v
	}
	b.add(c.Key, cw)
	return nil
}

// refreshRecord rewrites rec, the unexpired record claim i repeats, with
// Refreshed at the claim's time, and marks the result Refreshed.
func (p *Partition) refreshRecord(b *batch, i int, c Claim, rec Record, h bloom.Hash) {
	at := c.At
	if !at.After(rec.WindowStart()) {
		return // the window already runs from at or later
	}
	rec.Refreshed = at
	b.inBatch[string(c.Key)] = rec
	b.results[i].Refreshed = true
	b.add(c.Key, claimWrites{
		key:       c.Key,
		hash:      h,
		firstSeen: at,
		writes:    []write{{key: p.ks.record(c.Key), value: encodeRecord(rec)}},
	})
}

// add appends cw, the writes of a claim of key, to b. When b already
// writes a record of key, that write is dropped (cw's record replaces it;
// a total the earlier claim added stays).
func (b *batch) add(key []byte, cw claimWrites) {
	if b.at == nil {
		b.at = make(map[string]int)
	}
	if j, ok := b.at[string(key)]; ok {
		b.claimed[j].key, b.claimed[j].hash, b.claimed[j].writes = nil, bloom.Hash{}, b.claimed[j].writes[1:]
	}
	b.at[string(key)] = len(b.claimed)
	b.claimed = append(b.claimed, cw)
}

// commit writes b's claimed writes in as few transactions as Badger accepts
// and adds each committed claim's key to the filter with its record's
// FirstSeen.
func (p *Partition) commit(b *batch) error {
	if len(b.claimed) > 0 && p.minFree > 0 {
		if err := checkFreeSpace(p.dir, p.minFree); err != nil {
			return err
		}
	}
	for start := 0; start < len(b.claimed); {
		end, err := p.commitFrom(b.claimed, start)
		if err != nil {
			return err
		}
		if p.filter != nil {
			for _, c := range b.claimed[start:end] {
				switch {
				case !c.hash.IsZero():
					p.filter.AddHash(c.hash, c.firstSeen)
				case c.key != nil:
					p.filter.Add(c.key, c.firstSeen)
				}
			}
		}
		p.markDirty(b.claimed[start:end])
		start = end
	}
	return nil
}

// commitFrom commits claimed[start:end] in one transaction, with end as
// large as fits, and returns end.
func (p *Partition) commitFrom(claimed []claimWrites, start int) (int, error) {
	txn := p.db.NewTransaction(true)
	defer func() { txn.Discard() }()
	end := start
	for ; end < len(claimed); end++ {
		set, err := setClaimWrites(txn, claimed[end])
		if err == nil {
			continue
		}
		if !errors.Is(err, badger.ErrTxnTooBig) || end == start {
			return start, fmt.Errorf("write: %w", err)
		}
		if set == 0 {
			// Badger adds nothing of a write that is too big for txn:
			// txn holds exactly the claims before claimed[end].
			break
		}
		// claimed[end] is partly in txn: redo the whole claims before it in
		// a fresh one.
		txn.Discard()
		txn = p.db.NewTransaction(true)
		for _, c := range claimed[start:end] {
			if _, err := setClaimWrites(txn, c); err != nil {
				return start, fmt.Errorf("write: %w", err)
			}
		}
		break
	}
	if err := txn.Commit(); err != nil {
		return start, fmt.Errorf("commit: %w", err)
	}
	p.commits++
	return end, nil
}

// setClaimWrites sets every write of one claim in txn and returns how many
// it set: on an error, the writes before the failing one are in txn.
func setClaimWrites(txn *badger.Txn, c claimWrites) (int, error) {
	for i, w := range c.writes {
		if err := txn.SetEntry(badger.NewEntry(w.key, w.value)); err != nil {
			return i, err
		}
	}
	return len(c.writes), nil
}
