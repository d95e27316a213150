package state

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/dedupe-stage/dedupe-stage/bloom"
)

// SnapshotFile is the name of a partition's filter snapshot inside its
// directory.
const SnapshotFile = "filter.snap"

// FilterSource tells how a partition's filter was built by Open.
type FilterSource string

// How a partition's filter was built.
const (
	// SourceDisabled: Options.DisableFilter is set; there is no filter.
	SourceDisabled FilterSource = "disabled"
	// SourceSnapshot: loaded from the snapshot, and the store held no
	// record written after it.
	SourceSnapshot FilterSource = "snapshot"
	// SourceSnapshotTopUp: loaded from the snapshot, then topped up with
	// the records written after the Badger version the snapshot covers.
	SourceSnapshotTopUp FilterSource = "snapshot+topup"
	// SourceRebuild: the snapshot was missing, corrupt or mismatched, so the
	// filter was rebuilt from a full scan of the partition.
	SourceRebuild FilterSource = "rebuild"
)

// FilterBuild describes how Open built a partition's filter.
type FilterBuild struct {
	// Source is how the filter was built.
	Source FilterSource
	// Reason says why the snapshot was not used when Source is
	// SourceRebuild; it is empty otherwise.
	Reason string
	// SnapshotVersion is the Badger version the loaded snapshot covered (0
	// unless Source is SourceSnapshot or SourceSnapshotTopUp).
	SnapshotVersion uint64
	// Scanned is how many records the top-up or the full scan read.
	Scanned uint64
	// Added is how many of them were unexpired and added to the filter.
	Added uint64
	// Elapsed is how long the build took (snapshot load included).
	Elapsed time.Duration
	// Fresh is true for a new partition: no snapshot and an empty store,
	// so the filter starts empty (Source is SourceRebuild).
	Fresh bool
}

// FilterOptions returns the options the partition's filter was built with;
// false when Options.DisableFilter is set (there is no filter).
func (p *Partition) FilterOptions() (bloom.Options, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.filter == nil {
		return bloom.Options{}, false
	}
	return p.filter.Options(), true
}

// FilterBuild tells how Open built the partition's filter.
func (p *Partition) FilterBuild() FilterBuild {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.build
}

// buildFilter makes the filter answer "maybe" for every unexpired record in
// the partition: it loads the snapshot and tops it up with the records
// written after the version the snapshot covers, or rebuilds the filter
// from a full scan when the snapshot cannot be used.
func (p *Partition) buildFilter(ctx context.Context) error {
	start := time.Now()
	snapPath := filepath.Join(p.dir, SnapshotFile)
	f, meta, err := loadSnapshot(snapPath, p.fopts)
	if err == nil {
		if maxV := p.version(); meta > maxV {
			err = fmt.Errorf("snapshot covers store version %d but the store ends at version %d (writes lost after the snapshot?)", meta, maxV)
		}
	}
	if err == nil {
		err = snapshotHolds(p.db, p.ks, f, meta)
	}
	var b FilterBuild
	var unreadable map[string]struct{}
	if err == nil {
		b = FilterBuild{Source: SourceSnapshot, SnapshotVersion: meta}
		pr := p.newProgress(SourceSnapshotTopUp, 0)
		if b.Scanned, b.Added, unreadable, err = scanInto(ctx, p.db, p.ks, f, meta, p.log, pr.tick); err != nil {
			return fmt.Errorf("top up filter from version %d: %w", meta, err)
		}
		pr.done(b.Scanned, b.Added)
		if b.Scanned > 0 {
			b.Source = SourceSnapshotTopUp
		} else {
			p.snapMu.Lock()
			p.snapVersion, p.snapOnDisk, p.snapCommits = meta, true, 0
			p.snapMu.Unlock()
		}
	} else {
		fresh := errors.Is(err, fs.ErrNotExist) && p.empty() == nil
		if fresh {
			p.log.Debug("state: new partition, starting with an empty filter", "path", snapPath)
		} else {
			p.log.Warn("state: filter snapshot unusable, rebuilding the filter from the store", "path", snapPath, "err", err)
		}
		b = FilterBuild{Source: SourceRebuild, Reason: err.Error(), Fresh: fresh}
		// The ring starts before every time: the first record added or
		// copy judged moves it (Partition.observe), on the input's clock.
		if f, err = bloom.New(p.fopts, time.Time{}); err != nil {
			return fmt.Errorf("new filter: %w", err)
		}
		pr := p.newProgress(SourceRebuild, estimateRecords(p.db, p.ks, p.partitions))
		if b.Scanned, b.Added, unreadable, err = scanInto(ctx, p.db, p.ks, f, 0, p.log, pr.tick); err != nil {
			return fmt.Errorf("rebuild filter: %w", err)
		}
		pr.done(b.Scanned, b.Added)
	}
	b.Elapsed = time.Since(start)
	p.mu.Lock()
	p.filter, p.build, p.unreadable = f, b, unreadable
	p.mu.Unlock()
	// A new partition's empty filter is logged once for the store (Open).
	level := slog.LevelInfo
	if b.Fresh {
		level = slog.LevelDebug
	}
	p.log.Log(ctx, level, "state: filter ready", "source", string(b.Source), "snapshot_version", b.SnapshotVersion,
		"scanned", b.Scanned, "added", b.Added, "elapsed", b.Elapsed)
	return nil
}

// loadSnapshot reads the filter snapshot at path.
func loadSnapshot(path string, opts bloom.Options) (*bloom.Filter, uint64, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer fh.Close()
	return bloom.ReadSnapshot(bufio.NewReaderSize(fh, 1<<20), opts)
}

// scanInto adds to f every record written after version since (0 = all),
// at its window start, advancing f to the newest of them first (the
// filter's ring runs on the input's clock, which the records carry; one
// whose window start is before f.Since is left out, and a copy that could
// repeat it reads the store). A record that cannot be decoded is logged and
// its key returned in unreadable, whose keys always read the store (the
// filter must not say "definitely not" for a key the store holds). It
// returns how many records it read and how many it added. It calls tick with the counts every
// progressEveryRecords records.
func scanInto(ctx context.Context, db *badger.DB, ks keyspace, f *bloom.Filter, since uint64, log *slog.Logger, tick func(scanned, added uint64)) (scanned, added uint64, unreadable map[string]struct{}, err error) {
	txn := db.NewTransaction(false)
	defer txn.Discard()
	it := txn.NewIterator(badger.IteratorOptions{Prefix: ks.kind(prefixRecord), SinceTs: since})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		if scanned%progressEveryRecords == 0 {
			if err := ctx.Err(); err != nil {
				return scanned, added, nil, err
			}
			if scanned > 0 {
				tick(scanned, added)
			}
		}
		scanned++
		item := it.Item()
		key := userKey(item.Key())
		var rec Record
		err := item.Value(func(v []byte) error {
			var derr error
			rec, derr = decodeRecord(v)
			return derr
		})
		if err != nil {
			log.Warn("state: unreadable record: its key always reads the store", "key", fmt.Sprintf("%q", key), "err", err)
			if unreadable == nil {
				unreadable = make(map[string]struct{})
			}
			unreadable[string(key)] = struct{}{}
			continue
		}
		start := rec.WindowStart()
		f.Advance(start)
		if !start.Before(f.Since()) {
			f.Add(key, start)
			added++
		}
	}
	return scanned, added, unreadable, nil
}

// snapshot writes the filter to the partition's snapshot file atomically.
// The filter and the Badger version it covers are captured together under
// the partition lock, so every record with a version up to meta is in the
// snapshot. With closing, the partition is marked closed in the same lock
// hold, so no Claim can slip in after the capture.
func (p *Partition) snapshot(closing bool) error {
	p.snapMu.Lock()
	defer p.snapMu.Unlock()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = closing
	if p.filter == nil {
		p.mu.Unlock()
		return nil
	}
	meta, commits := p.version(), p.commits
	if p.snapOnDisk && commits == p.snapCommits {
		// Nothing written since: the file on disk still covers the
		// partition (the filter has at most rotated, which loading redoes).
		p.mu.Unlock()
		return nil
	}
	var buf bytes.Buffer
	_, err := p.filter.WriteSnapshot(&buf, meta)
	p.mu.Unlock()
	if err != nil {
		return p.wrap(fmt.Errorf("encode filter snapshot: %w", err))
	}
	if err := writeFileAtomic(filepath.Join(p.dir, SnapshotFile), buf.Bytes()); err != nil {
		return p.wrap(err)
	}
	p.snapVersion, p.snapOnDisk, p.snapCommits = meta, true, commits
	return nil
}

// progressEveryRecords is how many records a filter build reads between
// looks at the clock (and at its context).
const progressEveryRecords = 4096

// FilterProgress is how far the filter build of one partition at Open has
// got: a rebuild from a full scan, or the top-up of a loaded snapshot.
type FilterProgress struct {
	// Partition is the partition's index.
	Partition int
	// Source is SourceRebuild or SourceSnapshotTopUp.
	Source FilterSource
	// Scanned is how many records the build has read so far; Added how
	// many of them were unexpired and went into the filter.
	Scanned, Added uint64
	// EstimatedRecords is about how many records a rebuild has to read,
	// from the key counts of Badger's tables (keys still in memtables are
	// not counted); 0 when unknown, as for a top-up.
	EstimatedRecords uint64
	// Elapsed is the time since the scan started.
	Elapsed time.Duration
	// Done is true for the last report, when the scan has ended.
	Done bool
}

// Rate is the records read per second so far; 0 before any time passed.
func (fp FilterProgress) Rate() float64 {
	if fp.Elapsed <= 0 {
		return 0
	}
	return float64(fp.Scanned) / fp.Elapsed.Seconds()
}

// Remaining is the estimated time left at the current rate, rounded to a
// second; 0 when unknown (no estimate, no rate yet, or more read than
// estimated) or when Done.
func (fp FilterProgress) Remaining() time.Duration {
	r := fp.Rate()
	if fp.Done || r <= 0 || fp.EstimatedRecords <= fp.Scanned {
		return 0
	}
	return (time.Duration(float64(fp.EstimatedRecords-fp.Scanned)/r) * time.Second).Round(time.Second)
}

// progress reports one partition's filter build every
// Options.FilterProgressInterval: a log line at info and a call of
// Options.OnFilterProgress; and once more, to OnFilterProgress only, when
// it is done.
type progress struct {
	p         *Partition
	source    FilterSource
	estimated uint64
	start     time.Time
	next      time.Time
}

func (p *Partition) newProgress(source FilterSource, estimated uint64) *progress {
	now := time.Now()
	return &progress{p: p, source: source, estimated: estimated, start: now, next: now.Add(p.progressEvery)}
}

// tick reports the counts if the interval has passed since the last report.
func (pr *progress) tick(scanned, added uint64) {
	now := time.Now()
	if now.Before(pr.next) {
		return
	}
	pr.next = now.Add(pr.p.progressEvery)
	fp := pr.report(scanned, added, now, false)
	args := []any{"source", string(fp.Source), "scanned", fp.Scanned, "added", fp.Added,
		"rate_per_second", int64(fp.Rate()), "elapsed", fp.Elapsed.Round(time.Millisecond)}
	if fp.EstimatedRecords > 0 {
		args = append(args, "estimated_records", fp.EstimatedRecords)
	}
	if left := fp.Remaining(); left > 0 {
		args = append(args, "estimated_time_left", left)
	}
	pr.p.log.Info("state: building filter", args...)
}

// done reports the final counts.
func (pr *progress) done(scanned, added uint64) {
	pr.report(scanned, added, time.Now(), true)
}

func (pr *progress) report(scanned, added uint64, now time.Time, done bool) FilterProgress {
	fp := FilterProgress{Partition: pr.p.index, Source: pr.source, Scanned: scanned, Added: added,
		EstimatedRecords: pr.estimated, Elapsed: now.Sub(pr.start), Done: done}
	if pr.p.onProgress != nil {
		pr.p.onProgress(fp)
	}
	return fp
}

// estimateRecords is about the number of keys of keyspace ks in db's
// tables: about the records a full scan of the partition reads (it also
// counts totals, the cursor and older versions, and misses what is still
// in memtables). A table whose keys span several keyspaces counts an even
// share of its keys for each of the store's partitions among them (the
// store's own keys, above them, count for its last).
func estimateRecords(db *badger.DB, ks keyspace, partitions int) uint64 {
	want := binary.BigEndian.Uint16(ks[:])
	var n uint64
	for _, t := range db.Tables() {
		if len(t.Left) < keyspaceLen || len(t.Right) < keyspaceLen {
			continue
		}
		lo, hi := binary.BigEndian.Uint16(t.Left), binary.BigEndian.Uint16(t.Right)
		hi = min(hi, uint16(max(partitions, 1)-1))
		if lo <= want && want <= hi {
			n += uint64(t.KeyCount) / uint64(hi-lo+1)
		}
	}
	return n
}
