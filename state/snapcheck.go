package state

import (
	"fmt"

	"github.com/dgraph-io/badger/v4"

	"github.com/dedupe-stage/dedupe-stage/bloom"
)

// Bounds of snapshotHolds: records checked, records visited.
const (
	snapshotCheckRecords = 256
	snapshotCheckVisits  = 4096
)

// snapshotHolds checks a loaded snapshot f, covering store version meta,
// against the store: the first snapshotCheckRecords records in key order
// written at a version up to meta, readable and with a window start the
// filter still covers (bloom.Filter.Since), must each test "maybe" in f, as they did in the filter the snapshot was
// taken of. An intact snapshot of another partition or store passes the
// checksum and the version check but fails this one.
func snapshotHolds(db *badger.DB, ks keyspace, f *bloom.Filter, meta uint64) error {
	since := f.Since()
	txn := db.NewTransaction(false)
	defer txn.Discard()
	it := txn.NewIterator(badger.IteratorOptions{Prefix: ks.kind(prefixRecord)})
	defer it.Close()
	checked, visited := 0, 0
	for it.Rewind(); it.Valid() && checked < snapshotCheckRecords && visited < snapshotCheckVisits; it.Next() {
		visited++
		item := it.Item()
		if item.Version() > meta {
			continue
		}
		var rec Record
		err := item.Value(func(v []byte) (derr error) {
			rec, derr = decodeRecord(v)
			return derr
		})
		if err != nil || rec.WindowStart().Before(since) {
			continue
		}
		checked++
		if key := userKey(item.Key()); !f.Test(key) {
			return fmt.Errorf("snapshot lacks key %q, recorded at store version %d (the snapshot covers %d): it is not this partition's", key, item.Version(), meta)
		}
	}
	return nil
}
