package bloom

import (
	"bytes"
	"testing"
	"time"
)

// TestHashAddsAndTestsAsTheKey checks that a key's Hash, from a filter with
// the same options, sets and tests exactly what the key itself does: the
// filters built both ways are equal bit for bit, and each answers maybe for
// every key the other was given.
func TestHashAddsAndTestsAsTheKey(t *testing.T) {
	opts := Options{Window: time.Minute, Generations: 3, ExpectedKeys: 3000, FalsePositiveRate: 0.01}
	now := time.Unix(1_700_000_000, 0)
	byKey, byHash := newTestFilter(t, opts, now), newTestFilter(t, opts, now)
	other := newTestFilter(t, opts, now) // hashes for byHash: any filter with the same options
	for i := uint64(0); i < 1000; i++ {
		seen := now.Add(-time.Duration(i%4) * 20 * time.Second) // spread over the generations
		byKey.Add(testKey(1, i), seen)
		h := other.Hash(testKey(1, i))
		if h.IsZero() {
			t.Fatalf("Hash of key %d is the zero Hash", i)
		}
		byHash.AddHash(h, seen)
	}
	var a, b bytes.Buffer
	if _, err := byKey.WriteSnapshot(&a, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := byHash.WriteSnapshot(&b, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("the filter built with AddHash differs from the one built with Add")
	}
	for i := uint64(0); i < 1000; i++ {
		if !byKey.TestHash(byHash.Hash(testKey(1, i))) || !byHash.Test(testKey(1, i)) {
			t.Fatalf("key %d: an added key answers definitely not", i)
		}
	}
	var disagree int
	for i := uint64(0); i < 10000; i++ {
		if byKey.Test(testKey(2, i)) != byKey.TestHash(byKey.Hash(testKey(2, i))) {
			disagree++
		}
	}
	if disagree > 0 {
		t.Fatalf("Test and TestHash disagree on %d of 10000 keys never added", disagree)
	}
}
