package main

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// MemSnap is the process's memory at one moment.
type MemSnap struct {
	// RSS is VmRSS from /proc/self/status: resident memory of the whole
	// process (Go heap, stacks, mapped files such as Badger's tables).
	RSS int64 `json:"rss_bytes"`
	// RSSAnon is RssAnon: the anonymous (not file-backed) part of RSS:
	// the Go heap, stacks, and Badger's memtable arenas and caches.
	RSSAnon int64 `json:"rss_anon_bytes"`
	// RSSFile is RssFile: the file-backed part of RSS, the pages of
	// memory-mapped files (Badger's tables, memtable logs and value logs)
	// that the process has touched and the kernel still maps.
	RSSFile int64 `json:"rss_file_bytes"`
	// PeakRSS is VmHWM: the peak RSS since the last resetPeak.
	PeakRSS int64 `json:"peak_rss_bytes"`
	// Heap is the Go heap's live bytes (HeapAlloc) after a forced GC.
	Heap int64 `json:"go_heap_bytes"`
	// RuntimeHeld is what the Go runtime holds from the OS (Sys less
	// HeapReleased): the heap's spans in use and idle, stacks and the
	// runtime's own metadata. RSSAnon above it is anonymous memory the
	// runtime does not account for.
	RuntimeHeld int64 `json:"go_runtime_held_bytes"`
}

// readMem forces a GC (twice, so that finalizers' garbage goes too),
// returns free memory to the OS and reads the process's memory.
func readMem() MemSnap {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := MemSnap{Heap: int64(ms.HeapAlloc), RuntimeHeld: int64(ms.Sys - ms.HeapReleased)}
	if st, err := proctest.Status(os.Getpid()); err == nil {
		s.RSS, s.RSSAnon, s.RSSFile, s.PeakRSS = st["VmRSS"], st["RssAnon"], st["RssFile"], st["VmHWM"]
	}
	return s
}

// resetPeak resets VmHWM to the current RSS (Linux: clear_refs 5). It is
// best effort: without it PeakRSS is the peak since the process started.
func resetPeak() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// diskUsage returns the bytes allocated on disk (st_blocks * 512, as du
// counts) and the apparent size of the regular files under dir. Badger
// preallocates sparse value-log files, so allocated is the honest figure.
func diskUsage(dir string) (allocated, apparent int64) {
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		apparent += info.Size()
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			allocated += st.Blocks * 512
		} else {
			allocated += info.Size()
		}
		return nil
	})
	return allocated, apparent
}

// percentiles returns the p-quantiles (0..1) of ds, which it sorts.
func percentiles(ds []time.Duration, ps ...float64) []time.Duration {
	out := make([]time.Duration, len(ps))
	if len(ds) == 0 {
		return out
	}
	slices.Sort(ds)
	for i, p := range ps {
		k := int(p*float64(len(ds))+0.5) - 1
		out[i] = ds[min(max(k, 0), len(ds)-1)]
	}
	return out
}

// ms returns d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// CPUSnap is the CPU time used so far by this process and by the machine.
type CPUSnap struct {
	at         time.Time
	self       time.Duration // user + system time of this process
	busy, wait float64       // machine-wide busy and iowait seconds (/proc/stat)
}

// clockTicks is USER_HZ, the unit of /proc/stat (100 on Linux).
const clockTicks = 100

func readCPU() CPUSnap {
	s := CPUSnap{at: time.Now()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return s
	}
	v := make([]float64, len(f)-1)
	for i := range v {
		v[i], _ = strconv.ParseFloat(f[i+1], 64)
	}
	// user nice system idle iowait irq softirq steal
	s.busy = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / clockTicks
	s.wait = v[4] / clockTicks
	return s
}

// CPUUse is what happened between two CPUSnaps.
type CPUUse struct {
	// Seconds is this process's CPU time (every goroutine: the system under
	// test, the in-process nats-server and the harness's polling).
	Seconds float64 `json:"cpu_seconds"`
	// Cores is Seconds over the wall time.
	Cores float64 `json:"cpu_cores"`
	// OtherCores is the CPU the rest of the machine used meanwhile, in
	// cores: other processes competing for the same CPUs.
	OtherCores float64 `json:"other_processes_cores"`
	// IOWaitCores is the machine's iowait, in cores.
	IOWaitCores float64 `json:"iowait_cores"`
}

func cpuSince(a CPUSnap) CPUUse {
	b := readCPU()
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return CPUUse{}
	}
	self := (b.self - a.self).Seconds()
	return CPUUse{
		Seconds:     self,
		Cores:       self / wall,
		OtherCores:  max(0, (b.busy-a.busy)-self) / wall,
		IOWaitCores: (b.wait - a.wait) / wall,
	}
}

// fileRSSByKind sums the resident pages of the process's file-backed
// mappings (/proc/self/smaps) by the file's extension: "sst" (Badger
// tables), "mem" (memtable logs), "vlog" (value logs) and "other" (the
// binary, shared libraries). Nil where smaps cannot be read.
func fileRSSByKind() map[string]int64 {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]int64{}
	kind := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			// A mapping's header: address perms offset dev inode [path].
			kind = ""
			if len(fields) >= 6 && strings.HasPrefix(fields[5], "/") {
				switch ext := filepath.Ext(fields[5]); ext {
				case ".sst", ".mem", ".vlog":
					kind = ext[1:]
				default:
					kind = "other"
				}
			}
			continue
		}
		if kind == "" || len(fields) < 2 || fields[0] != "Rss:" {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		out[kind] += kb << 10
	}
	return out
}

// Machine describes where the numbers were taken.
type Machine struct {
	NumCPU     int    `json:"nproc"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	CPUModel   string `json:"cpu_model"`
	MemTotal   string `json:"mem_total"`
	Kernel     string `json:"kernel"`
	GoVersion  string `json:"go_version"`
	// Disk is the device and filesystem holding the scratch directory.
	Disk string `json:"disk"`
	// FsyncP50us and FsyncP99us are the latency of a 4 KiB write + fsync
	// in the scratch directory (200 samples).
	FsyncP50us float64 `json:"fsync_p50_us"`
	FsyncP99us float64 `json:"fsync_p99_us"`
}

func probeMachine(dir string) Machine {
	m := Machine{NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version()}
	m.CPUModel = procField("/proc/cpuinfo", "model name")
	m.MemTotal = procField("/proc/meminfo", "MemTotal")
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.Disk = mountOf(dir)
	m.FsyncP50us, m.FsyncP99us = fsyncLatency(dir)
	return m
}

// procField returns the value of the first "name: value" line of path.
func procField(path, name string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// mountOf returns "device (fstype) on mountpoint" for the mount holding dir.
func mountOf(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ""
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return ""
	}
	defer f.Close()
	best, bestLen := "", -1
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 3 {
			continue
		}
		mp := fs[1]
		if (abs == mp || strings.HasPrefix(abs, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > bestLen {
			best, bestLen = fs[0]+" ("+fs[2]+") on "+mp, len(mp)
		}
	}
	return best
}

// fsyncLatency times 200 appends of 4 KiB, each followed by fsync, in dir.
func fsyncLatency(dir string) (p50, p99 float64) {
	f, err := os.CreateTemp(dir, "fsync-probe-")
	if err != nil {
		return 0, 0
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	ds := make([]time.Duration, 0, 200)
	for range 200 {
		t := time.Now()
		if _, err := f.Write(buf); err != nil {
			return 0, 0
		}
		if err := f.Sync(); err != nil {
			return 0, 0
		}
		ds = append(ds, time.Since(t))
	}
	p := percentiles(ds, 0.5, 0.99)
	return float64(p[0].Microseconds()), float64(p[1].Microseconds())
}
