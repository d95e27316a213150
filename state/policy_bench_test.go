package state

import (
	"syscall"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/window"
)

// BenchmarkClaimRepeat claims batches of 64 repeats of keys recorded
// before, with the sliding window off and on (each repeat then rewrites
// its record), fsynced and not: the cost per repeat of
// Options.RefreshOnRepeat. It reports repeats/s and the process's CPU
// µs/repeat (user + system, from getrusage).
func BenchmarkClaimRepeat(b *testing.B) {
	const keys, batch = 1 << 16, 64
	for _, bc := range []struct {
		name          string
		refresh, sync bool
	}{
		{"refresh=off/nosync", false, false},
		{"refresh=on/nosync", true, false},
		{"refresh=off/sync", false, true},
		{"refresh=on/sync", true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			opts := benchOptions(b.TempDir(), 1, 4_000_000)
			opts.RefreshOnRepeat = bc.refresh
			s := openStore(b, opts)
			fill(b, s, "rep", keys)
			if bc.sync {
				// Sync is Badger's open option: reopen the filled store with it.
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
				opts.SyncWrites = true
				s = openStore(b, opts)
			}
			clock := opts.Clock.(*window.ManualClock)
			p := s.Partition(0)
			claims := make([]Claim, batch)
			next := 0
			cpu0 := cpuTime(b)
			for b.Loop() {
				for j := range claims {
					claims[j] = Claim{Key: benchKey("rep", next%keys), Fingerprint: uint64(next % keys)}
					next++
				}
				clock.Advance(time.Millisecond) // each refresh moves the window
				res, err := p.Claim(claims)
				if err != nil || res[0].New || res[0].Refreshed != bc.refresh {
					b.Fatalf("Claim: %+v, %v; want a repeat, refreshed %v", res[0], err, bc.refresh)
				}
			}
			cpu := cpuTime(b) - cpu0
			b.ReportMetric(float64(next)/b.Elapsed().Seconds(), "repeats/s")
			b.ReportMetric(float64(cpu.Microseconds())/float64(next), "cpu-µs/repeat")
		})
	}
}

// cpuTime is the CPU time (user + system) the process has used.
func cpuTime(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
