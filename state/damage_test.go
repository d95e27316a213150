package state

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// damagedStore claims keys in a closed two-partition store in a new dir
// (so its keys are in tables), damages it with damage, and returns its
// options and keys.
func damagedStore(t *testing.T, damage func(t *testing.T, badgerDir string)) (Options, [][]byte) {
	t.Helper()
	opts := testOptions(t, t.TempDir(), 2)
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	keys := testKeys("dmg", 5000)
	claimAll(t, s, keys)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	damage(t, filepath.Join(opts.Dir, BadgerDir))
	return opts, keys
}

// onlyFile returns the one file in dir matching pattern.
func onlyFile(t *testing.T, dir, pattern string) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil || len(m) != 1 {
		t.Fatalf("files %s in %s: %q, %v; want one", pattern, dir, m, err)
	}
	return m[0]
}

// flipByte inverts the byte at off in path.
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[off] ^= 0xff
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The damage Open must find, and the file it must name.
var damages = []struct {
	name   string
	damage func(t *testing.T, badgerDir string) (file string)
}{
	{"flipped byte in a table's data", func(t *testing.T, dir string) string {
		sst := onlyFile(t, dir, "*.sst")
		flipByte(t, sst, 100) // inside the first block: Badger's default never reads its checksum
		return sst
	}},
	{"flipped byte in a table's index", func(t *testing.T, dir string) string {
		sst := onlyFile(t, dir, "*.sst")
		info, err := os.Stat(sst)
		if err != nil {
			t.Fatal(err)
		}
		flipByte(t, sst, info.Size()-100)
		return sst
	}},
	{"missing MANIFEST", func(t *testing.T, dir string) string {
		mustRemove(t, filepath.Join(dir, "MANIFEST"))
		return filepath.Join(dir, "MANIFEST")
	}},
	{"flipped byte in the MANIFEST", func(t *testing.T, dir string) string {
		flipByte(t, filepath.Join(dir, "MANIFEST"), 12)
		return filepath.Join(dir, "MANIFEST")
	}},
	{"missing table", func(t *testing.T, dir string) string {
		sst := onlyFile(t, dir, "*.sst")
		mustRemove(t, sst)
		return sst
	}},
}

func TestDamageRefused(t *testing.T) {
	for _, d := range damages {
		t.Run(d.name, func(t *testing.T) {
			var file string
			opts, _ := damagedStore(t, func(t *testing.T, dir string) { file = d.damage(t, dir) })
			before := fileContents(t, opts.Dir)
			s, err := Open(context.Background(), opts)
			if err == nil {
				s.Close()
				t.Fatalf("Open of a store with a %s: no error, want ErrDamaged", d.name)
			}
			var de *DamageError
			if !errors.Is(err, ErrDamaged) || !errors.As(err, &de) {
				t.Fatalf("Open: %v, want a *DamageError wrapping ErrDamaged", err)
			}
			if de.File != file {
				t.Errorf("DamageError.File = %q, want %q (err %v)", de.File, file, err)
			}
			if !strings.Contains(err.Error(), file) {
				t.Errorf("the error does not name %s: %v", file, err)
			}
			if fix := de.Fix("state.on_damage"); !strings.Contains(fix, "state.on_damage: rebuild") {
				t.Errorf("Fix = %q, want it to name state.on_damage: rebuild", fix)
			}
			// A refusal changes no file on disk.
			after := fileContents(t, opts.Dir)
			for path, v := range before {
				if after[path] != v {
					t.Errorf("%s changed in the refused Open (%q, then %q)", path, v, after[path])
				}
			}
		})
	}
}

func TestDamageRebuilt(t *testing.T) {
	for _, d := range damages {
		t.Run(d.name, func(t *testing.T) {
			var file string
			opts, keys := damagedStore(t, func(t *testing.T, dir string) { file = d.damage(t, dir) })
			before := fileContents(t, filepath.Join(opts.Dir, BadgerDir))
			rec := &logRecorder{}
			opts.Logger = slog.New(rec)
			opts.OnDamage = DamageRebuild
			s := openStore(t, opts)
			aside := s.MovedAside()
			if !strings.HasPrefix(filepath.Base(aside), DamagedPrefix) || filepath.Dir(aside) != opts.Dir {
				t.Fatalf("MovedAside() = %q, want %s/%s<time>", aside, opts.Dir, DamagedPrefix)
			}
			// The damaged files are kept, as they were.
			after := fileContents(t, filepath.Join(aside, BadgerDir))
			for path, v := range before {
				moved := filepath.Join(aside, BadgerDir, filepath.Base(path))
				if after[moved] != v {
					t.Errorf("%s was %q and is %q once moved aside", path, v, after[moved])
				}
			}
			if _, err := os.Stat(filepath.Join(aside, "p000", SnapshotFile)); err != nil {
				t.Errorf("partition 0's filter snapshot was not moved aside: %v", err)
			}
			// The store is empty: it holds no cursor, so the stage
			// restores every partition from the output before judging.
			for i := range s.Partitions() {
				if c, err := s.Partition(i).Cursor(); err != nil || c != 0 {
					t.Errorf("partition %d: cursor %d, %v; want 0", i, c, err)
				}
			}
			for _, k := range keys[:100] {
				if _, _, found, err := s.Find(k); err != nil || found {
					t.Fatalf("Find(%q) in the rebuilt store: found %v, %v; want an empty store", k, found, err)
				}
			}
			if n := rec.count("ERROR", "store is damaged", "moved_to="+aside, "file="+file); n != 1 {
				t.Errorf("%d error lines naming the damage, the file and where it went, want 1: %q", n, rec.records)
			}
		})
	}
}

// Badger's default (no checksum verified) opens a table with a flipped
// byte in its data as if nothing were wrong: why the store verifies every
// table when it opens it.
func TestDamageTableUnnoticedWithoutChecksums(t *testing.T) {
	opts, _ := damagedStore(t, func(t *testing.T, dir string) { flipByte(t, onlyFile(t, dir, "*.sst"), 100) })
	opts.skipTableChecksums = true
	openStore(t, opts)
}

// A value log truncated (to nothing, or into its header) loses nothing:
// the store's values (at most tens of bytes) stay in the LSM tree, under
// Badger's ValueThreshold, so its value-log files hold no entries; Badger
// truncates the last one to its last whole entry, silently, and the
// store opens with every key.
func TestDamageTruncatedValueLog(t *testing.T) {
	for _, size := range []int64{0, 10} {
		for _, crashed := range []bool{false, true} {
			t.Run(map[bool]string{false: "closed", true: "crashed"}[crashed]+"/"+map[int64]string{0: "empty", 10: "10 bytes"}[size], func(t *testing.T) {
				opts := testOptions(t, t.TempDir(), 2)
				opts.SyncWrites = true
				s, err := Open(context.Background(), opts)
				if err != nil {
					t.Fatal(err)
				}
				keys := testKeys("vlog", 5000)
				claimAll(t, s, keys)
				dir := opts.Dir
				if crashed {
					dir = filepath.Join(t.TempDir(), "copy")
					copyDir(t, opts.Dir, dir)
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				for _, f := range globOrFail(t, filepath.Join(dir, BadgerDir, "*.vlog")) {
					if err := os.Truncate(f, size); err != nil {
						t.Fatal(err)
					}
				}
				o := opts
				o.Dir = dir
				c := openStore(t, o)
				if c.MovedAside() != "" {
					t.Errorf("the store was moved aside to %s", c.MovedAside())
				}
				assertAllSeen(t, c, keys)
			})
		}
	}
}

// A write-ahead log (Badger's memtable file) cut short loses the claims
// after the cut, silently: Badger truncates it at its last whole entry, as
// after a crash. Each batch's cursor is in the transaction of its claims,
// so the cursor goes back with them: every claim lost is after the cursor,
// and the restore at start reads its forward back from the output.
func TestDamageTruncatedWriteAheadLog(t *testing.T) {
	opts := testOptions(t, t.TempDir(), 1)
	opts.SyncWrites = true
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	keys := testKeys("wal", 20000)
	const batch = 200
	for i := 0; i < len(keys); i += batch {
		claims := make([]Claim, 0, batch)
		for j, k := range keys[i : i+batch] {
			claims = append(claims, Claim{Key: k, Fingerprint: 1, OutputSeq: uint64(i + j + 1)})
		}
		if _, err := s.Partition(0).ClaimWithCursor(claims, uint64(i+batch)); err != nil {
			t.Fatal(err)
		}
	}
	crashed := filepath.Join(t.TempDir(), "copy")
	copyDir(t, opts.Dir, crashed)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Cut the log in the middle of what it holds (the file is
	// preallocated: zeros follow its last entry).
	mem := onlyFile(t, filepath.Join(crashed, BadgerDir), "*.mem")
	b, err := os.ReadFile(mem)
	if err != nil {
		t.Fatal(err)
	}
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	if err := os.Truncate(mem, int64(end/2)); err != nil {
		t.Fatal(err)
	}
	o := opts
	o.Dir = crashed
	c := openStore(t, o)
	cursor, err := c.Partition(0).Cursor()
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	t.Logf("the log held %d bytes; cut to %d", end, end/2)
	for i, k := range keys {
		_, _, found, err := c.Find(k)
		if err != nil {
			t.Fatal(err)
		}
		if !found {
			lost++
			if seq := uint64(i + 1); seq <= cursor {
				t.Fatalf("key %q (output seq %d) is lost and the cursor %d says it is stored", k, seq, cursor)
			}
		}
	}
	if lost == 0 || cursor >= uint64(len(keys)) {
		t.Fatalf("the cut lost %d claims, cursor %d of %d: the test cut nothing", lost, cursor, len(keys))
	}
	t.Logf("the cut lost %d of %d claims; the cursor went back to %d", lost, len(keys), cursor)
}

// A lock held and a full disk are not damage: they are never rebuilt.
func TestDamageNotLockOrDiskFull(t *testing.T) {
	t.Run("locked", func(t *testing.T) {
		opts := testOptions(t, t.TempDir(), 1)
		opts.OnDamage = DamageRebuild
		openStore(t, opts)
		s, err := Open(context.Background(), opts)
		if err == nil {
			s.Close()
			t.Fatal("a second Open of a held store: no error")
		}
		if !errors.Is(err, ErrLocked) || errors.Is(err, ErrDamaged) {
			t.Errorf("second Open: %v, want ErrLocked and not ErrDamaged", err)
		}
		assertNothingAside(t, opts.Dir)
	})
	t.Run("disk full", func(t *testing.T) {
		opts := testOptions(t, t.TempDir(), 1)
		s := openStore(t, opts)
		claimAll(t, s, testKeys("full", 10))
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		opts.OnDamage = DamageRebuild
		opts.MinFreeBytes = 1 << 62
		s, err := Open(context.Background(), opts)
		if err == nil {
			s.Close()
			t.Fatal("Open with too little space: no error")
		}
		if !errors.Is(err, ErrDiskFull) || errors.Is(err, ErrDamaged) {
			t.Errorf("Open: %v, want ErrDiskFull and not ErrDamaged", err)
		}
		assertNothingAside(t, opts.Dir)
	})
	t.Run("unreadable", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root reads any file")
		}
		opts := testOptions(t, t.TempDir(), 1)
		s := openStore(t, opts)
		claimAll(t, s, testKeys("perm", 10))
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		manifest := filepath.Join(opts.Dir, BadgerDir, "MANIFEST")
		if err := os.Chmod(manifest, 0); err != nil {
			t.Fatal(err)
		}
		opts.OnDamage = DamageRebuild
		s, err := Open(context.Background(), opts)
		if err == nil {
			s.Close()
			t.Fatal("Open with an unreadable MANIFEST: no error")
		}
		if errors.Is(err, ErrDamaged) {
			t.Errorf("Open: %v, want an error that is not ErrDamaged", err)
		}
		assertNothingAside(t, opts.Dir)
	})
}

// fileContents returns a digest of every regular file under dir: its
// size and xxhash.
func fileContents(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out[path] = fmt.Sprintf("%d %x", len(b), xxhash.Sum64(b))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func globOrFail(t *testing.T, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(pattern)
	if err != nil || len(m) == 0 {
		t.Fatalf("no file %s: %v", pattern, err)
	}
	return m
}

func assertNothingAside(t *testing.T, dir string) {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, DamagedPrefix+"*"))
	if err != nil || len(m) > 0 {
		t.Errorf("moved aside: %q, %v; want nothing", m, err)
	}
}
