package containertest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/dedupe-stage/dedupe-stage/config"
)

// repoRoot is the repository root, seen from this package's directory (the
// working directory of its tests).
const repoRoot = ".."

// needPromtool returns the path of promtool, or skips the test.
func needPromtool(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found (install Debian's prometheus package): skipping the check")
	}
	return p
}

// run runs name with args in dir, feeding stdin, and returns its combined
// output; a non-zero exit fails the test with the output.
func run(t testing.TB, timeout time.Duration, dir string, stdin []byte, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// metricRefRe finds metric names of the project in PromQL and in Go string
// literals.
var metricRefRe = regexp.MustCompile(`\bdedupe_[a-z0-9_]*[a-z0-9]`)

// definedMetrics returns the dedupe_ metric names the given Go files declare
// (as string literals), by file.
func definedMetrics(t testing.TB, globs ...string) map[string]string {
	t.Helper()
	lit := regexp.MustCompile(`"(dedupe_[a-z0-9_]+)"`)
	names := make(map[string]string)
	for _, g := range globs {
		files, err := filepath.Glob(filepath.Join(repoRoot, g))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
				names[m[1]] = f
			}
		}
	}
	return names
}

// allDefinedMetrics is every dedupe_ metric name declared in the module's
// non-test Go files.
func allDefinedMetrics(t testing.TB) map[string]string {
	t.Helper()
	return definedMetrics(t, "*/*.go", "*/*/*.go", "*/*/*/*.go")
}

// baseName strips the series suffixes a histogram or summary adds.
func baseName(name string, defined map[string]string) string {
	if _, ok := defined[name]; ok {
		return name
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(name, suf); ok {
			if _, ok := defined[b]; ok {
				return b
			}
		}
	}
	return name
}

// undefinedRefs returns the dedupe_ names in exprs that no Go file declares.
func undefinedRefs(exprs []string, defined map[string]string) []string {
	var bad []string
	for _, e := range exprs {
		for _, n := range metricRefRe.FindAllString(e, -1) {
			if _, ok := defined[baseName(n, defined)]; !ok && !slices.Contains(bad, n) {
				bad = append(bad, n)
			}
		}
	}
	sort.Strings(bad)
	return bad
}

func TestAlertRules(t *testing.T) {
	promtool := needPromtool(t)
	t.Run("check rules", func(t *testing.T) {
		out := run(t, time.Minute, repoRoot, nil, promtool, "check", "rules", "configs/alerts.yml")
		t.Log(strings.TrimSpace(out))
	})
	t.Run("unit tests", func(t *testing.T) {
		out := run(t, time.Minute, ".", nil, promtool, "test", "rules", "testdata/alerts_test.yml")
		if !strings.Contains(out, "SUCCESS") {
			t.Fatalf("promtool test rules did not report SUCCESS:\n%s", out)
		}
	})
}

// alertRules is the part of a Prometheus rule file the tests read.
type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func TestAlertsNameDefinedMetrics(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "configs", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules alertRules
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatalf("configs/alerts.yml: %v", err)
	}
	defined := allDefinedMetrics(t)
	var exprs []string
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
			alerts[r.Alert] = true
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: want a severity label and summary and description annotations", r.Alert)
			}
		}
	}
	if bad := undefinedRefs(exprs, defined); len(bad) > 0 {
		t.Errorf("configs/alerts.yml names metrics no Go file declares: %v", bad)
	}
	// The alerts the operator's kit promises.
	for _, a := range []string{
		"DedupeRepeatsNearWindowEnd", "DedupeDeadLetters", "DedupeConsumerLagGrowing",
		"DedupeFilterFalsePositiveRateHigh", "DedupeSinkStaleWritesRising",
		"DedupeStageUnhealthy", "DedupeStageNotReady",
	} {
		if !alerts[a] {
			t.Errorf("configs/alerts.yml has no alert %s", a)
		}
	}
}

func TestPrometheusConfig(t *testing.T) {
	promtool := needPromtool(t)
	// Lay the files out as compose mounts them: the rules next to the config.
	dir := t.TempDir()
	for src, dst := range map[string]string{"deploy/prometheus.yml": "prometheus.yml", "configs/alerts.yml": "alerts.yml"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, src))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, dst), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := run(t, time.Minute, dir, nil, promtool, "check", "config", "prometheus.yml")
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool check config:\n%s", out)
	}
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

func loadDashboard(t testing.TB) dashboard {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "configs", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("configs/grafana-dashboard.json does not parse: %v", err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("configs/grafana-dashboard.json: want a title, a uid and panels; got title %q uid %q, %d panels", d.Title, d.UID, len(d.Panels))
	}
	return d
}

// dashboardExprs returns every PromQL expression of the dashboard's panels
// and template variables, and checks the panels' layout on the way.
func dashboardExprs(t *testing.T, d dashboard) []string {
	t.Helper()
	var exprs []string
	ids := map[int]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if prev, dup := ids[p.ID]; dup || p.ID == 0 {
				t.Errorf("panel %q: id %d missing or shared with %q", p.Title, p.ID, prev)
			}
			ids[p.ID] = p.Title
			if p.GridPos == nil || p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %q: gridPos %+v is not inside the 24-column grid", p.Title, p.GridPos)
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no queries", p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q: query %s has no expr", p.Title, tg.RefID)
				}
				exprs = append(exprs, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		b, _ := json.Marshal(v.Query)
		exprs = append(exprs, string(b))
	}
	return exprs
}

func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	exprs := dashboardExprs(t, d)
	defined := allDefinedMetrics(t)

	t.Run("names defined metrics", func(t *testing.T) {
		if bad := undefinedRefs(exprs, defined); len(bad) > 0 {
			t.Errorf("the dashboard queries metrics no Go file declares: %v", bad)
		}
	})
	t.Run("shows every metric", func(t *testing.T) {
		used := map[string]bool{}
		for _, e := range exprs {
			for _, n := range metricRefRe.FindAllString(e, -1) {
				used[baseName(n, defined)] = true
			}
		}
		for _, group := range []struct{ name, glob string }{
			{"stage", "stage/*.go"},
			{"sink", "sink/*.go"},
			{"route step", "internal/scaleout/route/*.go"},
		} {
			names := definedMetrics(t, group.glob)
			if len(names) == 0 {
				t.Errorf("%s declares no dedupe_ metrics: has the package moved?", group.glob)
			}
			for n := range names {
				if !used[n] {
					t.Errorf("%s metric %s is on no dashboard panel: add it to configs/grafana-dashboard.json", group.name, n)
				}
			}
		}
	})
}

// TestMetricsDoc checks docs/metrics.md against the code: above its
// "Renamed" table it describes every metric the stage registers and names
// no other.
func TestMetricsDoc(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc, _, ok := strings.Cut(string(b), "\n## Renamed\n")
	if !ok {
		t.Fatal("docs/metrics.md has no \"## Renamed\" section")
	}
	defined := definedMetrics(t, "stage/*.go", "sink/*.go", "internal/scaleout/route/*.go", "internal/lograte/*.go",
		"internal/scaleout/*.go", "cmd/dedupe-stage/*.go")
	if bad := undefinedRefs([]string{doc}, defined); len(bad) > 0 {
		t.Errorf("docs/metrics.md names metrics no Go file declares: %v", bad)
	}
	described := map[string]bool{}
	for _, n := range metricRefRe.FindAllString(doc, -1) {
		described[baseName(n, defined)] = true
	}
	for n, f := range defined {
		if !described[n] {
			t.Errorf("%s (%s) is not in docs/metrics.md", n, f)
		}
	}
}

func TestDockerfiles(t *testing.T) {
	// The images must build without pulling: every stage FROM scratch.
	for _, f := range []string{"Dockerfile", "deploy/nats-server.Dockerfile"} {
		t.Run(f, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(repoRoot, f))
			if err != nil {
				t.Fatal(err)
			}
			var froms []string
			has := map[string]bool{}
			for _, line := range strings.Split(string(b), "\n") {
				fields := strings.Fields(line)
				if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
					continue
				}
				kw := strings.ToUpper(fields[0])
				has[kw] = true
				if kw == "FROM" {
					froms = append(froms, strings.Join(fields[1:], " "))
				}
				if kw == "USER" && fields[1] != "65532:65532" {
					t.Errorf("USER %s, want 65532:65532 (non-root)", fields[1])
				}
				// The health check must follow DEDUPE_HTTP_ADDR: no fixed address.
				if kw == "HEALTHCHECK" && strings.Contains(line, "--http-addr") {
					t.Errorf("HEALTHCHECK pins --http-addr; the healthcheck command reads DEDUPE_HTTP_ADDR itself: %s", line)
				}
			}
			if len(froms) != 1 || froms[0] != "scratch" {
				t.Errorf("FROM %q, want only scratch: no registry may be needed", froms)
			}
			for _, kw := range []string{"USER", "VOLUME", "EXPOSE", "ENTRYPOINT"} {
				if !has[kw] {
					t.Errorf("no %s instruction", kw)
				}
			}
		})
	}
}

// composeFile is the part of deploy/compose.yaml the tests read.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Ports       []string          `yaml:"ports"`
	} `yaml:"services"`
}

func TestCompose(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("deploy/compose.yaml: %v", err)
	}
	for _, name := range []string{"nats", "dedupe-stage", "prometheus"} {
		if _, ok := c.Services[name]; !ok {
			t.Errorf("no service %s", name)
		}
	}
	for name, s := range c.Services {
		for _, p := range s.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("service %s publishes %q: want it bound to 127.0.0.1", name, p)
			}
		}
	}
	st := c.Services["dedupe-stage"]
	if got := st.Environment["DEDUPE_NATS_URL"]; got != "nats://nats:4222" {
		t.Errorf("dedupe-stage DEDUPE_NATS_URL = %q, want nats://nats:4222", got)
	}
	if !slices.Contains(st.Command, "--create-streams") {
		t.Errorf("dedupe-stage command %q: want --create-streams (a server URL turns creation off)", st.Command)
	}
	nats := c.Services["nats"]
	if !slices.Contains(nats.Command, "-js") {
		t.Errorf("nats command %q: want -js (JetStream)", nats.Command)
	}
	// The compose NATS server syncs every write and requires a token, which
	// the stage is given.
	if i := slices.Index(nats.Command, "-c"); i < 0 || i+1 >= len(nats.Command) || nats.Command[i+1] != "/nats-server.conf" {
		t.Errorf("nats command %q: want -c /nats-server.conf (deploy/nats-server.conf)", nats.Command)
	}
	conf, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "nats-server.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sync_interval: always", "token: $NATS_TOKEN", "store_dir: /data"} {
		if !strings.Contains(string(conf), want) {
			t.Errorf("deploy/nats-server.conf lacks %q", want)
		}
	}
	if !strings.Contains(nats.Environment["NATS_TOKEN"], "${NATS_TOKEN:?") || !strings.Contains(st.Environment["DEDUPE_NATS_TOKEN"], "${NATS_TOKEN:?") {
		t.Errorf("compose must pass $NATS_TOKEN (required) to nats as NATS_TOKEN and to the stage as DEDUPE_NATS_TOKEN: nats %v, stage %v",
			nats.Environment, st.Environment)
	}

	// The compose tool's own validation, when there is one.
	tool := composeTool(t)
	if tool == nil {
		t.Log("neither docker compose nor docker-compose found: checked the file's content only")
		return
	}
	t.Setenv("NATS_TOKEN", "containertest")
	args := append(tool[1:], "-f", "deploy/compose.yaml", "config", "-q")
	run(t, time.Minute, repoRoot, nil, tool[0], args...)
	// The offline subset: nats and the stage alone.
	args = append(tool[1:], "-f", "deploy/compose.yaml", "config", "--services")
	if out := run(t, time.Minute, repoRoot, nil, tool[0], args...); !strings.Contains(out, "nats") || !strings.Contains(out, "dedupe-stage") {
		t.Errorf("compose config --services: %q", out)
	}
}

// TestComposeGroup checks deploy/compose-group.yaml without running it
// (TestContainerScaleOut runs it): the compose tool accepts it, every port
// is bound to loopback, every stage has a name of its own and the token,
// and the configuration the stages mount passes the stage's own validation
// with the environment compose gives them.
func TestComposeGroup(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "compose-group.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("deploy/compose-group.yaml: %v", err)
	}
	names := map[string]bool{}
	for _, svc := range []string{"nats1", "nats2", "nats3", "stage1", "stage2", "stage3"} {
		s, ok := c.Services[svc]
		if !ok {
			t.Errorf("no service %s", svc)
			continue
		}
		for _, p := range s.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("service %s publishes %q: want it bound to 127.0.0.1", svc, p)
			}
		}
		if !strings.HasPrefix(svc, "stage") {
			continue
		}
		env := s.Environment
		if names[env["DEDUPE_INSTANCE"]] || env["DEDUPE_INSTANCE"] == "" {
			t.Errorf("service %s: DEDUPE_INSTANCE %q, want a name of its own", svc, env["DEDUPE_INSTANCE"])
		}
		names[env["DEDUPE_INSTANCE"]] = true
		if !strings.Contains(env["DEDUPE_NATS_TOKEN"], "${NATS_TOKEN:?") {
			t.Errorf("service %s: DEDUPE_NATS_TOKEN %q, want the required $NATS_TOKEN", svc, env["DEDUPE_NATS_TOKEN"])
		}
		cfg, err := config.Load(filepath.Join(repoRoot, "deploy", "group-stage.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := cfg.ApplyEnv(func(k string) string {
			if strings.Contains(env[k], "${") {
				return "from-compose"
			}
			return env[k]
		}); err != nil {
			t.Fatal(err)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("service %s: deploy/group-stage.yaml with its environment: %v", svc, err)
		}
		if !cfg.ScaleOut.Enabled || cfg.ScaleOut.Replicas != 3 || cfg.ScaleOut.InstanceName() != env["DEDUPE_INSTANCE"] {
			t.Errorf("service %s: scale-out %+v, want on, 3 replicas, instance %s", svc, cfg.ScaleOut, env["DEDUPE_INSTANCE"])
		}
	}
	tool := composeTool(t)
	if tool == nil {
		t.Log("neither docker compose nor docker-compose found: checked the file's content only")
		return
	}
	t.Setenv("NATS_TOKEN", "containertest")
	run(t, time.Minute, repoRoot, nil, tool[0], append(tool[1:], "-f", "deploy/compose-group.yaml", "config", "-q")...)
}
