package state

import (
	"context"
	"errors"
	"testing"
)

// TestScanRecords checks that ScanRecords gives the cursor first, then
// every record with what was claimed, and that a claim committed while a
// scan runs is not in its view.
func TestScanRecords(t *testing.T) {
	s := openStore(t, testOptions(t, t.TempDir(), 1))
	p := s.Partition(0)
	keys := testKeys("scan", 500)
	claims := make([]Claim, len(keys))
	for i, k := range keys {
		claims[i] = Claim{Key: k, Fingerprint: uint64(i)}
	}
	if _, err := p.ClaimWithCursor(claims[:400], 77); err != nil {
		t.Fatal(err)
	}
	want := make(map[string]uint64, 400)
	for _, c := range claims[:400] {
		want[string(c.Key)] = c.Fingerprint
	}
	var cursor uint64
	got := make(map[string]uint64)
	err := p.ScanRecords(context.Background(), func(c uint64) error {
		cursor = c
		return nil
	}, func(key []byte, r Record) error {
		if len(got) == 10 {
			// Claimed after the scan's view was taken: not in it.
			if _, err := p.ClaimWithCursor(claims[400:], 99); err != nil {
				return err
			}
		}
		if r.FirstSeen.IsZero() {
			t.Errorf("key %q: no FirstSeen", key)
		}
		got[string(key)] = r.Fingerprint
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cursor != 77 {
		t.Errorf("cursor %d, want 77", cursor)
	}
	if len(got) != len(want) {
		t.Fatalf("scanned %d records, want %d", len(got), len(want))
	}
	for k, fp := range want {
		if got[k] != fp {
			t.Fatalf("key %q: fingerprint %d, want %d", k, got[k], fp)
		}
	}
	stop := errors.New("stop")
	if err := p.ScanRecords(context.Background(), func(uint64) error { return stop }, nil); !errors.Is(err, stop) {
		t.Errorf("begin's error: %v, want it returned", err)
	}
}
