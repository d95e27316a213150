package main

import (
	"bufio"
	"context"
	"os"
	"strconv"
	"strings"
	"time"
)

// memWatch samples another process's memory while it works: its anonymous
// RSS (/proc/PID/status RssAnon) and its Go heap in use (its /metrics
// go_memstats_heap_inuse_bytes), keeping the largest of each. A sample
// every interval can miss a peak shorter than it; the process's peak RSS
// (VmHWM) misses nothing but counts file-backed pages too.
type memWatch struct {
	pid    int
	cancel context.CancelFunc
	done   chan struct{}

	anonFirst, anonMax, heapMax int64
	samples                     int
}

// watchMem starts sampling process pid, whose metrics are at addr, every
// interval until end.
func watchMem(ctx context.Context, pid int, addr string, interval time.Duration) *memWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &memWatch{pid: pid, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if st, ok := procStatus(pid); ok {
				if w.samples == 0 {
					w.anonFirst = st["RssAnon"]
				}
				w.anonMax = max(w.anonMax, st["RssAnon"])
				w.samples++
			}
			if s, err := scrape(ctx, addr); err == nil {
				w.heapMax = max(w.heapMax, int64(s.sum("go_memstats_heap_inuse_bytes")))
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// memPeaks is what a memWatch saw, in bytes.
type memPeaks struct {
	AnonFirst, AnonMax, HeapMax, PeakRSS int64
}

// end stops the sampling and returns the first and the largest anonymous
// RSS and the largest Go heap in use seen, and the process's peak RSS
// (VmHWM).
func (w *memWatch) end() memPeaks {
	w.cancel()
	<-w.done
	st, _ := procStatus(w.pid)
	return memPeaks{AnonFirst: w.anonFirst, AnonMax: w.anonMax, HeapMax: w.heapMax, PeakRSS: st["VmHWM"]}
}

// procStatus reads the kB fields of /proc/PID/status, in bytes.
func procStatus(pid int) (map[string]int64, bool) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil, false
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || !strings.HasSuffix(val, " kB") {
			continue
		}
		if kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(val, " kB")), 10, 64); err == nil {
			out[name] = kb << 10
		}
	}
	return out, true
}
