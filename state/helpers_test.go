package state

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// testWindow is a one-hour window.
func testWindow(tb testing.TB) window.Window {
	tb.Helper()
	w, err := window.Derive([]window.Path{{Name: "client-retry", Max: 50 * time.Minute}}, 10*time.Minute)
	if err != nil {
		tb.Fatalf("derive window: %v", err)
	}
	return w
}

// testOptions returns options for a small store in dir: no syncs, no
// background goroutines, a modest memory budget, a filter sized for 100k
// keys and a discarded log.
func testOptions(tb testing.TB, dir string, partitions int) Options {
	tb.Helper()
	o := DefaultOptions(dir, testWindow(tb))
	o.Partitions = partitions
	o.SyncWrites = false
	o.GCInterval = 0
	o.SnapshotInterval = 0
	o.MemoryBudget = 8 << 20 * int64(partitions)
	o.Filter.ExpectedKeys = 100_000
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return o
}

// filterOnAndOff runs fn as two subtests, "filter=on" and "filter=off", each
// with the options of a one-partition store in its own directory, with
// Options.DisableFilter set accordingly and a manual clock at time.Now().
func filterOnAndOff(t *testing.T, fn func(t *testing.T, opts Options, clock *window.ManualClock)) {
	for _, disable := range []bool{false, true} {
		t.Run(map[bool]string{false: "filter=on", true: "filter=off"}[disable], func(t *testing.T) {
			opts := testOptions(t, t.TempDir(), 1)
			opts.DisableFilter = disable
			clock := window.NewManualClock(time.Now())
			opts.Clock = clock
			fn(t, opts, clock)
		})
	}
}

// openStore opens a store and closes it at the end of the test.
func openStore(tb testing.TB, opts Options) *Store {
	tb.Helper()
	s, err := Open(context.Background(), opts)
	if err != nil {
		tb.Fatalf("Open(%s): %v", opts.Dir, err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("Close(%s): %v", opts.Dir, err)
		}
	})
	return s
}

// testKeys returns n distinct keys with the given prefix.
func testKeys(prefix string, n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%s-%08d", prefix, i)
	}
	return keys
}

// claimAll claims keys (routed by themselves) in batches of up to 512 per
// partition and fails unless every claim is New.
func claimAll(tb testing.TB, s *Store, keys [][]byte) {
	tb.Helper()
	claimAllSeq(tb, s, keys, 0)
}

// claimAllSeq is claimAll with each claim's OutputSeq seq+i+1, as the
// stage claims forwards; seq 0 claims without one.
func claimAllSeq(tb testing.TB, s *Store, keys [][]byte, seq uint64) {
	tb.Helper()
	byPart := make([][]Claim, s.Partitions())
	for i, k := range keys {
		p := PartitionOf(k, s.Partitions())
		c := Claim{Key: k, Fingerprint: uint64(i)}
		if seq > 0 {
			c.OutputSeq = seq + uint64(i) + 1
		}
		byPart[p] = append(byPart[p], c)
	}
	for p, claims := range byPart {
		for len(claims) > 0 {
			n := min(len(claims), 512)
			res, err := s.Partition(p).Claim(claims[:n])
			if err != nil {
				tb.Fatalf("Claim on partition %d: %v", p, err)
			}
			for i, r := range res {
				if !r.New {
					tb.Fatalf("claim of %q on partition %d: New=false (existing %+v), want true", claims[i].Key, p, r.Existing)
				}
			}
			claims = claims[n:]
		}
	}
}

// assertAllSeen fails unless every key is Found and its filter said maybe.
func assertAllSeen(tb testing.TB, s *Store, keys [][]byte) {
	tb.Helper()
	missed := 0
	for _, k := range keys {
		r, err := s.Partition(PartitionOf(k, s.Partitions())).Lookup(k, time.Time{})
		if err != nil {
			tb.Fatalf("Lookup(%q): %v", k, err)
		}
		if !r.FilterSaidMaybe || !r.Found {
			if missed < 5 {
				tb.Errorf("Lookup(%q) = %+v, want FilterSaidMaybe and Found", k, r)
			}
			missed++
		}
	}
	if missed > 0 {
		tb.Fatalf("%d of %d claimed keys not seen after reopen", missed, len(keys))
	}
}

// assertSources fails unless every partition's filter was built from want.
func assertSources(tb testing.TB, s *Store, want FilterSource) {
	tb.Helper()
	for i := range s.Partitions() {
		if b := s.Partition(i).FilterBuild(); b.Source != want {
			tb.Errorf("partition %d: filter built from %q (reason %q), want %q", i, b.Source, b.Reason, want)
		}
	}
}

// copyDir copies the regular files under src to dst, as a backup tool or a
// kill -9 followed by a restart would leave them.
//
// A kill -9 leaves the directory as it was at one instant. A copy taken file
// by file is that only if nothing changed while it was taken: Badger may
// still flush a memtable (deleting its file) or rewrite its MANIFEST, and a
// periodic snapshot may be renamed into place. So the copy is retried until
// one pass starts and ends with the same listing (names, sizes, modification
// times) and met no file that vanished.
func copyDir(tb testing.TB, src, dst string) {
	tb.Helper()
	natstest.Poll(tb, 30*time.Second, 10*time.Millisecond, "a consistent copy of "+src, func() (bool, error) {
		before, err := listDir(src)
		if err != nil {
			tb.Fatalf("list %s: %v", src, err)
		}
		if err := os.RemoveAll(dst); err != nil {
			tb.Fatal(err)
		}
		err = copyDirOnce(src, dst)
		if err == nil {
			after, lerr := listDir(src)
			if lerr != nil {
				tb.Fatalf("list %s: %v", src, lerr)
			}
			if maps.Equal(before, after) {
				return true, nil
			}
			err = errors.New("the directory changed during the copy")
		} else if !errors.Is(err, fs.ErrNotExist) {
			tb.Fatalf("copy %s to %s: %v", src, dst, err)
		}
		return false, err
	})
}

// listDir returns every regular file under dir with its size and
// modification time.
func listDir(dir string) (map[string]string, error) {
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			out[path] = "vanished" // differs from any listing that has it
			return nil
		}
		if err != nil {
			return err
		}
		out[path] = fmt.Sprintf("%d %d", info.Size(), info.ModTime().UnixNano())
		return nil
	})
	return out, err
}

// copyDirOnce copies the files under src to dst in one pass.
func copyDirOnce(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(target)
		if err != nil {
			return err
		}
		if err := copySparse(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}

// copySparse copies in to out, seeking over all-zero blocks instead of
// writing them (Badger preallocates large sparse files), like cp
// --sparse=auto.
func copySparse(out *os.File, in *os.File) error {
	buf := make([]byte, 64<<10)
	var size int64
	for {
		n, err := in.Read(buf)
		if n > 0 {
			size += int64(n)
			if bytes.Count(buf[:n], []byte{0}) == n {
				if _, err := out.Seek(int64(n), io.SeekCurrent); err != nil {
					return err
				}
			} else if _, err := out.Write(buf[:n]); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return out.Truncate(size)
		}
		if err != nil {
			return err
		}
	}
}

// logRecorder is a slog.Handler that keeps every record, for asserting on
// log lines.
type logRecorder struct {
	mu      sync.Mutex
	records []string // "LEVEL msg key=value ..."
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	h.mu.Lock()
	h.records = append(h.records, b.String())
	h.mu.Unlock()
	return nil
}

func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecorder) WithGroup(string) slog.Handler      { return h }

// count returns how many records contain every one of subs.
func (h *logRecorder) count(subs ...string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
next:
	for _, r := range h.records {
		for _, s := range subs {
			if !strings.Contains(r, s) {
				continue next
			}
		}
		n++
	}
	return n
}

// lastVersion returns the highest Badger version of p's keys.
func lastVersion(tb testing.TB, p *Partition) uint64 {
	tb.Helper()
	var v uint64
	err := p.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: p.ks[:], AllVersions: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v = max(v, it.Item().Version())
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return v
}
