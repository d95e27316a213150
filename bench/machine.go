package main

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

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
