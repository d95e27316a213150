// Package version says which release of dedupe-stage a binary is, in one
// place: Release is the version this source tree releases, and Read tells
// what a binary reports, from the values stamped at build time and what
// the Go toolchain recorded in it.
//
//	v := version.Read("", "")       // no -ldflags stamp
//	fmt.Println(v.Version)         // "0.1.0" from the release tag, else "0.1.0-dev"
//	fmt.Println(v.NATSServer)      // the embedded nats-server's module version
//
// CHANGELOG.md's newest section, the Helm chart's appVersion and the
// image's OCI labels (Dockerfile) name Release too; a test keeps them
// equal.
package version

import (
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// Release is the version this source tree releases, without the "v" of
// its Git tag (v0.1.0). Raise it, CHANGELOG.md's section, the chart's
// appVersion and the Dockerfile's label together.
const Release = "0.1.0"

// DevSuffix marks a build that is not the release itself: a clone built
// without a tag, or without VCS stamping.
const DevSuffix = "-dev"

// NATSServerModule is the module path of the embedded nats-server.
const NATSServerModule = "github.com/nats-io/nats-server/v2"

// Info is what a binary reports about its build.
type Info struct {
	Version    string `json:"version"`     // "0.1.0", or "0.1.0-dev" for a build that is not the release
	Revision   string `json:"revision"`    // VCS revision, "-dirty" when modified; "unknown" when not recorded
	GoVersion  string `json:"go"`          // the toolchain that built it, e.g. "go1.26.8"
	Platform   string `json:"platform"`    // GOOS/GOARCH
	NATSServer string `json:"nats_server"` // the embedded nats-server's version, e.g. "2.15.3"
}

// release matches a release version as a module version records it:
// v1.2.3, with an optional "+dirty" that Go adds for a modified tree, but
// no pre-release part (a pseudo-version has one).
var release = regexp.MustCompile(`^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(\+[0-9A-Za-z.-]+)?$`)

// Resolve returns the Info of a binary from its build information (bi, ok
// as debug.ReadBuildInfo returns them) and the values stamped with -ldflags
// -X (empty when not stamped). The version is the stamped one when given;
// else the main module's version when it is a release (go install
// ...@v0.1.0, or a build of the tag's clean checkout); else Release with
// DevSuffix: a pseudo-version, "(devel)" and a build without VCS stamping
// all say which release they lead to. A leading "v" is dropped.
func Resolve(bi *debug.BuildInfo, ok bool, stampedVersion, stampedRevision string) Info {
	in := Info{
		Version:    stampedVersion,
		Revision:   stampedRevision,
		GoVersion:  runtime.Version(),
		Platform:   runtime.GOOS + "/" + runtime.GOARCH,
		NATSServer: server.VERSION,
	}
	if ok && bi != nil {
		if bi.GoVersion != "" {
			in.GoVersion = bi.GoVersion
		}
		if in.Version == "" && release.MatchString(bi.Main.Version) {
			in.Version = bi.Main.Version
		}
		if in.Revision == "" {
			in.Revision = vcsRevision(bi.Settings)
		}
		if v := depVersion(bi, NATSServerModule); v != "" {
			in.NATSServer = v
		}
	}
	if in.Version == "" {
		in.Version = Release + DevSuffix
	}
	in.Version = strings.TrimPrefix(in.Version, "v")
	in.NATSServer = strings.TrimPrefix(in.NATSServer, "v")
	if in.Revision == "" {
		in.Revision = "unknown"
	}
	return in
}

// Read is Resolve for the running binary.
func Read(stampedVersion, stampedRevision string) Info {
	bi, ok := debug.ReadBuildInfo()
	return Resolve(bi, ok, stampedVersion, stampedRevision)
}

// vcsRevision returns vcs.revision, with "-dirty" when vcs.modified is
// true, or "" when the build recorded none.
func vcsRevision(settings []debug.BuildSetting) string {
	rev, modified := "", false
	for _, s := range settings {
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
	return rev
}

// depVersion returns the version of the module path built into bi (its
// replacement's when replaced), or "".
func depVersion(bi *debug.BuildInfo, path string) string {
	for _, d := range bi.Deps {
		if d.Path != path {
			continue
		}
		if d.Replace != nil && d.Replace.Version != "" {
			return d.Replace.Version
		}
		return d.Version
	}
	return ""
}

// IsRelease reports whether v names a release rather than a development
// build: no pre-release part such as DevSuffix or a pseudo-version's.
func IsRelease(v string) bool {
	return release.MatchString(v) && !strings.Contains(v, "+")
}

// ImageLabels returns the OCI labels of the image of the release version
// at revision: the Dockerfile's LABEL lines (a test keeps them equal),
// with the revision added when known.
func ImageLabels(version, revision string) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       "dedupe-stage",
		"org.opencontainers.image.description": "A NATS JetStream stage that forwards each intent once",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.source":      "https://github.com/dedupe-stage/dedupe-stage",
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	if revision != "" && revision != "unknown" {
		l["org.opencontainers.image.revision"] = revision
	}
	return l
}
