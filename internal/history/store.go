package history

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

// record is what analyze keeps of a key: the input time its age is
// measured from (its first copy's, or with refresh_on_repeat its last
// repeat's), its payload fingerprint and its version.
type record struct {
	at        int64  // Unix nanoseconds
	seq       uint64 // the copy's stream sequence
	fp        uint64
	version   uint64
	versioned bool
}

const recordBytes = 33

func (r record) encode(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(r.at))
	b = binary.LittleEndian.AppendUint64(b, r.seq)
	b = binary.LittleEndian.AppendUint64(b, r.fp)
	b = binary.LittleEndian.AppendUint64(b, r.version)
	if r.versioned {
		return append(b, 1)
	}
	return append(b, 0)
}

func decodeRecord(b []byte) (record, error) {
	if len(b) != recordBytes {
		return record{}, fmt.Errorf("history: record of %d bytes, want %d", len(b), recordBytes)
	}
	return record{at: int64(binary.LittleEndian.Uint64(b)), seq: binary.LittleEndian.Uint64(b[8:]), fp: binary.LittleEndian.Uint64(b[16:]),
		version: binary.LittleEndian.Uint64(b[24:]), versioned: b[32] == 1}, nil
}

// pendingMax bounds the records held in memory before they are written to
// Badger: about 100 bytes each with a key of 30 bytes. A variable for the
// tests.
var pendingMax = 200_000

// keyStore is each key's record in a Badger database in a temporary
// directory, removed by close: its memory is bounded (small memtables,
// no caches, pendingMax records waiting) whatever the history holds.
type keyStore struct {
	dir     string
	db      *badger.DB
	read    *badger.Txn
	pending map[string]record
	buf     []byte
}

// openKeyStore opens a key store in a new directory under parent ("" for
// the system's temporary directory).
func openKeyStore(parent string) (*keyStore, error) {
	dir, err := os.MkdirTemp(parent, "dedupe-analyze-")
	if err != nil {
		return nil, fmt.Errorf("history: temporary key store: %w", err)
	}
	o := badger.DefaultOptions(dir).
		WithLogger(nil).
		WithSyncWrites(false).
		WithCompression(options.None).
		WithMemTableSize(16 << 20).
		WithNumMemtables(2).
		WithNumLevelZeroTables(2).
		WithNumLevelZeroTablesStall(8).
		WithBaseTableSize(4 << 20).
		WithBlockCacheSize(0).
		// Without an index cache Badger keeps every table's index and
		// Bloom filter in memory, growing with the history; a cache
		// bounds them.
		WithIndexCacheSize(32 << 20).
		WithValueThreshold(1 << 10).
		WithNumCompactors(2).
		WithDetectConflicts(false)
	db, err := badger.Open(o)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("history: open temporary key store in %s: %w", dir, err)
	}
	return &keyStore{dir: dir, db: db, read: db.NewTransaction(false), pending: make(map[string]record, pendingMax)}, nil
}

// get returns key's record, ok false when the store has none.
func (s *keyStore) get(key []byte) (record, bool, error) {
	if r, ok := s.pending[string(key)]; ok {
		return r, true, nil
	}
	item, err := s.read.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, fmt.Errorf("history: read key store: %w", err)
	}
	var r record
	err = item.Value(func(v []byte) error {
		r, err = decodeRecord(v)
		return err
	})
	return r, err == nil, err
}

// put sets key's record.
func (s *keyStore) put(key []byte, r record) error {
	s.pending[string(key)] = r
	if len(s.pending) >= pendingMax {
		return s.flush()
	}
	return nil
}

// flush writes the pending records to Badger and reads from there on.
func (s *keyStore) flush() error {
	if len(s.pending) == 0 {
		return nil
	}
	wb := s.db.NewWriteBatch()
	for k, r := range s.pending {
		s.buf = r.encode(s.buf[:0])
		if err := wb.Set([]byte(k), append([]byte(nil), s.buf...)); err != nil {
			wb.Cancel()
			return fmt.Errorf("history: write key store: %w", err)
		}
	}
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("history: write key store: %w", err)
	}
	clear(s.pending)
	s.read.Discard()
	s.read = s.db.NewTransaction(false)
	return nil
}

// close closes the store and removes its directory.
func (s *keyStore) close() error {
	s.read.Discard()
	err := s.db.Close()
	if rerr := os.RemoveAll(s.dir); err == nil && rerr != nil {
		err = fmt.Errorf("history: remove temporary key store %s: %w", s.dir, rerr)
	}
	return err
}
