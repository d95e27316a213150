package main

import (
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version and revision may be set at build time with
// -ldflags "-X main.version=... -X main.revision=...". Left empty, they come
// from what the Go toolchain recorded in the binary (see buildVersion).
var (
	version  string
	revision string
)

// buildVersion returns the version and VCS revision of this binary: the
// values set with -ldflags when given, else the main module's version (a
// tag for `go install ...@v1.2.3`, a pseudo-version or "(devel)" for a
// local build) and vcs.revision, with "-dirty" when vcs.modified is true.
// What cannot be known is "unknown".
func buildVersion(bi *debug.BuildInfo, ok bool) (ver, rev string) {
	ver, rev = version, revision
	if ok && bi != nil {
		if ver == "" && bi.Main.Version != "" {
			ver = bi.Main.Version
		}
		if rev == "" {
			modified := false
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					modified = s.Value == "true"
				}
			}
			if rev != "" && modified {
				rev += "-dirty"
			}
		}
	}
	if ver == "" {
		ver = "unknown"
	}
	if rev == "" {
		rev = "unknown"
	}
	return ver, rev
}

// binaryVersion is buildVersion for the running binary.
func binaryVersion() (ver, rev string) {
	return buildVersion(debug.ReadBuildInfo())
}

// newBuildInfo returns the dedupe_build_info gauge: always 1, labelled with
// the binary's version and revision, so a dashboard can tell which build
// runs where.
func newBuildInfo(ver, rev string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "dedupe_build_info",
		Help:        "Always 1; the labels say which build of dedupe-stage is running.",
		ConstLabels: prometheus.Labels{"version": ver, "revision": rev},
	})
	g.Set(1)
	return g
}
