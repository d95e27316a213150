package bloom

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var updateSeeds = flag.Bool("update-fuzz-seeds", false, "rewrite the committed FuzzReadSnapshot seed corpus")

// fuzzOpts are tiny options (m = 29 bits, one word per generation) so that
// a whole snapshot is 120 bytes and the fuzzer can reach every field.
var fuzzOpts = Options{Window: 3 * time.Second, Generations: 2, ExpectedKeys: 8, FalsePositiveRate: 0.1}

// fuzzSeedSnapshot is a valid snapshot of a filter built with fuzzOpts,
// with keys in two of its three generations.
func fuzzSeedSnapshot(tb testing.TB) []byte {
	tb.Helper()
	t0 := time.Unix(1_700_000_001, 0)
	f := newTestFilter(tb, fuzzOpts, t0)
	f.Add([]byte("a"), t0)
	f.Add([]byte("b"), t0)
	f.Advance(t0.Add(f.Span()))
	f.Add([]byte("c"), t0.Add(f.Span()))
	return snapshotBytes(tb, f, 42)
}

// fuzzSeeds are the committed seed corpus files and the snapshots they hold.
func fuzzSeeds(tb testing.TB) map[string][]byte {
	tb.Helper()
	empty := newTestFilter(tb, fuzzOpts, time.Unix(1_700_000_001, 0))
	return map[string][]byte{
		"valid_snapshot": fuzzSeedSnapshot(tb),
		"empty_filter":   snapshotBytes(tb, empty, 0),
	}
}

const seedDir = "testdata/fuzz/FuzzReadSnapshot"

// TestFuzzSeedCorpus checks that the committed seeds are still valid
// snapshots, so the fuzzer starts from the current format. Run with
// -update-fuzz-seeds after changing the format.
func TestFuzzSeedCorpus(t *testing.T) {
	for name, want := range fuzzSeeds(t) {
		path := filepath.Join(seedDir, name)
		if *updateSeeds {
			content := fmt.Sprintf("go test fuzz v1\n[]byte(%+q)\n", want)
			if err := os.MkdirAll(seedDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -run TestFuzzSeedCorpus -update-fuzz-seeds)", err)
		}
		lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
		if len(lines) != 2 || lines[0] != "go test fuzz v1" || !strings.HasPrefix(lines[1], "[]byte(") {
			t.Fatalf("%s is not a fuzz corpus file", path)
		}
		seed, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if !bytes.Equal([]byte(seed), want) {
			t.Fatalf("%s differs from a fresh snapshot (run with -update-fuzz-seeds)", path)
		}
		if _, _, err := ReadSnapshot(bytes.NewReader([]byte(seed)), fuzzOpts); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
}

// FuzzReadSnapshot checks that ReadSnapshot never panics, fails only with
// this package's errors, and that any snapshot it accepts writes back to
// exactly the bytes it read.
func FuzzReadSnapshot(f *testing.F) {
	size, err := SnapshotSize(fuzzOpts)
	if err != nil {
		f.Fatal(err)
	}
	seed := fuzzSeedSnapshot(f)
	f.Add(seed[:len(seed)/2])
	f.Add([]byte("DSBF"))
	f.Add([]byte{})
	sentinels := []error{ErrBadMagic, ErrUnsupportedVersion, ErrChecksum, ErrTruncated, ErrMismatch, ErrCorrupt}

	f.Fuzz(func(t *testing.T, data []byte) {
		if int64(len(data)) > 2*size {
			return
		}
		r := bytes.NewReader(data)
		g, meta, err := ReadSnapshot(r, fuzzOpts)
		if err != nil {
			if g != nil {
				t.Fatalf("ReadSnapshot returned a filter with error %v", err)
			}
			known := false
			for _, s := range sentinels {
				known = known || errors.Is(err, s)
			}
			if !known {
				t.Fatalf("ReadSnapshot error %v wraps none of the package's errors", err)
			}
			return
		}
		consumed := data[:len(data)-r.Len()]
		var out bytes.Buffer
		if _, err := g.WriteSnapshot(&out, meta); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), consumed) {
			t.Fatalf("accepted snapshot writes back differently:\nread  %x\nwrote %x", consumed, out.Bytes())
		}
		// The loaded filter must be usable.
		g.Advance(time.Now())
		g.Add([]byte("x"), time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)) // newest generation

		if !g.Test([]byte("x")) {
			t.Fatal("loaded filter lost a key added to it")
		}
	})
}
