package state

import (
	"context"
	"errors"
	"math"
	"runtime"
	"testing"
	"time"
)

func TestClaimRefusesBelowMinFreeBytes(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		t.Skipf("free space is not measured on %s", runtime.GOOS)
	}
	s := openStore(t, testOptions(t, t.TempDir(), 1))
	p := s.Partition(0)
	if res, err := p.Claim([]Claim{{Key: []byte("seen"), Fingerprint: 1}}); err != nil || !res[0].New {
		t.Fatalf("Claim = %+v, %v; want New", res, err)
	}

	p.minFree = math.MaxInt64 // more than any file system has: as if it filled up
	if _, err := p.Claim([]Claim{{Key: []byte("new"), Fingerprint: 2}}); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("Claim of a new key on a full disk: error %v, want ErrDiskFull", err)
	}
	if r, err := p.Lookup([]byte("new"), time.Time{}); err != nil || r.Found || r.FilterSaidMaybe {
		t.Fatalf("Lookup after a refused Claim = %+v, %v; want nothing recorded", r, err)
	}
	// A repeat writes nothing, so it needs no space.
	if res, err := p.Claim([]Claim{{Key: []byte("seen"), Fingerprint: 1}}); err != nil || res[0].New {
		t.Fatalf("Claim of a recorded key on a full disk = %+v, %v; want a repeat", res, err)
	}

	p.minFree = 0 // the check off
	if res, err := p.Claim([]Claim{{Key: []byte("new"), Fingerprint: 2}}); err != nil || !res[0].New {
		t.Fatalf("Claim with the check off = %+v, %v; want New", res, err)
	}
}

func TestOpenRefusesBelowMinFreeBytes(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		t.Skipf("free space is not measured on %s", runtime.GOOS)
	}
	opts := testOptions(t, t.TempDir(), 2)
	opts.MinFreeBytes = math.MaxInt64
	if s, err := Open(context.Background(), opts); !errors.Is(err, ErrDiskFull) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("Open with MinFreeBytes %d: %v, want ErrDiskFull", opts.MinFreeBytes, err)
	}
	opts.MinFreeBytes = -1
	if _, err := Open(context.Background(), opts); !errors.Is(err, ErrBadOptions) {
		t.Fatalf("Open with MinFreeBytes -1: %v, want ErrBadOptions", err)
	}
}
