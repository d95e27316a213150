package state

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/dedupe-stage/dedupe-stage/window"
)

// totalsOptions returns testOptions with one-minute totals buckets and a
// manual clock at now.
func totalsOptions(tb testing.TB, dir string, partitions int) (Options, *window.ManualClock) {
	tb.Helper()
	o := testOptions(tb, dir, partitions)
	o.TotalsBucket = time.Minute
	clock := window.NewManualClock(time.Now())
	o.Clock = clock
	return o, clock
}

// mustTotal returns the total of (group, bucket) in p, failing the test on
// an error.
func mustTotal(tb testing.TB, p *Partition, group string, bucket time.Time) (int64, bool) {
	tb.Helper()
	v, ok, err := p.Total(group, bucket)
	if err != nil {
		tb.Fatalf("Total(%q, %v): %v", group, bucket, err)
	}
	return v, ok
}

// claimTotals claims one key per element of keys, each adding value to
// (group, bucket), and returns the results.
func claimTotals(tb testing.TB, p *Partition, bucket time.Time, claims ...Claim) []ClaimResult {
	tb.Helper()
	for i := range claims {
		if claims[i].Total.Group != "" && claims[i].Total.Bucket.IsZero() {
			claims[i].Total.Bucket = bucket
		}
	}
	res, err := p.Claim(claims)
	if err != nil {
		tb.Fatalf("Claim: %v", err)
	}
	return res
}

func contrib(group string, v int64) Contribution { return Contribution{Group: group, Value: v} }

func TestBucketOf(t *testing.T) {
	tests := []struct {
		t    time.Time
		size time.Duration
		want int64 // Unix seconds
	}{
		{time.Unix(0, 0), time.Minute, 0},
		{time.Unix(59, 999), time.Minute, 0},
		{time.Unix(60, 0), time.Minute, 60},
		{time.Unix(1767225661, 5), time.Minute, 1767225660},
		{time.Unix(1767225661, 0), time.Hour, 1767225600},
		{time.Unix(1767225661, 0), 7 * time.Second, 1767225661 - 1767225661%7},
		{time.Unix(-1, 0), time.Minute, -60},
		{time.Unix(-60, 0), time.Minute, -60},
		{time.Unix(-61, 0), time.Minute, -120},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d_%v", tt.t.Unix(), tt.size), func(t *testing.T) {
			got := BucketOf(tt.t, tt.size)
			if got.Unix() != tt.want || got.Nanosecond() != 0 || got.Location() != time.UTC {
				t.Errorf("BucketOf(%v, %v) = %v (%d), want Unix %d in UTC", tt.t, tt.size, got, got.Unix(), tt.want)
			}
		})
	}
}

func TestTotalsCommitWithClaims(t *testing.T) {
	for _, disable := range []bool{false, true} {
		t.Run(map[bool]string{false: "filter=on", true: "filter=off"}[disable], func(t *testing.T) {
			opts, clock := totalsOptions(t, t.TempDir(), 1)
			opts.DisableFilter = disable
			s := openStore(t, opts)
			p := s.Partition(0)
			b := BucketOf(clock.Now(), time.Minute)

			res := claimTotals(t, p, b,
				Claim{Key: []byte("a"), Total: contrib("g1", 5)},
				Claim{Key: []byte("b"), Total: contrib("g1", 7)},
				Claim{Key: []byte("a"), Total: contrib("g1", 5)}, // copy in the batch: adds nothing
				Claim{Key: []byte("c"), Total: contrib("g2", 1)},
				Claim{Key: []byte("d")},                          // no total
				Claim{Key: []byte("e"), Total: contrib("g1", 0)}, // zero value: counts as a change
			)
			wantNew := []bool{true, true, false, true, true, true}
			wantTotal := []int64{5, 12, 0, 1, 0, 12}
			for i, r := range res {
				if r.New != wantNew[i] || r.Total != wantTotal[i] {
					t.Errorf("claim %d: New=%v Total=%d, want New=%v Total=%d", i, r.New, r.Total, wantNew[i], wantTotal[i])
				}
			}
			if v, ok := mustTotal(t, p, "g1", b); !ok || v != 12 {
				t.Errorf("g1 = %d, %v; want 12", v, ok)
			}
			if v, ok := mustTotal(t, p, "g2", b); !ok || v != 1 {
				t.Errorf("g2 = %d, %v; want 1", v, ok)
			}
			if _, ok := mustTotal(t, p, "g3", b); ok {
				t.Errorf("g3 found, want absent")
			}

			// Repeats add nothing, in a later batch too.
			clock.Advance(time.Second)
			res = claimTotals(t, p, b,
				Claim{Key: []byte("a"), Total: contrib("g1", 5)},
				Claim{Key: []byte("c"), Total: contrib("g2", 1)},
				Claim{Key: []byte("f"), Total: contrib("g1", 3)},
			)
			if res[0].New || res[1].New || !res[2].New || res[2].Total != 15 {
				t.Errorf("second batch: %+v, want two repeats and f New with total 15", res)
			}
			if v, _ := mustTotal(t, p, "g2", b); v != 1 {
				t.Errorf("g2 = %d after a repeat, want 1", v)
			}
		})
	}
}

func TestTotalsDirtySet(t *testing.T) {
	opts, clock := totalsOptions(t, t.TempDir(), 1)
	s := openStore(t, opts)
	p := s.Partition(0)
	b0 := BucketOf(clock.Now(), time.Minute)
	b1 := b0.Add(time.Minute)

	if got, err := p.TakeDirtyTotals(); err != nil || len(got) != 0 {
		t.Fatalf("TakeDirtyTotals on a fresh store = %v, %v; want nothing", got, err)
	}
	claimTotals(t, p, b0,
		Claim{Key: []byte("a"), Total: contrib("g1", 2)},
		Claim{Key: []byte("b"), Total: contrib("g1", 2)},
		Claim{Key: []byte("c"), Total: Contribution{Group: "g1", Bucket: b1, Value: 4}},
		Claim{Key: []byte("d"), Total: contrib("g0", 1)},
	)
	if n := s.DirtyTotals(); n != 3 {
		t.Errorf("DirtyTotals = %d, want 3", n)
	}
	got, err := p.TakeDirtyTotals()
	if err != nil {
		t.Fatal(err)
	}
	want := []TotalRecord{{"g0", b0, 1}, {"g1", b0, 4}, {"g1", b1, 4}}
	if !equalTotals(got, want) {
		t.Fatalf("TakeDirtyTotals = %v, want %v (bucket, then group order)", got, want)
	}
	if got, _ := p.TakeDirtyTotals(); len(got) != 0 {
		t.Errorf("second TakeDirtyTotals = %v, want nothing", got)
	}

	// A repeat changes nothing; a new key dirties its pair only.
	claimTotals(t, p, b0, Claim{Key: []byte("a"), Total: contrib("g1", 2)})
	if n := p.DirtyTotals(); n != 0 {
		t.Errorf("DirtyTotals after a repeat = %d, want 0", n)
	}
	claimTotals(t, p, b0, Claim{Key: []byte("e"), Total: contrib("g1", 10)})

	// A failed flush hands its pairs back; they come back with the value at
	// the time of the next take.
	got, _ = p.TakeDirtyTotals()
	if !equalTotals(got, []TotalRecord{{"g1", b0, 14}}) {
		t.Fatalf("TakeDirtyTotals = %v, want g1@b0=14", got)
	}
	p.MarkTotalsDirty(append(got, TotalRecord{Group: "g0", Bucket: b0}))
	claimTotals(t, p, b0, Claim{Key: []byte("f"), Total: contrib("g1", 1)})
	got, _ = p.TakeDirtyTotals()
	if want := []TotalRecord{{"g0", b0, 1}, {"g1", b0, 15}}; !equalTotals(got, want) {
		t.Fatalf("after MarkTotalsDirty: %v, want %v", got, want)
	}
}

func equalTotals(a, b []TotalRecord) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Group != b[i].Group || !a[i].Bucket.Equal(b[i].Bucket) || a[i].Value != b[i].Value {
			return false
		}
	}
	return true
}

func TestTotalsSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	opts, clock := totalsOptions(t, dir, 2)
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	b := BucketOf(clock.Now(), time.Minute)
	want := map[string]int64{}
	for i := range 200 {
		g := fmt.Sprintf("g%d", i%7)
		key := fmt.Appendf(nil, "k%d", i)
		p := s.Partition(PartitionOf([]byte(g), 2)) // partitioned by group
		claimTotals(t, p, b, Claim{Key: key, Total: contrib(g, int64(i))})
		want[g] += int64(i)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, opts)
	if n := s.DirtyTotals(); n != 0 {
		t.Errorf("DirtyTotals after reopen = %d, want 0 (the set lives in memory)", n)
	}
	got := map[string]int64{}
	err = s.ScanTotals(context.Background(), time.Time{}, func(r TotalRecord) error {
		if !r.Bucket.Equal(b) {
			t.Errorf("total %+v: bucket %v, want %v", r, r.Bucket, b)
		}
		if _, dup := got[r.Group]; dup {
			t.Errorf("group %q scanned twice", r.Group)
		}
		got[r.Group] = r.Value
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("totals after reopen = %v, want %v", got, want)
	}
	// since excludes older buckets; a callback error stops the scan.
	n := 0
	if err := s.ScanTotals(context.Background(), b.Add(time.Minute), func(TotalRecord) error { n++; return nil }); err != nil || n != 0 {
		t.Errorf("ScanTotals(since after the bucket) = %d totals, %v; want none", n, err)
	}
	stop := errors.New("stop")
	if err := s.ScanTotals(context.Background(), b, func(TotalRecord) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("ScanTotals with a failing callback = %v, want it returned", err)
	}
}

// TestExpireTotals: a total stays until its bucket is closed (bucket end
// + W) and TotalsKeep has passed on the input's clock, and while a flush
// has not taken it.
func TestExpireTotals(t *testing.T) {
	opts := testOptions(t, t.TempDir(), 1)
	opts.TotalsBucket = time.Minute
	s := openStore(t, opts)
	p := s.Partition(0)
	bucket := BucketOf(time.Date(2026, 3, 1, 10, 0, 30, 0, time.UTC), time.Minute)
	claimTotals(t, p, bucket, Claim{Key: []byte("a"), Total: contrib("g", 1), At: bucket.Add(time.Second)})
	kept := bucket.Add(time.Minute + opts.Window.W + DefaultTotalsKeep)
	ctx := context.Background()
	if st, err := p.Expire(ctx, kept.Add(time.Hour), 0); err != nil || st.Totals != 0 {
		t.Fatalf("Expire while the total is not flushed = %+v, %v; want it kept", st, err)
	}
	if _, err := p.TakeDirtyTotals(); err != nil {
		t.Fatal(err)
	}
	if st, err := p.Expire(ctx, kept.Add(-time.Second), 0); err != nil || st.Totals != 0 {
		t.Fatalf("Expire a second before the total's end = %+v, %v; want it kept", st, err)
	}
	if got, ok := mustTotal(t, p, "g", bucket); !ok || got != 1 {
		t.Fatalf("total = %d (held %v), want 1", got, ok)
	}
	if st, err := p.Expire(ctx, kept, 0); err != nil || st.Totals != 1 {
		t.Fatalf("Expire at the total's end = %+v, %v; want 1 total removed", st, err)
	}
	if got, ok := mustTotal(t, p, "g", bucket); ok {
		t.Fatalf("total after Expire = %d, want none", got)
	}
}

// TestTotalsSplitTxn checks that totals stay equal to the keys recorded
// when a batch is split over several Badger transactions.
func TestTotalsSplitTxn(t *testing.T) {
	opts, clock := totalsOptions(t, t.TempDir(), 1)
	opts.MemoryBudget = MinMemoryBudget // small Badger transactions
	s := openStore(t, opts)
	p := s.Partition(0)
	if n := p.db.MaxBatchCount(); n > 3000 {
		t.Fatalf("Badger max batch count is %d; the test needs a batch beyond it", n)
	}
	b := BucketOf(clock.Now(), time.Minute)
	keys := testKeys("split", 4000)
	claims := make([]Claim, len(keys))
	for i, k := range keys {
		claims[i] = Claim{Key: k, Total: Contribution{Group: fmt.Sprintf("g%d", i%3), Bucket: b, Value: 1}}
	}
	res, err := p.Claim(claims)
	if err != nil {
		t.Fatal(err)
	}
	// The last claim is key 3999, of g0, which holds keys 0, 3, ..., 3999.
	if last := res[len(res)-1]; !last.New || last.Total != 1334 {
		t.Errorf("last claim %+v, want New with total 1334", last)
	}
	var sum int64
	for g := range 3 {
		v, _ := mustTotal(t, p, fmt.Sprintf("g%d", g), b)
		sum += v
	}
	if sum != int64(len(keys)) {
		t.Errorf("sum of totals %d, want %d", sum, len(keys))
	}
}

// TestTotalsMatchKeysAfterCrash SIGKILLs a process committing claims with
// totals, then checks that every total equals its keys recorded and that
// every batch it saw committed survived. The test binary re-runs itself as
// the writer, so the directory is the kernel's at the kill: a copy of a
// live Badger directory would not be a crash image.
func TestTotalsMatchKeysAfterCrash(t *testing.T) {
	if dir := os.Getenv(crashWriterDirEnv); dir != "" {
		runCrashWriter(t, dir)
		return
	}
	dir := t.TempDir()
	now := time.Now()
	cmd := exec.Command(os.Args[0], "-test.run=^TestTotalsMatchKeysAfterCrash$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), crashWriterDirEnv+"="+dir, crashWriterNowEnv+"="+strconv.FormatInt(now.UnixNano(), 10))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr, stdout bytes.Buffer // stdout: the writer's other lines, written until done
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Read "committed N" lines until enough batches are in, then kill.
	seed := time.Now().UnixNano()
	killDelay := time.Duration(rand.New(rand.NewPCG(uint64(seed), 0)).IntN(20_000)) * time.Microsecond
	t.Logf("seed %d: kill %v after batch %d commits", seed, killDelay, crashWriterKillAfter)
	committed := -1
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			n, ok := strings.CutPrefix(sc.Text(), "committed ")
			if !ok && stdout.Len() < 64<<10 {
				stdout.WriteString(sc.Text() + "\n") // the writer's test output, for a failure
			}
			if ok {
				v, err := strconv.Atoi(n)
				if err != nil || v < crashWriterKillAfter {
					continue
				}
				// Land the kill at a varying point of the next commits.
				time.Sleep(killDelay)
				if cmd.Process.Signal(syscall.SIGKILL) == nil {
					committed = v
					break
				}
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("the writer did not commit %d batches within 2m", crashWriterKillAfter)
	}
	err = cmd.Wait()
	if committed < 0 {
		t.Fatalf("the writer ended before it was killed: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the writer was not killed by SIGKILL: %v\n%s", err, stderr.String())
	}

	opts, _ := totalsOptions(t, dir, 1)
	opts.Clock = window.NewManualClock(now)
	c := openStore(t, opts)
	b := BucketOf(now, time.Minute)
	keysPerGroup := map[string]int64{}
	err = c.Partition(0).db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: keyspaceOf(0).kind(prefixRecord)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			g, _, _ := strings.Cut(string(userKey(it.Item().Key())), "/")
			keysPerGroup[g]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var keys int64
	for g := range 5 {
		name := fmt.Sprintf("g%d", g)
		v, _ := mustTotal(t, c.Partition(0), name, b)
		if v != keysPerGroup[name] {
			t.Errorf("after the kill: total of %s is %d, but %d of its keys are recorded", name, v, keysPerGroup[name])
		}
		keys += keysPerGroup[name]
	}
	// Every batch the writer saw committed survives (sync writes; a process
	// kill keeps the page cache anyway); the batches after it, which the
	// kill may have caught in flight, are whole or absent.
	if least := int64(committed) * crashWriterBatch; keys < least || keys%crashWriterBatch != 0 {
		t.Errorf("after the kill: %d keys recorded; want a whole number of %d-key batches, at least the %d committed", keys, crashWriterBatch, least)
	}
	t.Logf("killed after %d committed batches; %d keys recorded", committed, keys)
}

// The writer process of TestTotalsMatchKeysAfterCrash.
const (
	crashWriterDirEnv    = "DEDUPE_STATE_CRASH_WRITER_DIR"
	crashWriterNowEnv    = "DEDUPE_STATE_CRASH_WRITER_NOW"
	crashWriterBatch     = 64
	crashWriterKillAfter = 40
)

// runCrashWriter claims 64-key batches with totals into dir and prints
// "committed N" after each, until it is killed (or, bounded, after 100000
// batches or a minute).
func runCrashWriter(t *testing.T, dir string) {
	ns, err := strconv.ParseInt(os.Getenv(crashWriterNowEnv), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", crashWriterNowEnv, err)
	}
	now := time.Unix(0, ns)
	opts, _ := totalsOptions(t, dir, 1)
	opts.Clock = window.NewManualClock(now)
	opts.SyncWrites = true
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	p := s.Partition(0)
	b := BucketOf(now, time.Minute)
	deadline := time.Now().Add(time.Minute)
	for n := 0; n < 100_000 && time.Now().Before(deadline); n++ {
		claims := make([]Claim, crashWriterBatch)
		for i := range claims {
			k := n*crashWriterBatch + i
			claims[i] = Claim{Key: fmt.Appendf(nil, "g%d/k%d", k%5, k), Total: Contribution{Group: fmt.Sprintf("g%d", k%5), Bucket: b, Value: 1}}
		}
		if _, err := p.Claim(claims); err != nil {
			t.Fatalf("Claim: %v", err)
		}
		fmt.Printf("committed %d\n", n+1)
	}
	t.Fatal("the writer was not killed")
}

func TestTotalsBadContribution(t *testing.T) {
	opts, clock := totalsOptions(t, t.TempDir(), 1)
	s := openStore(t, opts)
	p := s.Partition(0)
	b := BucketOf(clock.Now(), time.Minute)
	tests := []struct {
		name string
		c    Contribution
		want string
	}{
		{"negative value", Contribution{Group: "g", Bucket: b, Value: -1}, "negative value"},
		{"unaligned bucket", Contribution{Group: "g", Bucket: b.Add(time.Second), Value: 1}, "not the start"},
		{"sub-second bucket", Contribution{Group: "g", Bucket: b.Add(time.Millisecond), Value: 1}, "not the start"},
		{"long group", Contribution{Group: strings.Repeat("g", MaxGroupSize+1), Bucket: b, Value: 1}, "4097 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := p.Claim([]Claim{{Key: []byte("ok"), Total: contrib("g", 1)}, {Key: []byte(tt.name), Total: tt.c}})
			if !errors.Is(err, ErrBadTotal) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "claim 1") {
				t.Fatalf("Claim = %v, want ErrBadTotal for claim 1 mentioning %q", err, tt.want)
			}
		})
	}
	if _, ok := mustTotal(t, p, "g", b); ok {
		t.Errorf("a refused batch wrote a total")
	}

	off := testOptions(t, t.TempDir(), 1) // TotalsBucket 0: totals off
	s2 := openStore(t, off)
	if _, err := s2.Partition(0).Claim([]Claim{{Key: []byte("k"), Total: contrib("g", 1)}}); !errors.Is(err, ErrBadTotal) || !strings.Contains(err.Error(), "totals off") {
		t.Errorf("Claim with totals off = %v, want ErrBadTotal saying totals are off", err)
	}
}

func TestTotalsSaturate(t *testing.T) {
	opts, clock := totalsOptions(t, t.TempDir(), 1)
	s := openStore(t, opts)
	p := s.Partition(0)
	b := BucketOf(clock.Now(), time.Minute)
	res := claimTotals(t, p, b,
		Claim{Key: []byte("a"), Total: contrib("g", math.MaxInt64-1)},
		Claim{Key: []byte("b"), Total: contrib("g", 5)},
	)
	if res[1].Total != math.MaxInt64 {
		t.Errorf("total after overflow = %d, want MaxInt64", res[1].Total)
	}
}

func TestTotalsOptionsValidate(t *testing.T) {
	w := window.Window{W: time.Hour, NearFraction: 0.8}
	tests := []struct {
		name   string
		bucket time.Duration
		keep   time.Duration
		want   string
	}{
		{"off", 0, DefaultTotalsKeep, ""},
		{"one second", time.Second, 0, ""},
		{"a year", MaxTotalsBucket, time.Hour, ""},
		{"negative", -time.Minute, time.Hour, "TotalsBucket is -1m0s"},
		{"sub-second", 1500 * time.Millisecond, time.Hour, "TotalsBucket is 1.5s"},
		{"too long", MaxTotalsBucket + time.Second, time.Hour, "TotalsBucket is"},
		{"negative keep", time.Minute, -time.Second, "TotalsKeep is -1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultOptions("/tmp/x", w)
			o.TotalsBucket, o.TotalsKeep = tt.bucket, tt.keep
			err := o.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want ErrBadOptions mentioning %q", err, tt.want)
			}
		})
	}
}

func TestTotalsClosed(t *testing.T) {
	opts, _ := totalsOptions(t, t.TempDir(), 1)
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	p := s.Partition(0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.TakeDirtyTotals(); !errors.Is(err, ErrClosed) {
		t.Errorf("TakeDirtyTotals after Close = %v, want ErrClosed", err)
	}
	if _, _, err := p.Total("g", time.Unix(0, 0)); !errors.Is(err, ErrClosed) {
		t.Errorf("Total after Close = %v, want ErrClosed", err)
	}
	if err := s.ScanTotals(context.Background(), time.Time{}, func(TotalRecord) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("ScanTotals after Close = %v, want ErrClosed", err)
	}
}

// BenchmarkClaimTotals compares batches of 256 new keys claimed without
// totals, with one contribution each spread over 100 groups, and all into
// one group (one hot total read and rewritten per claim).
func BenchmarkClaimTotals(b *testing.B) {
	for _, bc := range []struct {
		name   string
		groups int // 0: no totals
	}{
		{"totals=off", 0},
		{"groups=100", 100},
		{"groups=1", 1},
	} {
		b.Run(bc.name, func(b *testing.B) {
			opts := benchOptions(b.TempDir(), 1, 4_000_000)
			opts.TotalsBucket = time.Minute
			s := openStore(b, opts)
			p := s.Partition(0)
			bucket := BucketOf(time.Now(), time.Minute)
			groups := make([]string, max(bc.groups, 1))
			for i := range groups {
				groups[i] = fmt.Sprintf("campaign-%03d", i)
			}
			claims := make([]Claim, 256)
			next := 0
			for b.Loop() {
				for j := range claims {
					claims[j] = Claim{Key: benchKey("tot", next), Fingerprint: uint64(next)}
					if bc.groups > 0 {
						claims[j].Total = Contribution{Group: groups[next%len(groups)], Bucket: bucket, Value: 1}
					}
					next++
				}
				if _, err := p.Claim(claims); err != nil {
					b.Fatal(err)
				}
				if bc.groups > 0 && next%(256*64) == 0 {
					if _, err := p.TakeDirtyTotals(); err != nil { // as the flusher does
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(next), "ns/key")
		})
	}
}
