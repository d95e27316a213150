package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Options say what Build builds.
type Options struct {
	Dir       string     // where the files go; created
	Root      string     // the module's root: the checkout to build
	Source    Source     // the version, revision and time of the files
	Platforms []platform // the platforms of the archives
	Image     bool       // also an OCI image archive for each linux platform
}

// docs are the files each archive carries beside the binary.
var docs = []string{"LICENSE", "NOTICE", "README.md"}

// Build writes the release that o describes into o.Dir and returns the
// names of the files written, SHA256SUMS last.
func Build(o Options) ([]string, error) {
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	for _, p := range o.Platforms {
		names, err := buildPlatform(o, p)
		files = append(files, names...)
		if err != nil {
			return files, fmt.Errorf("%s: %w", p, err)
		}
	}
	if err := writeSums(o.Dir, files); err != nil {
		return files, err
	}
	return append(files, "SHA256SUMS"), nil
}

// baseName is the name of a platform's files, without their extension.
func baseName(v string, p platform) string {
	return fmt.Sprintf("dedupe-stage_%s_%s_%s", v, p.OS, p.Arch)
}

// buildPlatform builds the binary for p and writes its archive, its SBOM
// and, for linux, its image.
func buildPlatform(o Options, p platform) ([]string, error) {
	tmp, err := os.MkdirTemp("", "dedupe-release")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "dedupe-stage")
	if err := goBuild(o.Root, bin, o.Source, p); err != nil {
		return nil, err
	}
	binData, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	base := baseName(o.Source.Version, p)
	entries := []entry{{name: base + "/", mode: 0o755 | fs.ModeDir}, {name: base + "/dedupe-stage", mode: 0o755, data: binData}}
	for _, d := range docs {
		b, err := os.ReadFile(filepath.Join(o.Root, d))
		if err != nil {
			return nil, err
		}
		entries = append(entries, entry{name: base + "/" + d, mode: 0o644, data: b})
	}
	var files []string
	archive, err := tarGz(entries, o.Source.Time)
	if err != nil {
		return nil, err
	}
	if err := writeFile(o.Dir, base+".tar.gz", archive, &files); err != nil {
		return files, err
	}
	sbom, err := cycloneDX(bin, o.Source, p)
	if err != nil {
		return files, err
	}
	if err := writeFile(o.Dir, base+".cdx.json", sbom, &files); err != nil {
		return files, err
	}
	if !o.Image || p.OS != "linux" {
		return files, nil
	}
	img, err := ociImage(o.Root, binData, o.Source, p)
	if err != nil {
		return files, fmt.Errorf("image: %w", err)
	}
	return files, writeFile(o.Dir, base+".oci.tar", img, &files)
}

// writeFile writes data to dir/name and adds name to files.
func writeFile(dir, name string, data []byte, files *[]string) error {
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		return err
	}
	*files = append(*files, name)
	return nil
}

// goBuild builds the stage for p into out: static, -trimpath, no build
// ID and no VCS stamping, so that one commit gives one binary; the
// version and revision are stamped with -X. GOFLAGS from the environment
// is not used.
func goBuild(root, out string, src Source, p platform) error {
	ldflags := fmt.Sprintf("-s -w -buildid= -X main.version=%s -X main.revision=%s", src.Version, src.Revision)
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out, "./cmd/dedupe-stage")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Arch, "GOFLAGS=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, stderr.String())
	}
	return nil
}

// entry is a file or directory in an archive.
type entry struct {
	name     string
	mode     fs.FileMode
	data     []byte
	uid, gid int
}

// tarball writes entries, sorted by name, as a tar stream: every entry
// dated mtime, owned by its uid and gid with no user or group name.
func tarball(entries []entry, mtime time.Time) ([]byte, error) {
	entries = slices.Clone(entries)
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: int64(e.mode.Perm()), ModTime: mtime, Uid: e.uid, Gid: e.gid,
			Typeflag: tar.TypeReg, Size: int64(len(e.data)), Format: tar.FormatUSTAR}
		if e.mode.IsDir() {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarGz is tarball, gzipped with no time or name in the gzip header.
func tarGz(entries []entry, mtime time.Time) ([]byte, error) {
	t, err := tarball(entries, mtime)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(t); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeSums writes dir/SHA256SUMS for files, in the form sha256sum -c reads.
func writeSums(dir string, files []string) error {
	sorted := slices.Sorted(slices.Values(files))
	var b strings.Builder
	for _, f := range sorted {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		fmt.Fprintf(&b, "%s  %s\n", hex.EncodeToString(sum[:]), f)
	}
	return os.WriteFile(filepath.Join(dir, "SHA256SUMS"), []byte(b.String()), 0o644)
}
