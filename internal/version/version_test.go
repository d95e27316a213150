package version

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"
)

func TestResolve(t *testing.T) {
	settings := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	natsDep := []*debug.Module{{Path: NATSServerModule, Version: "v2.15.3"}}
	cases := []struct {
		name               string
		bi                 *debug.BuildInfo
		ok                 bool
		stampVer, stampRev string
		ver, rev, natsSrv  string
	}{
		{"go install at the release tag", &debug.BuildInfo{Main: debug.Module{Version: "v0.1.0"}, Deps: natsDep}, true, "", "",
			"0.1.0", "unknown", "2.15.3"},
		{"the tag's checkout, modified", &debug.BuildInfo{Main: debug.Module{Version: "v0.1.0+dirty"},
			Settings: settings("vcs.revision", "abc", "vcs.modified", "true")}, true, "", "",
			"0.1.0+dirty", "abc-dirty", server.VERSION},
		{"a clone past the tag", &debug.BuildInfo{Main: debug.Module{Version: "v0.1.1-0.20261201080000-abcdef123456"},
			Settings: settings("vcs.revision", "abcdef1234567890", "vcs.modified", "false")}, true, "", "",
			Release + "-dev", "abcdef1234567890", server.VERSION},
		{"a clone without VCS stamping", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, true, "", "",
			Release + "-dev", "unknown", server.VERSION},
		{"no build info", nil, false, "", "", Release + "-dev", "unknown", server.VERSION},
		{"-ldflags -X wins", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: settings("vcs.revision", "abc")}, true,
			"v9.9.9", "cafe", "9.9.9", "cafe", server.VERSION},
		{"a replaced nats-server", &debug.BuildInfo{Deps: []*debug.Module{{Path: NATSServerModule, Version: "v2.15.3",
			Replace: &debug.Module{Path: "../nats-server", Version: "v2.16.0-dev"}}}}, true, "", "",
			Release + "-dev", "unknown", "2.16.0-dev"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := Resolve(c.bi, c.ok, c.stampVer, c.stampRev)
			if in.Version != c.ver || in.Revision != c.rev || in.NATSServer != c.natsSrv {
				t.Errorf("Resolve = %q, %q, nats-server %q; want %q, %q, %q", in.Version, in.Revision, in.NATSServer, c.ver, c.rev, c.natsSrv)
			}
			if in.GoVersion == "" || in.Platform == "" {
				t.Errorf("Resolve left the Go version or the platform empty: %+v", in)
			}
		})
	}
}

// TestReadReportsTheBuiltInServer: this test binary is built with the
// module's nats-server, so Read names go.mod's version of it.
func TestReadReportsTheBuiltInServer(t *testing.T) {
	gomod := readRepo(t, "go.mod")
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(NATSServerModule) + ` v(\S+)`).FindStringSubmatch(gomod)
	if m == nil {
		t.Fatalf("go.mod does not require %s", NATSServerModule)
	}
	if got := Read("", "").NATSServer; got != m[1] {
		t.Errorf("Read().NATSServer = %q, want go.mod's %q", got, m[1])
	}
}

// TestReleaseNamedEverywhere keeps every place that names the release
// equal to Release: CHANGELOG.md's newest version section, the Helm
// chart's appVersion, the Dockerfile's OCI version label, the image
// the plain Kubernetes manifests run and the README's Install.
func TestReleaseNamedEverywhere(t *testing.T) {
	if !IsRelease(Release) {
		t.Fatalf("Release %q is not a version such as 1.2.3", Release)
	}
	if m := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\]`).FindStringSubmatch(readRepo(t, "CHANGELOG.md")); m == nil || m[1] != Release {
		t.Errorf("CHANGELOG.md's newest version section is %v, want ## [%s]", m, Release)
	}
	var chart struct {
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal([]byte(readRepo(t, "deploy/helm/dedupe-stage/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	if chart.AppVersion != Release {
		t.Errorf("deploy/helm/dedupe-stage/Chart.yaml: appVersion %q, want %q", chart.AppVersion, Release)
	}
	labels := DockerfileLabels(t)
	if got := labels["org.opencontainers.image.version"]; got != Release {
		t.Errorf("Dockerfile: label org.opencontainers.image.version %q, want %q", got, Release)
	}
	if want := ImageLabels(Release, ""); !maps.Equal(labels, want) {
		t.Errorf("Dockerfile's labels %v, want ImageLabels' %v (the release image's)", labels, want)
	}
	readme := readRepo(t, "README.md")
	for _, want := range []string{"cmd/dedupe-stage@v" + Release, "dedupe-stage_" + Release + "_linux_amd64.tar.gz", "dedupe-stage:" + Release} {
		if !strings.Contains(readme, want) {
			t.Errorf("README.md's Install does not name %q", want)
		}
	}
	if img := "image: dedupe-stage:" + Release; !strings.Contains(readRepo(t, "deploy/kubernetes/statefulset.yaml"), img) {
		t.Errorf("deploy/kubernetes/statefulset.yaml does not run %q", img)
	}
}

// DockerfileLabels returns the Dockerfile's LABEL keys and values.
func DockerfileLabels(t testing.TB) map[string]string {
	t.Helper()
	labels := map[string]string{}
	text := strings.ReplaceAll(readRepo(t, "Dockerfile"), "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "LABEL ")
		if !ok {
			continue
		}
		for _, m := range regexp.MustCompile(`([\w.-]+)="([^"]*)"`).FindAllStringSubmatch(rest, -1) {
			labels[m[1]] = m[2]
		}
	}
	if len(labels) == 0 {
		t.Fatal("Dockerfile has no LABEL")
	}
	return labels
}

func readRepo(t testing.TB, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
