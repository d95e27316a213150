package state

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// DefaultTotalsKeep is the default of Options.TotalsKeep.
const DefaultTotalsKeep = 24 * time.Hour

// MaxGroupSize is the longest accepted Contribution.Group in bytes.
const MaxGroupSize = 4096

// Contribution is what a New claim adds to the total of its (group, time
// bucket). The zero value (empty Group) means the claim adds to no total.
type Contribution struct {
	// Group is the group key, 1..MaxGroupSize bytes; empty means no
	// contribution.
	Group string
	// Bucket is the start of the time bucket: a whole number of Unix
	// seconds divisible by Options.TotalsBucket (see BucketOf).
	Bucket time.Time
	// Value is added to the total; >= 0 (1 for a count). A sum that would
	// pass math.MaxInt64 stays at math.MaxInt64.
	Value int64
}

// TotalRecord is the absolute total of one (group, bucket) pair.
type TotalRecord struct {
	// Group is the group key.
	Group string
	// Bucket is the start of the time bucket, in UTC.
	Bucket time.Time
	// Value is the sum of the contributions of every New claim of the pair
	// that the store still holds.
	Value int64
}

// BucketOf returns the start of the bucket of length size that holds t:
// t's Unix seconds rounded down to a multiple of size's seconds (buckets
// are aligned to the Unix epoch, in UTC). size must be a whole number of
// seconds, at least one.
func BucketOf(t time.Time, size time.Duration) time.Time {
	secs := int64(size / time.Second)
	u := t.Unix()
	b := u - u%secs
	if u%secs < 0 {
		b -= secs
	}
	return time.Unix(b, 0).UTC()
}

// totalsVersion is the version byte of an encoded total.
const (
	totalsVersion = 1
	totalLen      = 1 + 8
)

// total returns the Badger key of a (group, bucket) total: the keyspace,
// 't', the bucket's Unix seconds as a big-endian uint64 with the sign bit flipped (so
// keys sort by time), then the group.
func (ks keyspace) total(group string, bucket time.Time) []byte {
	k := make([]byte, keyspaceLen+1+8+len(group))
	copy(k, ks[:])
	t := k[keyspaceLen:]
	t[0] = prefixTotal
	binary.BigEndian.PutUint64(t[1:9], uint64(bucket.Unix())^(1<<63))
	copy(t[9:], group)
	return k
}

// parseTotalKey inverts keyspace.total (whatever the keyspace).
func parseTotalKey(k []byte) (group string, bucket time.Time, err error) {
	if len(k) < keyspaceLen+10 || k[keyspaceLen] != prefixTotal {
		return "", time.Time{}, fmt.Errorf("%w: total key %q", ErrCorruptRecord, k)
	}
	k = k[keyspaceLen:]
	secs := int64(binary.BigEndian.Uint64(k[1:9]) ^ (1 << 63))
	return string(k[9:]), time.Unix(secs, 0).UTC(), nil
}

// encodeTotal encodes v as version byte 1 and v as a big-endian int64.
func encodeTotal(v int64) []byte {
	b := make([]byte, totalLen)
	b[0] = totalsVersion
	binary.BigEndian.PutUint64(b[1:], uint64(v))
	return b
}

// decodeTotal decodes a value written by encodeTotal; anything else wraps
// ErrCorruptRecord.
func decodeTotal(b []byte) (int64, error) {
	if len(b) != totalLen || b[0] != totalsVersion {
		return 0, fmt.Errorf("%w: total value of %d bytes (version %v), want %d bytes of version %d",
			ErrCorruptRecord, len(b), firstByte(b), totalLen, totalsVersion)
	}
	return int64(binary.BigEndian.Uint64(b[1:])), nil
}

func firstByte(b []byte) any {
	if len(b) == 0 {
		return "none"
	}
	return b[0]
}

// readTotal reads the total under Badger key k in txn; a missing key is 0.
func readTotal(txn *badger.Txn, k []byte) (int64, error) {
	item, err := txn.Get(k)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read total %q: %w", k, err)
	}
	var v int64
	err = item.Value(func(b []byte) error {
		var derr error
		v, derr = decodeTotal(b)
		return derr
	})
	return v, err
}

// checkContribution reports why c cannot be added by a partition whose
// buckets are bucket long (0: totals off), or nil. The zero Contribution is
// valid (it adds nothing).
func checkContribution(c Contribution, bucket time.Duration) error {
	if c.Group == "" {
		return nil
	}
	switch {
	case bucket <= 0:
		return fmt.Errorf("%w: a contribution to group %q, but Options.TotalsBucket is 0 (totals off)", ErrBadTotal, c.Group)
	case len(c.Group) > MaxGroupSize:
		return fmt.Errorf("%w: group of %d bytes, want <= %d", ErrBadTotal, len(c.Group), MaxGroupSize)
	case c.Value < 0:
		return fmt.Errorf("%w: group %q: negative value %d", ErrBadTotal, c.Group, c.Value)
	case c.Bucket.Nanosecond() != 0 || !c.Bucket.Equal(BucketOf(c.Bucket, bucket)):
		return fmt.Errorf("%w: group %q: bucket %s is not the start of a %v bucket", ErrBadTotal, c.Group, c.Bucket.UTC().Format(time.RFC3339Nano), bucket)
	}
	return nil
}

// addTotal adds c to its total inside batch b: the total is the value this
// batch already wrote for the pair, else the stored one (read through rtxn).
// It returns the new absolute value and the write that stores it.
func (p *Partition) addTotal(rtxn *badger.Txn, b *batch, c Contribution) (int64, write, error) {
	k := p.ks.total(c.Group, c.Bucket)
	cur, ok := b.totals[string(k)]
	if !ok {
		var err error
		if cur, err = readTotal(rtxn, k); err != nil {
			return 0, write{}, err
		}
	}
	next := cur + c.Value
	if c.Value > math.MaxInt64-cur {
		next = math.MaxInt64
	}
	if b.totals == nil {
		b.totals = make(map[string]int64)
	}
	b.totals[string(k)] = next
	return next, write{key: k, value: encodeTotal(next)}, nil
}

// totalKeptUntil is when a total of the bucket starting at bucket may be
// removed (Expire): once the bucket is closed (bucket end + W), TotalsKeep
// later, on the input's clock.
func (p *Partition) totalKeptUntil(bucket time.Time) time.Time {
	return bucket.Add(p.totalsBucket).Add(p.win.W).Add(p.totalsKeep)
}

// markDirty records that the totals written by the claims in claimed
// changed; called under p.mu after they committed.
func (p *Partition) markDirty(claimed []claimWrites) {
	for _, c := range claimed {
		if c.total == "" {
			continue
		}
		if p.dirty == nil {
			p.dirty = make(map[string]struct{})
		}
		p.dirty[c.total] = struct{}{}
	}
}

// TakeDirtyTotals returns the absolute totals of every (group, bucket) pair
// that a Claim changed since the last TakeDirtyTotals, read from the store
// now, ordered by bucket then group, and forgets that they changed. A pair
// whose total Badger has already dropped (past its TTL) is left out. If the
// caller cannot deliver them it must hand them back with MarkTotalsDirty.
// On an error nothing is forgotten. The set of changed pairs lives in
// memory only: it is empty after Open (see ScanTotals).
func (p *Partition) TakeDirtyTotals() ([]TotalRecord, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	if len(p.dirty) == 0 {
		return nil, nil
	}
	out := make([]TotalRecord, 0, len(p.dirty))
	err := p.db.View(func(txn *badger.Txn) error {
		for k := range p.dirty {
			item, err := txn.Get([]byte(k))
			if errors.Is(err, badger.ErrKeyNotFound) {
				continue
			}
			if err != nil {
				return fmt.Errorf("read total %q: %w", k, err)
			}
			r, err := totalRecord(item)
			if err != nil {
				return err
			}
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, p.wrap(err)
	}
	clear(p.dirty)
	sortTotals(out)
	return out, nil
}

// MarkTotalsDirty marks the pairs of recs as changed again, so that the next
// TakeDirtyTotals returns them (with their values at that time). Use it
// when a flush of what TakeDirtyTotals returned failed.
func (p *Partition) MarkTotalsDirty(recs []TotalRecord) {
	if len(recs) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dirty == nil {
		p.dirty = make(map[string]struct{}, len(recs))
	}
	for _, r := range recs {
		p.dirty[string(p.ks.total(r.Group, r.Bucket))] = struct{}{}
	}
}

// DirtyTotals returns how many (group, bucket) pairs changed since the last
// TakeDirtyTotals.
func (p *Partition) DirtyTotals() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.dirty)
}

// Total returns the absolute total of (group, bucket); found is false when
// the partition holds none (never contributed to, or dropped past its TTL).
func (p *Partition) Total(group string, bucket time.Time) (value int64, found bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, false, ErrClosed
	}
	err = p.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(p.ks.total(group, bucket))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		r, err := totalRecord(item)
		value, found = r.Value, err == nil
		return err
	})
	if err != nil {
		return 0, false, p.wrap(err)
	}
	return value, found, nil
}

// ScanTotals calls fn with every total the partition holds whose bucket
// starts at or after since, in bucket then group order, and stops at fn's
// first error, which it returns. It holds the partition lock (claims wait)
// for the whole scan. A value that cannot be decoded stops the scan with an
// error wrapping ErrCorruptRecord.
func (p *Partition) ScanTotals(ctx context.Context, since time.Time, fn func(TotalRecord) error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	txn := p.db.NewTransaction(false)
	defer txn.Discard()
	it := txn.NewIterator(badger.IteratorOptions{Prefix: p.ks.kind(prefixTotal), PrefetchValues: true, PrefetchSize: 100})
	defer it.Close()
	start := p.ks.total("", since)
	n := 0
	for it.Seek(start); it.Valid(); it.Next() {
		if n++; n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		r, err := totalRecord(it.Item())
		if err != nil {
			return p.wrap(err)
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

// totalRecord decodes a total item.
func totalRecord(item *badger.Item) (TotalRecord, error) {
	group, bucket, err := parseTotalKey(item.Key())
	if err != nil {
		return TotalRecord{}, err
	}
	var v int64
	err = item.Value(func(b []byte) error {
		var derr error
		v, derr = decodeTotal(b)
		return derr
	})
	if err != nil {
		return TotalRecord{}, fmt.Errorf("total of group %q bucket %s: %w", group, bucket.Format(time.RFC3339), err)
	}
	return TotalRecord{Group: group, Bucket: bucket, Value: v}, nil
}

func sortTotals(recs []TotalRecord) {
	slices.SortFunc(recs, func(a, b TotalRecord) int {
		if c := a.Bucket.Compare(b.Bucket); c != 0 {
			return c
		}
		return cmp.Compare(a.Group, b.Group)
	})
}

// ScanTotals calls fn with every total the store holds whose bucket starts
// at or after since, partition by partition (each in bucket then group
// order), and stops at the first error. See Partition.ScanTotals.
func (s *Store) ScanTotals(ctx context.Context, since time.Time, fn func(TotalRecord) error) error {
	for _, p := range s.parts {
		if err := p.ScanTotals(ctx, since, fn); err != nil {
			return err
		}
	}
	return nil
}

// DirtyTotals returns the number of (group, bucket) pairs changed and not
// yet taken, summed over the partitions.
func (s *Store) DirtyTotals() int {
	n := 0
	for _, p := range s.parts {
		n += p.DirtyTotals()
	}
	return n
}
