package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/version"
)

// TestReleaseIsReproducible builds the host's release twice, into two
// directories, and checks that every file is the same byte for byte and
// holds what a user needs: the archive the binary (which reports the
// version) with LICENSE, NOTICE and README.md; SHA256SUMS that verify;
// an SBOM naming the nats-server built in; on linux, the image with the
// release's labels.
func TestReleaseIsReproducible(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH, so nothing can be built here:", err)
	}
	host := hostPlatform()
	src := Source{Version: version.Release + version.DevSuffix, Revision: "0123abcd", Time: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	build := func() (string, []string) {
		dir := t.TempDir()
		files, err := Build(Options{Dir: dir, Root: "../..", Source: src, Platforms: []platform{host}, Image: true})
		if err != nil {
			t.Fatal(err)
		}
		return dir, files
	}
	a, files := build()
	b, filesB := build()
	if !slices.Equal(files, filesB) {
		t.Fatalf("two builds wrote %q and %q", files, filesB)
	}
	base := baseName(src.Version, host)
	want := []string{base + ".tar.gz", base + ".cdx.json", "SHA256SUMS"}
	if host.OS == "linux" {
		want = []string{base + ".tar.gz", base + ".cdx.json", base + ".oci.tar", "SHA256SUMS"}
	}
	if !slices.Equal(files, want) {
		t.Errorf("files %q, want %q", files, want)
	}
	for _, f := range files {
		x, y := readFile(t, filepath.Join(a, f)), readFile(t, filepath.Join(b, f))
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs between two builds of one commit (%d and %d bytes)", f, len(x), len(y))
		}
	}
	checkSums(t, a, files)
	checkArchive(t, filepath.Join(a, base+".tar.gz"), base, src)
	checkSBOM(t, filepath.Join(a, base+".cdx.json"), src)
	if host.OS == "linux" {
		checkImage(t, filepath.Join(a, base+".oci.tar"), src)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkSums checks dir/SHA256SUMS against the files.
func checkSums(t *testing.T, dir string, files []string) {
	t.Helper()
	sums := string(readFile(t, filepath.Join(dir, "SHA256SUMS")))
	for _, f := range files[:len(files)-1] {
		sum := sha256.Sum256(readFile(t, filepath.Join(dir, f)))
		if line := hex.EncodeToString(sum[:]) + "  " + f + "\n"; !strings.Contains(sums, line) {
			t.Errorf("SHA256SUMS lacks %q:\n%s", line, sums)
		}
	}
}

// tarEntries reads a tar stream's headers and contents.
func tarEntries(t *testing.T, r io.Reader) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	tr := tar.NewReader(r)
	var hs []*tar.Header
	data := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hs, data
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		hs, data[h.Name] = append(hs, h), b
	}
}

// checkArchive checks the archive's entries, their owners and times, and
// runs its binary's version command where it can run.
func checkArchive(t *testing.T, path, base string, src Source) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(readFile(t, path)))
	if err != nil {
		t.Fatal(err)
	}
	if !zr.ModTime.IsZero() || zr.Name != "" {
		t.Errorf("gzip header carries time %v, name %q", zr.ModTime, zr.Name)
	}
	hs, data := tarEntries(t, zr)
	var names []string
	for _, h := range hs {
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(src.Time) {
			t.Errorf("%s: owner %d:%d (%q:%q), time %v; want 0:0, no names, %v", h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime, src.Time)
		}
	}
	want := []string{base + "/", base + "/LICENSE", base + "/NOTICE", base + "/README.md", base + "/dedupe-stage"}
	if !slices.Equal(names, want) {
		t.Errorf("archive holds %q, want %q", names, want)
	}
	bin := filepath.Join(t.TempDir(), "dedupe-stage")
	if err := os.WriteFile(bin, data[base+"/dedupe-stage"], 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("the archive's binary: version: %v\n%s", err, out)
	}
	for _, w := range []string{"dedupe-stage " + src.Version + "\n", "revision:    " + src.Revision} {
		if !strings.Contains(string(out), w) {
			t.Errorf("the archive's binary prints %q, which lacks %q", out, w)
		}
	}
}

// checkSBOM checks that the SBOM is CycloneDX naming the release and the
// nats-server go.mod requires.
func checkSBOM(t *testing.T, path string, src Source) {
	t.Helper()
	var bom CycloneDX
	if err := json.Unmarshal(readFile(t, path), &bom); err != nil {
		t.Fatal(err)
	}
	if bom.BOMFormat != "CycloneDX" || bom.SpecVersion != "1.5" || bom.Metadata.Component.Version != "v"+src.Version {
		t.Errorf("SBOM %s %s for %s %s", bom.BOMFormat, bom.SpecVersion, bom.Metadata.Component.Name, bom.Metadata.Component.Version)
	}
	gomod := string(readFile(t, "../../go.mod"))
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(version.NATSServerModule) + ` (v\S+)`).FindStringSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod does not require nats-server")
	}
	want := goPURL(version.NATSServerModule, m[1])
	var refs []string
	found := false
	for _, c := range bom.Components {
		refs = append(refs, c.BOMRef)
		if c.PURL == want && len(c.Hashes) == 1 && len(c.Hashes[0].Content) == 64 {
			found = true
		}
	}
	if !found {
		t.Errorf("the SBOM has no %s with its SHA-256; it has %q", want, refs)
	}
	if len(bom.Dependencies) != 1 || !slices.Equal(bom.Dependencies[0].DependsOn, refs) {
		t.Errorf("the SBOM's dependencies %+v do not list its components", bom.Dependencies)
	}
}

// checkImage reads the OCI archive: its tag, its labels (the release's),
// its configuration (the Dockerfile's) and its layer. With a Docker
// engine, docker load takes it and reports the labels.
func checkImage(t *testing.T, path string, src Source) {
	t.Helper()
	hs, data := tarEntries(t, bytes.NewReader(readFile(t, path)))
	for _, h := range hs {
		if !h.ModTime.Equal(src.Time) {
			t.Errorf("%s dated %v", h.Name, h.ModTime)
		}
	}
	var dm []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(data["manifest.json"], &dm); err != nil || len(dm) != 1 {
		t.Fatalf("manifest.json: %v %s", err, data["manifest.json"])
	}
	ref := ImageName + ":" + src.Version
	if !slices.Equal(dm[0].RepoTags, []string{ref}) {
		t.Errorf("the image is tagged %q, want %s", dm[0].RepoTags, ref)
	}
	var cfg struct {
		Config ImageConfig
	}
	if err := json.Unmarshal(data[dm[0].Config], &cfg); err != nil {
		t.Fatal(err)
	}
	labels := version.ImageLabels(src.Version, src.Revision)
	labels["org.opencontainers.image.created"] = src.Time.Format(time.RFC3339)
	if !maps.Equal(cfg.Config.Labels, labels) {
		t.Errorf("the image's labels %v, want %v", cfg.Config.Labels, labels)
	}
	want, err := dockerfileConfig("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != "65532:65532" || !slices.Equal(cfg.Config.Entrypoint, want.Entrypoint) || !slices.Equal(cfg.Config.Env, want.Env) ||
		cfg.Config.Healthcheck == nil || cfg.Config.Healthcheck.Retries != want.Healthcheck.Retries {
		t.Errorf("the image's configuration %+v is not the Dockerfile's %+v", cfg.Config, want)
	}
	layer, _ := tarEntries(t, bytes.NewReader(data[dm[0].Layers[0]]))
	var names []string
	for _, h := range layer {
		names = append(names, fmt.Sprintf("%s %d", h.Name, h.Uid))
	}
	if w := []string{"data/ 65532", "dedupe-stage 0", "licenses/ 65532", "licenses/LICENSE 65532", "licenses/NOTICE 65532"}; !slices.Equal(names, w) {
		t.Errorf("the layer holds %q, want %q", names, w)
	}
	dockerLoad(t, path, ref, src.Version)
}

// dockerLoad loads the archive into the Docker engine, when there is one,
// and checks the image's version label; the image is removed after.
func dockerLoad(t *testing.T, path, ref, ver string) {
	t.Helper()
	if err := exec.Command("docker", "info").Run(); err != nil {
		t.Logf("no Docker engine (%v): docker load not tried", err)
		return
	}
	tag := ref + "-test" + fmt.Sprint(time.Now().UnixNano())
	if out, err := exec.Command("docker", "load", "-i", path).CombinedOutput(); err != nil {
		t.Fatalf("docker load -i %s: %v\n%s", path, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", tag).Run() })
	if out, err := exec.Command("docker", "tag", ref, tag).CombinedOutput(); err != nil {
		t.Fatalf("docker tag: %v\n%s", err, out)
	}
	_ = exec.Command("docker", "rmi", ref).Run() // keep only the test's tag, removed above
	out, err := exec.Command("docker", "image", "inspect", "--format", `{{index .Config.Labels "org.opencontainers.image.version"}} {{.Config.User}}`, tag).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != ver+" 65532:65532" {
		t.Errorf("docker image inspect %s: %v: %q, want %q", tag, err, out, ver+" 65532:65532")
	}
	out, err = exec.Command("docker", "run", "--rm", "--network", "none", tag, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dedupe-stage "+ver+"\n") {
		t.Errorf("docker run %s version: %v\n%s", tag, err, out)
	}
}

// TestDockerfileConfig: the Dockerfile reads as the image the release
// builds, with the release's labels.
func TestDockerfileConfig(t *testing.T) {
	c, err := dockerfileConfig("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(c.Labels, version.ImageLabels(version.Release, "")) {
		t.Errorf("Dockerfile labels %v, want %v", c.Labels, version.ImageLabels(version.Release, ""))
	}
	if c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/dedupe-stage"}) || !slices.Equal(c.Cmd, []string{"run"}) ||
		c.StopSignal != "SIGTERM" || len(c.Volumes) != 1 || len(c.ExposedPorts) != 2 || !slices.Contains(c.Env, "DEDUPE_DATA_DIR=/data") {
		t.Errorf("Dockerfile read as %+v", c)
	}
	if hc := c.Healthcheck; hc == nil || !slices.Equal(hc.Test, []string{"CMD", "/dedupe-stage", "healthcheck"}) || hc.Interval != 10*time.Second || hc.Retries != 3 {
		t.Errorf("HEALTHCHECK read as %+v", c.Healthcheck)
	}
}
