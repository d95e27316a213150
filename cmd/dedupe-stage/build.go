package main

import (
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"

	vers "github.com/dedupe-stage/dedupe-stage/internal/version"
)

// version and revision may be stamped at build time with
// -ldflags "-X main.version=... -X main.revision=...". Left empty, they come
// from what the Go toolchain recorded in the binary (vers.Resolve).
var (
	version  string
	revision string
)

// buildInfo is what this binary reports about its build.
func buildInfo() vers.Info {
	return vers.Read(version, revision)
}

// binaryVersion returns this binary's version and VCS revision.
func binaryVersion() (ver, rev string) {
	in := buildInfo()
	return in.Version, in.Revision
}

// printVersion writes what `dedupe-stage version` prints.
func printVersion(w io.Writer, in vers.Info) {
	fmt.Fprintf(w, "dedupe-stage %s\n", in.Version)
	fmt.Fprintf(w, "  revision:    %s\n", in.Revision)
	fmt.Fprintf(w, "  go:          %s %s\n", in.GoVersion, in.Platform)
	fmt.Fprintf(w, "  nats-server: %s (embedded)\n", in.NATSServer)
}

// newBuildInfo returns the dedupe_build_info gauge: always 1, labelled with
// the binary's version and revision, so a dashboard can tell which build
// runs where.
func newBuildInfo(in vers.Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "dedupe_build_info",
		Help:        "Always 1; the labels say which build of dedupe-stage is running.",
		ConstLabels: prometheus.Labels{"version": in.Version, "revision": in.Revision},
	})
	g.Set(1)
	return g
}
