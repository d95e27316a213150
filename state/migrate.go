package state

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// migrate moves a data dir written with one Badger instance per partition
// into db, the shared instance, and records the shared layout in
// LayoutFile; a crash at any point leaves what the next call copies again
// (docs/state.md).
func migrate(ctx context.Context, opts Options, db *badger.DB, have layout) error {
	var old []int
	for i := range opts.Partitions {
		dir := PartitionDir(opts.Dir, i)
		_, err := os.Stat(filepath.Join(dir, badger.ManifestFilename))
		switch {
		case err == nil:
			old = append(old, i)
		case !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("state: partition %d: dir is not usable: %w", i, err)
		default:
			// What a crash in removeOldBadger left, if anything.
			if err := removeBadgerFiles(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("state: partition %d: dir is not usable: %w", i, err)
			}
		}
	}
	if len(old) > 0 {
		opts.Logger.Warn("state: moving partitions written one Badger instance per partition into one",
			"partitions", len(old), "to", filepath.Join(opts.Dir, BadgerDir))
	}
	for _, i := range old {
		if err := migratePartition(ctx, opts, db, i); err != nil {
			return fmt.Errorf("state: partition %d: move into %s: %w", i, BadgerDir, err)
		}
	}
	if err := db.Sync(); err != nil {
		return fmt.Errorf("state: sync badger after moving partitions: %w", err)
	}
	if !have.shared {
		have.shared = true
		if err := writeFileAtomic(filepath.Join(opts.Dir, LayoutFile), formatLayout(have)); err != nil {
			return fmt.Errorf("state: data dir %q is not usable: %w", opts.Dir, err)
		}
	}
	for _, i := range old {
		if err := removeOldBadger(PartitionDir(opts.Dir, i)); err != nil {
			return fmt.Errorf("state: partition %d: remove what was moved into %s: %w", i, BadgerDir, err)
		}
	}
	return nil
}

// migratePartition copies every key of partition i's own Badger instance
// into its keyspace of db.
func migratePartition(ctx context.Context, opts Options, db *badger.DB, i int) error {
	start := time.Now()
	dir := PartitionDir(opts.Dir, i)
	log := opts.Logger.With("partition", i)
	if _, err := removeEmptyLogFiles(dir); err != nil {
		return err
	}
	// Read only, but Badger opens its memtable log for writes (a kill may
	// have left one to replay), so no compactor rewrites what is read.
	src, err := badger.Open(badgerOptions(opts, dir, log).WithNumCompactors(0))
	if err != nil {
		if strings.Contains(err.Error(), "Cannot acquire directory lock") {
			return fmt.Errorf("%w: dir %q: %v", ErrLocked, dir, err)
		}
		return fmt.Errorf("open badger in %q: %w", dir, err)
	}
	defer src.Close()
	ks := keyspaceOf(i)
	wb := db.NewWriteBatch()
	defer wb.Cancel()
	txn := src.NewTransaction(false)
	defer txn.Discard()
	n, err := eachItem(ctx, txn, nil, func(item *badger.Item) error {
		v, err := item.ValueCopy(nil)
		if err != nil {
			return fmt.Errorf("read key %q: %w", item.Key(), err)
		}
		e := badger.NewEntry(append(ks[:], item.Key()...), v).WithMeta(item.UserMeta())
		e.ExpiresAt = item.ExpiresAt()
		if err := wb.SetEntry(e); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	log.Info("state: partition moved into the shared Badger instance", "keys", n, "elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

// removeOldBadger removes a partition directory's own Badger instance and
// its filter snapshot, which covers that instance's versions: the snapshot
// first, then the manifest (without which the directory holds no instance),
// then the rest of Badger's files.
func removeOldBadger(dir string) error {
	for _, name := range []string{SnapshotFile, badger.ManifestFilename} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	return removeBadgerFiles(dir)
}

// removeBadgerFiles removes the files of a Badger instance from dir.
func removeBadgerFiles(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if name := e.Name(); e.Type().IsRegular() && isBadgerFile(name) {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return err
			}
		}
	}
	return nil
}

// isBadgerFile reports whether name is one of the files of a Badger
// instance's directory.
func isBadgerFile(name string) bool {
	switch name {
	case badger.KeyRegistryFileName, "DISCARD", "LOCK", badger.ManifestFilename:
		return true
	}
	for _, ext := range []string{".sst", ".vlog", ".mem"} {
		if strings.HasSuffix(name, ext) {
			return true
		}
	}
	return false
}
