package state

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/dedupe-stage/dedupe-stage/window"
)

// Benchmarks use random-looking 32-byte keys (the length of a UUID without
// dashes; sequential keys would compress unrealistically well on disk),
// batches of 512 for filling, no background GC or periodic snapshots, and
// the default memory budget.

const benchKeyLen = 32

// benchKey returns key number i of a 3-letter prefix: prefix, '-' and 28
// hex digits derived from the prefix and i.
func benchKey(prefix string, i int) []byte {
	var buf [16]byte
	copy(buf[:8], prefix)
	binary.BigEndian.PutUint64(buf[8:], uint64(i))
	h1 := xxhash.Sum64(buf[:])
	binary.BigEndian.PutUint64(buf[:8], h1)
	h2 := xxhash.Sum64(buf[:])
	return fmt.Appendf(make([]byte, 0, benchKeyLen), "%.3s-%016x%012x", prefix, h1, h2>>16)
}

func benchKeys(prefix string, n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = benchKey(prefix, i)
	}
	return keys
}

// benchOptions returns options for a benchmark store in dir sized for
// expected keys per window at a 1% false-positive target, with a manual
// clock (see fill).
func benchOptions(dir string, partitions int, expected uint) Options {
	w := window.Window{W: time.Hour, NearFraction: window.DefaultNearFraction}
	o := DefaultOptions(dir, w)
	o.Partitions = partitions
	o.Clock = window.NewManualClock(time.Now())
	o.SyncWrites = false
	o.GCInterval = 0
	o.SnapshotInterval = 0
	o.Filter.ExpectedKeys = expected
	o.Filter.FalsePositiveRate = 0.01
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return o
}

// fill claims n keys named prefix in batches of up to 512 per partition and
// fails unless all are New. It spreads their first-seen times evenly over
// 99% of the window by moving the store's manual clock, as steady traffic
// would: the filter sizes each generation for its share of ExpectedKeys,
// so n keys claimed at one instant would overload one generation.
func fill(b *testing.B, s *Store, prefix string, n int) {
	b.Helper()
	fillSeq(b, s, prefix, n, false)
}

// fillSeq is fill, with each claim's output sequence when withSeq (as the
// stage claims its forwards).
func fillSeq(b *testing.B, s *Store, prefix string, n int, withSeq bool) {
	b.Helper()
	clock := s.opts.Clock.(*window.ManualClock)
	const chunk = 4096
	step := s.opts.Window.W / 100 * 99 / time.Duration((n+chunk-1)/chunk)
	for start := 0; start < n; start += chunk {
		var seq uint64
		if withSeq {
			seq = 1_000_000 + uint64(start)
		}
		claimAllSeq(b, s, benchKeysRange(prefix, start, min(n, start+chunk)), seq)
		clock.Advance(step)
	}
}

func benchKeysRange(prefix string, from, to int) [][]byte {
	keys := make([][]byte, 0, to-from)
	for i := from; i < to; i++ {
		keys = append(keys, benchKey(prefix, i))
	}
	return keys
}

func reportLookupStats(b *testing.B, st Stats) {
	if st.Lookups == 0 {
		return
	}
	b.ReportMetric(float64(st.StoreReads)/float64(st.Lookups), "store-reads/op")
	b.ReportMetric(float64(st.FilterNegatives)/float64(st.Lookups), "skip-ratio")
}

func BenchmarkLookupHit(b *testing.B) {
	const n = 100_000
	s := openStore(b, benchOptions(b.TempDir(), 1, n))
	fill(b, s, "hit", n)
	keys := benchKeys("hit", n)
	p := s.Partition(0)
	i := 0
	for b.Loop() {
		r, err := p.Lookup(keys[i%n], time.Time{})
		if err != nil || !r.Found {
			b.Fatalf("Lookup(%q) = %+v, %v; want Found", keys[i%n], r, err)
		}
		i++
	}
	reportLookupStats(b, p.Stats())
}

var seenKeys = flag.Int("seen-keys", 1_000_000, "keys BenchmarkLookupSeen fills the store with")

// BenchmarkLookupSeen looks up keys the store holds, spread over all of
// them, in a store of -seen-keys keys with the default partitions and
// memory budget, reopened after the fill (what a restarted stage reads:
// every key in Badger's tables, none in memtables). Every lookup passes
// the filter ("maybe") and reads Badger: the cost of a repeat.
func BenchmarkLookupSeen(b *testing.B) {
	n := *seenKeys
	dir := b.TempDir()
	opts := benchOptions(dir, DefaultPartitions, uint(n))
	opts.MemoryBudget = DefaultMemoryBudget
	s, err := Open(context.Background(), opts)
	if err != nil {
		b.Fatal(err)
	}
	fill(b, s, "see", n)
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	s = openStore(b, opts)
	const sample = 1 << 18
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([][]byte, sample)
	for i := range keys {
		keys[i] = benchKey("see", rng.IntN(n))
	}
	i := 0
	for b.Loop() {
		k := keys[i&(sample-1)]
		r, err := s.Partition(PartitionOf(k, s.Partitions())).Lookup(k, time.Time{})
		if err != nil || !r.Found {
			b.Fatalf("Lookup(%q) = %+v, %v; want Found", k, r, err)
		}
		i++
	}
	reportLookupStats(b, s.Stats())
	tables := 0
	for p := range s.Partitions() {
		tables += len(s.Partition(p).db.Tables())
	}
	b.ReportMetric(float64(tables)/float64(s.Partitions()), "tables/partition")
}

func BenchmarkLookupMiss(b *testing.B) {
	const n = 100_000
	s := openStore(b, benchOptions(b.TempDir(), 1, n))
	fill(b, s, "hit", n)
	p := s.Partition(0)
	fresh := benchKeys("mis", 1<<17) // cycled: still never claimed
	i := 0
	for b.Loop() {
		k := fresh[i&(1<<17-1)]
		r, err := p.Lookup(k, time.Time{})
		if err != nil || r.Found {
			b.Fatalf("Lookup(%q) = %+v, %v; want not Found", k, r, err)
		}
		i++
	}
	st := p.Stats()
	reportLookupStats(b, st)
	b.ReportMetric(float64(st.FalsePositives)/float64(st.Lookups), "fp-rate")
}

func BenchmarkClaim(b *testing.B) {
	for _, bc := range []struct {
		name  string
		batch int
		sync  bool
	}{
		{"batch=1/nosync", 1, false},
		{"batch=64/nosync", 64, false},
		{"batch=512/nosync", 512, false},
		{"batch=64/sync", 64, true},
		{"batch=512/sync", 512, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			opts := benchOptions(b.TempDir(), 1, 4_000_000)
			opts.SyncWrites = bc.sync
			s := openStore(b, opts)
			p := s.Partition(0)
			claims := make([]Claim, bc.batch)
			next := 0
			for b.Loop() {
				for j := range claims {
					claims[j] = Claim{Key: benchKey("clm", next), Fingerprint: uint64(next)}
					next++
				}
				res, err := p.Claim(claims)
				if err != nil || !res[0].New {
					b.Fatalf("Claim: %+v, %v", res[0], err)
				}
			}
			b.ReportMetric(float64(next)/b.Elapsed().Seconds(), "keys/s")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(next), "ns/key")
		})
	}
}

// diskUse is the apparent size of the files of a store, by kind.
type diskUse struct {
	total, sst, vlog, snapshot int64
}

// dirBytes returns the apparent size of the regular files under dir.
func dirBytes(b *testing.B, dir string) diskUse {
	b.Helper()
	var u diskUse
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		u.total += info.Size()
		switch {
		case d.Name() == SnapshotFile:
			u.snapshot += info.Size()
		case strings.HasSuffix(d.Name(), ".sst"):
			u.sst += info.Size()
		case strings.HasSuffix(d.Name(), ".vlog"):
			u.vlog += info.Size()
		}
		return nil
	})
	if err != nil {
		b.Fatalf("walk %s: %v", dir, err)
	}
	return u
}

// memory returns the process's resident set size (from /proc; 0 where
// there is none) and the Go heap in use, after returning free memory to
// the OS.
func memory() (rss, heap int64) {
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap = int64(ms.HeapInuse)
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, heap
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, heap
		}
	}
	return 0, heap
}

// BenchmarkDiskBytesPerKey claims 1M keys, closes the store and measures
// its files. It also reports the memory the open store held once filled
// (RSS and Go heap growth over the process before Open): Badger's
// memtables (bounded by the memory budget), the filters, and the touched
// pages of its tables.
func BenchmarkDiskBytesPerKey(b *testing.B) {
	const n = 1_000_000
	for _, c := range []struct {
		parts   int
		withSeq bool
	}{{1, false}, {8, false}, {1, true}, {8, true}} {
		b.Run(fmt.Sprintf("partitions=%d/output_seq=%v", c.parts, c.withSeq), func(b *testing.B) {
			var use diskUse
			var rss, heap int64
			for b.Loop() {
				dir := b.TempDir()
				rss0, heap0 := memory()
				s, err := Open(context.Background(), benchOptions(dir, c.parts, n))
				if err != nil {
					b.Fatal(err)
				}
				fillSeq(b, s, "dsk", n, c.withSeq)
				rss1, heap1 := memory()
				rss, heap = rss1-rss0, heap1-heap0
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
				use = dirBytes(b, dir)
			}
			b.ReportMetric(float64(use.total)/n, "disk-B/key")
			b.ReportMetric(float64(use.sst)/n, "sst-B/key")
			b.ReportMetric(float64(use.vlog)/n, "vlog-B/key")
			b.ReportMetric(float64(use.snapshot)/n, "snapshot-B/key")
			b.ReportMetric(float64(rss)/n, "rss-B/key")
			b.ReportMetric(float64(heap)/n, "heap-B/key")
		})
	}
}

// closedStore fills a new store of DefaultPartitions with n keys named
// prefix, closes it and returns its options.
func closedStore(b *testing.B, prefix string, n int) Options {
	b.Helper()
	opts := benchOptions(b.TempDir(), DefaultPartitions, uint(n))
	s, err := Open(context.Background(), opts)
	if err != nil {
		b.Fatal(err)
	}
	fill(b, s, prefix, n)
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	return opts
}

func BenchmarkOpenRebuild(b *testing.B) {
	const n = 1_000_000
	opts := closedStore(b, "opn", n)
	dir := opts.Dir
	for _, mode := range []string{"snapshot", "rebuild"} {
		b.Run(mode, func(b *testing.B) {
			var scanned uint64
			for b.Loop() {
				b.StopTimer()
				if mode == "rebuild" {
					for i := range opts.Partitions {
						if err := os.Remove(filepath.Join(PartitionDir(dir, i), SnapshotFile)); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StartTimer()
				s, err := Open(context.Background(), opts)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				scanned = 0
				for i := range s.Partitions() {
					fb := s.Partition(i).FilterBuild()
					want := SourceSnapshot
					if mode == "rebuild" {
						want = SourceRebuild
					}
					if fb.Source != want {
						b.Fatalf("partition %d built from %s, want %s", i, fb.Source, want)
					}
					scanned += fb.Scanned
				}
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(scanned), "records-scanned")
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/open")
		})
	}
}

func BenchmarkNewKeyLookup(b *testing.B) {
	const n = 1_000_000
	dir := b.TempDir()
	opts := benchOptions(dir, 1, n)
	s, err := Open(context.Background(), opts)
	if err != nil {
		b.Fatal(err)
	}
	fill(b, s, "old", n)
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	for _, disable := range []bool{false, true} {
		name := "filter=on"
		if disable {
			name = "filter=off"
		}
		b.Run(name, func(b *testing.B) {
			o := opts
			o.DisableFilter = disable
			s := openStore(b, o)
			p := s.Partition(0)
			fresh := benchKeys("new", 1<<20) // cycled: still never claimed
			i := 0
			for b.Loop() {
				k := fresh[i&(1<<20-1)]
				r, err := p.Lookup(k, time.Time{})
				if err != nil || r.Found {
					b.Fatalf("Lookup(%q) = %+v, %v; want not Found", k, r, err)
				}
				i++
			}
			st := p.Stats()
			reportLookupStats(b, st)
			if !disable {
				b.ReportMetric(float64(st.FalsePositives)/float64(st.Lookups), "fp-rate")
				b.ReportMetric(float64(st.FilterBytes)/n, "filter-B/key")
			}
		})
	}
}

var restoreKeys = flag.Int("restore-keys", 1_000_000, "records BenchmarkRestore loads into one empty partition")

// BenchmarkRestore times what a new owner's snapshot load asks of the
// store: -restore-keys records, sorted by key as a snapshot holds them, in
// chunks of 4096 into one empty partition of four (synced writes, as a
// takeover runs), the cursor stored last; by Restore (a read of each key
// the filter does not prove new, transactions as Claim's), and by a Loader
// (Badger write batches, no read).
func BenchmarkRestore(b *testing.B) {
	n := *restoreKeys
	keys := benchKeys("rst", n)
	slices.SortFunc(keys, bytes.Compare)
	now := time.Now()
	recs := make([]Restored, n)
	for i, k := range keys {
		recs[i] = Restored{Key: k, FirstSeen: now.Add(-time.Duration(n-i) * time.Millisecond), Fingerprint: uint64(i)}
	}
	const chunk = 4096
	for _, path := range []string{"restore", "load"} {
		b.Run("path="+path, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				o := benchOptions(b.TempDir(), 4, uint(n)*4)
				o.SyncWrites = true
				o.Clock = window.NewManualClock(now)
				s, err := Open(context.Background(), o)
				if err != nil {
					b.Fatal(err)
				}
				p := s.Partition(0)
				b.StartTimer()
				if path == "load" {
					benchLoad(b, p, recs, chunk)
				} else {
					for start := 0; start < n; start += chunk {
						end := min(n, start+chunk)
						var cursor uint64
						if end == n {
							cursor = uint64(n)
						}
						if err := p.Restore(recs[start:end], cursor); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StopTimer()
				if r, err := p.Lookup(keys[n/2], time.Time{}); err != nil || !r.Found {
					b.Fatalf("Lookup of a restored key = %+v, %v", r, err)
				}
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// benchLoad loads recs into p with a Loader, chunk records per Add.
func benchLoad(b *testing.B, p *Partition, recs []Restored, chunk int) {
	ld, err := p.NewLoader()
	if err != nil {
		b.Fatal(err)
	}
	defer ld.Cancel()
	for start := 0; start < len(recs); start += chunk {
		if err := ld.Add(recs[start:min(len(recs), start+chunk)]); err != nil {
			b.Fatal(err)
		}
	}
	if err := ld.Finish(uint64(len(recs))); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkOpenTableChecksums measures what verifying every table's block
// checksums when Badger opens it (Options.OnDamage's detection of a
// flipped byte) adds to Open of a closed store of 1M keys, against
// Badger's default of verifying none. Filters load from their snapshots,
// so the open is mostly Badger's.
func BenchmarkOpenTableChecksums(b *testing.B) {
	opts := closedStore(b, "chk", 1_000_000)
	use := dirBytes(b, opts.Dir)
	for _, verify := range []bool{false, true} {
		b.Run(map[bool]string{false: "verify=none", true: "verify=on-table-open"}[verify], func(b *testing.B) {
			o := opts
			o.skipTableChecksums = !verify
			for b.Loop() {
				s, err := Open(context.Background(), o)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/open")
			b.ReportMetric(float64(use.sst)/(1<<20), "sst-MiB")
		})
	}
}
