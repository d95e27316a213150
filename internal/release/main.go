// Command release builds what a user downloads for one version of
// dedupe-stage (internal/version.Release), into one directory:
//
//	dedupe-stage_<version>_<os>_<arch>.tar.gz          the static binary, LICENSE, NOTICE, README.md
//	dedupe-stage_<version>_<os>_<arch>.cdx.json        a CycloneDX SBOM of the modules built in
//	dedupe-stage_<version>_linux_<arch>.oci.tar        the image, an OCI archive (docker load -i)
//	SHA256SUMS                                         the SHA-256 of each file above
//
// for linux and darwin on amd64 and arm64. Run it from a clean checkout
// of the release's tag (v0.1.0):
//
//	go run ./internal/release -out dist
//	go run ./internal/release -snapshot -platforms linux/amd64   # any commit: version 0.1.0-dev
//
// The output is reproducible: the same commit gives the same bytes. The
// binaries are built with -trimpath, -buildid= and no VCS stamping (the
// revision is stamped with -X); archive entries are sorted, owned by
// root (the image's /data by uid 65532), dated by the commit
// ($SOURCE_DATE_EPOCH when set); gzip carries no time or name. The image
// is built without Docker from the Dockerfile's instructions (ENV, LABEL,
// USER, ...) and the same binary, FROM scratch as the Dockerfile builds it.
//
// It is a Go program rather than a shell script so that the archives are
// byte for byte the same on any machine with Go (no GNU tar options, no
// docker buildx), and so that a test can build them.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/version"
)

// defaultPlatforms are the platforms of a release.
const defaultPlatforms = "linux/amd64,linux/arm64,darwin/amd64,darwin/arm64"

func main() {
	out := flag.String("out", "dist", "directory to write the release into (created; files of the same names are replaced)")
	snapshot := flag.Bool("snapshot", false, "build any commit, clean or not, as "+version.Release+version.DevSuffix+" instead of refusing")
	platforms := flag.String("platforms", defaultPlatforms, "comma-separated GOOS/GOARCH pairs to build")
	image := flag.Bool("image", true, "also write the image of each linux platform as an OCI archive")
	flag.Parse()
	if err := run(*out, *snapshot, *platforms, *image); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

// run builds the release into out, printing each file it writes.
func run(out string, snapshot bool, platforms string, image bool) error {
	src, err := describeSource(snapshot)
	if err != nil {
		return err
	}
	fmt.Printf("release %s (revision %s, dated %s)\n", src.Version, src.Revision, src.Time.Format(time.RFC3339))
	var plats []platform
	for _, p := range strings.Split(platforms, ",") {
		pl, err := parsePlatform(strings.TrimSpace(p))
		if err != nil {
			return err
		}
		plats = append(plats, pl)
	}
	files, err := Build(Options{Dir: out, Root: ".", Source: src, Platforms: plats, Image: image})
	for _, f := range files {
		fmt.Println("  " + f)
	}
	return err
}

// Source is the commit a release is built from.
type Source struct {
	Version  string    // the version the binaries report: version.Release, or with version.DevSuffix
	Revision string    // the commit, with -dirty for a modified tree; "unknown" outside Git
	Time     time.Time // every file's modification time: the commit's, or $SOURCE_DATE_EPOCH
}

// describeSource reads the commit of the working directory. Without
// snapshot it refuses a tree that is not the release's tag, clean.
func describeSource(snapshot bool) (Source, error) {
	src := Source{Version: version.Release, Revision: "unknown", Time: time.Unix(0, 0).UTC()}
	if rev, err := git("rev-parse", "HEAD"); err == nil {
		src.Revision = rev
		if ct, err := git("log", "-1", "--format=%ct"); err == nil {
			if s, err := strconv.ParseInt(ct, 10, 64); err == nil {
				src.Time = time.Unix(s, 0).UTC()
			}
		}
	}
	dirty := false
	if st, err := git("status", "--porcelain"); err == nil && st != "" {
		dirty = true
		src.Revision += "-dirty"
	}
	if e := os.Getenv("SOURCE_DATE_EPOCH"); e != "" {
		s, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			return src, fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since 1970", e)
		}
		src.Time = time.Unix(s, 0).UTC()
	}
	if snapshot {
		src.Version += version.DevSuffix
		return src, nil
	}
	tag, err := git("describe", "--tags", "--exact-match")
	switch {
	case err != nil || tag != "v"+version.Release:
		return src, fmt.Errorf("HEAD is not tagged v%s (internal/version.Release); tag it, or build with -snapshot", version.Release)
	case dirty:
		return src, errors.New("the working tree has changes; commit them, or build with -snapshot")
	}
	return src, nil
}

// git runs git with args and returns its output, trimmed.
func git(args ...string) (string, error) {
	b, err := exec.Command("git", args...).Output()
	return strings.TrimSpace(string(b)), err
}

// platform is a GOOS/GOARCH pair.
type platform struct{ OS, Arch string }

func (p platform) String() string { return p.OS + "/" + p.Arch }

// hostPlatform is the platform this program runs on.
func hostPlatform() platform { return platform{runtime.GOOS, runtime.GOARCH} }

// parsePlatform reads "linux/amd64".
func parsePlatform(s string) (platform, error) {
	os, arch, ok := strings.Cut(s, "/")
	if !ok || os == "" || arch == "" {
		return platform{}, fmt.Errorf("platform %q: want GOOS/GOARCH, such as linux/amd64", s)
	}
	return platform{os, arch}, nil
}
