// Package helm_test checks the Helm chart in dedupe-stage/ without a
// cluster, with Helm itself as a library: the chart lints as `helm lint
// --strict` would, and for each set of values a user would give, every
// object it renders decodes strictly into its Kubernetes API type (an
// unknown or misspelt field fails), its pods pass Pod Security "restricted"
// as the admission controller evaluates it, its probes ask the stage's
// endpoints on the port it listens on, and the configuration it mounts,
// with the environment each pod gets, passes what `dedupe-stage
// check-config` checks. The PrometheusRule carries configs/alerts.yml's
// rules.
package helm_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	psaapi "k8s.io/pod-security-admission/api"
	psapolicy "k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/kubetest"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

const (
	chartDir  = "dedupe-stage"
	namespace = "dedupe"
)

// valueSets are the installs the tests render: the values a user gives
// with -f, in YAML.
var valueSets = []struct {
	name    string
	release string
	values  string
	// Expected: the pods, state.partitions, and whether the optional
	// objects are there.
	replicas, partitions int
	group, monitoring    bool
}{
	{name: "single", release: "dedupe-stage", values: ``, replicas: 1, partitions: 8},
	{name: "group", release: "orders", values: `
group:
  enabled: true
config:
  key: {source: header, header: Order-Id}
nats:
  url: nats://nats-0.nats:4222,nats://nats-1.nats:4222,nats://nats-2.nats:4222
  auth:
    token: change-me
`, replicas: 3, partitions: 12, group: true},
	{name: "group-monitoring", release: "dedupe-stage", values: `
group:
  enabled: true
  replicas: 4
nats:
  auth:
    existingSecret: nats-login
serviceMonitor:
  enabled: true
  labels: {release: kube-prometheus-stack}
prometheusRule:
  enabled: true
  labels: {release: kube-prometheus-stack}
`, replicas: 4, partitions: 12, group: true, monitoring: true},
	{name: "group-monitoring-renamed", release: "clicks", values: `
group:
  enabled: true
  replicas: 6
serviceMonitor:
  enabled: true
prometheusRule:
  enabled: true
`, replicas: 6, partitions: 12, group: true, monitoring: true},
	{name: "tls-creds", release: "dedupe-stage", values: `
partitions: 16
nats:
  url: tls://nats.messaging.svc:4222
  creds:
    content: |
      -----BEGIN NATS USER JWT-----
      eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ
      ------END NATS USER JWT------
  tls:
    enabled: true
    ca: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    cert: "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n"
    key: "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
persistence:
  enabled: false
`, replicas: 1, partitions: 16},
	{name: "tls-existing-secrets", release: "dedupe-stage", values: `
group:
  enabled: true
  replicas: 2
nats:
  creds:
    existingSecret: dedupe-creds
    key: user.creds
  tls:
    enabled: true
    existingSecret: nats-client-tls
    mutual: true
`, replicas: 2, partitions: 12, group: true},
}

// parseValues reads values as Helm reads a -f file.
func parseValues(t *testing.T, s string) map[string]any {
	t.Helper()
	vals := map[string]any{}
	if err := yaml.Unmarshal([]byte(s), &vals); err != nil {
		t.Fatalf("values: %v", err)
	}
	return vals
}

// render renders the chart as `helm template` does, returning the
// rendered files by name.
func render(t *testing.T, release string, vals map[string]any) (map[string]string, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	opts := common.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true}
	rv, err := util.ToRenderValues(ch, vals, opts, common.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, rv)
}

// objects is every object a render produced, by kind and name.
type objects struct {
	configMaps      map[string]corev1.ConfigMap
	secrets         map[string]corev1.Secret
	services        map[string]corev1.Service
	serviceAccounts map[string]corev1.ServiceAccount
	statefulSets    map[string]appsv1.StatefulSet
	pdbs            map[string]policyv1.PodDisruptionBudget
	serviceMonitors map[string]serviceMonitor
	prometheusRules map[string]prometheusRule
	notes           string
}

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor the
// chart writes; a field outside it fails the strict decoding.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// prometheusRule is monitoring.coreos.com/v1 PrometheusRule, whose spec
// has the groups of a Prometheus rule file.
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              ruleFile `json:"spec"`
}

// ruleFile is a Prometheus rule file (configs/alerts.yml).
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

// rule is one alerting rule.
type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// decode decodes every document of every rendered file strictly into its
// type.
func decode(t *testing.T, files map[string]string) objects {
	t.Helper()
	o := objects{
		configMaps:      map[string]corev1.ConfigMap{},
		secrets:         map[string]corev1.Secret{},
		services:        map[string]corev1.Service{},
		serviceAccounts: map[string]corev1.ServiceAccount{},
		statefulSets:    map[string]appsv1.StatefulSet{},
		pdbs:            map[string]policyv1.PodDisruptionBudget{},
		serviceMonitors: map[string]serviceMonitor{},
		prometheusRules: map[string]prometheusRule{},
	}
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		if strings.HasSuffix(f, "NOTES.txt") {
			o.notes = files[f]
			continue
		}
		for i, doc := range strings.Split(files[f], "\n---\n") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s document %d: %v\n%s", f, i, err, doc)
			}
			where := fmt.Sprintf("%s %s", filepath.Base(f), tm.Kind)
			var obj any
			var add func() string
			switch tm.APIVersion + " " + tm.Kind {
			case "v1 ConfigMap":
				var x corev1.ConfigMap
				obj, add = &x, func() string { o.configMaps[x.Name] = x; return x.Name }
			case "v1 Secret":
				var x corev1.Secret
				obj, add = &x, func() string { o.secrets[x.Name] = x; return x.Name }
			case "v1 Service":
				var x corev1.Service
				obj, add = &x, func() string { o.services[x.Name] = x; return x.Name }
			case "v1 ServiceAccount":
				var x corev1.ServiceAccount
				obj, add = &x, func() string { o.serviceAccounts[x.Name] = x; return x.Name }
			case "apps/v1 StatefulSet":
				var x appsv1.StatefulSet
				obj, add = &x, func() string { o.statefulSets[x.Name] = x; return x.Name }
			case "policy/v1 PodDisruptionBudget":
				var x policyv1.PodDisruptionBudget
				obj, add = &x, func() string { o.pdbs[x.Name] = x; return x.Name }
			case "monitoring.coreos.com/v1 ServiceMonitor":
				var x serviceMonitor
				obj, add = &x, func() string { o.serviceMonitors[x.Name] = x; return x.Name }
			case "monitoring.coreos.com/v1 PrometheusRule":
				var x prometheusRule
				obj, add = &x, func() string { o.prometheusRules[x.Name] = x; return x.Name }
			default:
				t.Fatalf("%s document %d: unexpected %q %q", f, i, tm.APIVersion, tm.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Fatalf("%s: %v\n%s", where, err, doc)
			}
			if add() == "" {
				t.Errorf("%s without a name", where)
			}
		}
	}
	return o
}

// TestStrictDecodingRefusesUnknownFields shows that the decoding the
// rendered objects pass would fail a misspelt field, also in the small
// types of the Prometheus Operator's objects.
func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	var s appsv1.StatefulSet
	if err := yaml.UnmarshalStrict([]byte("apiVersion: apps/v1\nkind: StatefulSet\nspec:\n  replica: 3\n"), &s); err == nil || !strings.Contains(err.Error(), "replica") {
		t.Errorf("a StatefulSet with spec.replica decoded: %v", err)
	}
	var sm serviceMonitor
	if err := yaml.UnmarshalStrict([]byte("apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nspec:\n  endpoints:\n  - prot: http\n"), &sm); err == nil || !strings.Contains(err.Error(), "prot") {
		t.Errorf("a ServiceMonitor with an endpoint's prot decoded: %v", err)
	}
}

// TestLint lints the chart as `helm lint --strict` does, with each set of
// values: a warning fails as an error does.
func TestLint(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			l := lint.RunAll(chartDir, parseValues(t, vs.values), namespace)
			for _, m := range l.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("lint: %v", m)
				} else {
					t.Logf("lint: %v", m)
				}
			}
		})
	}
}

// TestRender renders each install and checks what a user relies on.
func TestRender(t *testing.T) {
	evaluator, err := psapolicy.NewEvaluator(psapolicy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	health := httptest.NewServer(stage.NewHealthHandler(prometheus.NewRegistry(), &stage.Health{}))
	t.Cleanup(health.Close)
	alerts := readRuleFile(t, "../../configs/alerts.yml")

	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			vals := parseValues(t, vs.values)
			files, err := render(t, vs.release, vals)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			o := decode(t, files)
			checkInstall(t, o, vs.replicas, vs.partitions, vs.group, evaluator, health.URL)
			checkMonitoring(t, o, vs.monitoring, alerts)
		})
	}
}

// checkInstall checks the StatefulSet and everything it references.
func checkInstall(t *testing.T, o objects, replicas, partitions int, group bool, evaluator psapolicy.Evaluator, healthURL string) {
	if len(o.statefulSets) != 1 {
		t.Fatalf("%d StatefulSets, want 1", len(o.statefulSets))
	}
	var sts appsv1.StatefulSet
	for _, s := range o.statefulSets {
		sts = s
	}
	pod := sts.Spec.Template.Spec
	podLabels := labels.Set(sts.Spec.Template.Labels)
	if sts.Spec.Replicas == nil || int(*sts.Spec.Replicas) != replicas {
		t.Errorf("replicas %v, want %d", sts.Spec.Replicas, replicas)
	}
	sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil || !sel.Matches(podLabels) {
		t.Errorf("the StatefulSet's selector %v does not select its pods %v: %v", sts.Spec.Selector, podLabels, err)
	}
	if svc, ok := o.services[sts.Spec.ServiceName]; !ok {
		t.Errorf("serviceName %q: no such Service", sts.Spec.ServiceName)
	} else if svc.Spec.ClusterIP != corev1.ClusterIPNone || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("Service %s is not headless or does not select the pods", svc.Name)
	}
	if _, ok := o.serviceAccounts[pod.ServiceAccountName]; !ok {
		t.Errorf("serviceAccountName %q: no such ServiceAccount", pod.ServiceAccountName)
	}

	// A group has a disruption budget that lets one pod go at a time; one
	// instance has none (it would block every drain).
	switch {
	case group && len(o.pdbs) != 1:
		t.Errorf("%d PodDisruptionBudgets for a group, want 1", len(o.pdbs))
	case !group && len(o.pdbs) != 0:
		t.Errorf("%d PodDisruptionBudgets for one instance, want 0", len(o.pdbs))
	}
	for _, pdb := range o.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || !sel.Matches(podLabels) {
			t.Errorf("PodDisruptionBudget %s does not select the pods: %v", pdb.Name, err)
		}
		if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
			t.Errorf("PodDisruptionBudget %s: maxUnavailable %v, want 1", pdb.Name, pdb.Spec.MaxUnavailable)
		}
	}

	// Pod Security "restricted", as the admission controller evaluates it.
	meta := sts.Spec.Template.ObjectMeta
	for _, r := range evaluator.EvaluatePod(psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}, &meta, &pod) {
		if !r.Allowed {
			t.Errorf("Pod Security restricted: %s: %s", r.ForbiddenReason, r.ForbiddenDetail)
		}
	}
	if sc := pod.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("the pod's seccompProfile is not RuntimeDefault: %+v", sc)
	}
	if len(pod.TopologySpreadConstraints) == 0 {
		t.Error("no topologySpreadConstraints")
	}
	for _, c := range pod.TopologySpreadConstraints {
		sel, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
		if err != nil || !sel.Matches(podLabels) {
			t.Errorf("topology spread over %s does not select the pods: %v", c.TopologyKey, err)
		}
	}

	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Error("the root file system is not read-only")
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("no %s request", r)
		}
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
		t.Error("no memory limit")
	}

	// Volumes: every mount is the pod's or the claim template's, and what
	// they reference exists (a Secret named in the values is the user's).
	volumes, claims, mounts, problems := kubetest.Mounts(pod, c, sts.Spec.VolumeClaimTemplates, o.configMaps)
	for _, p := range problems {
		t.Error(p)
	}
	// mountedFile reports whether path is a key of a Secret mounted at its
	// directory (checked against the Secret when the chart renders it).
	mountedFile := func(path string) bool {
		v, ok := volumes[mounts[filepath.Dir(path)]]
		if !ok || v.Secret == nil {
			return false
		}
		key := filepath.Base(path)
		if len(v.Secret.Items) > 0 {
			found := false
			for _, it := range v.Secret.Items {
				if it.Path == key {
					found, key = true, it.Key
				}
			}
			if !found {
				return false
			}
		}
		if sec, ok := o.secrets[v.Secret.SecretName]; ok {
			_, inString := sec.StringData[key]
			_, inData := sec.Data[key]
			return inString || inData
		}
		return true // the user's own Secret
	}

	// The environment of pod 0 as the kubelet sets it, and the mounted
	// configuration with that environment: what check-config accepts, and
	// what the values say.
	podName := sts.Name + "-0"
	image, err := kubetest.ImageEnv("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	kp := kubetest.Pod{Name: podName, Container: c, Volumes: volumes, Secrets: o.secrets, ConfigMaps: o.configMaps,
		// The user's own Secret: it holds one of the DEDUPE_NATS_*
		// credentials.
		OtherSecret: func(name string, env map[string]string) error {
			env["DEDUPE_NATS_TOKEN"] = "from-" + name
			return nil
		}}
	env, err := kp.Env(image)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kubetest.UnknownVars(env, config.EnvVars()) {
		t.Errorf("env %s: the stage reads no such variable", k)
	}
	cfg, data, err := kubetest.Config(kp, env, t.TempDir(), loadPodConfig)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	if _, err := stage.StreamsToCreate(cfg); err != nil {
		t.Fatalf("StreamsToCreate: %v", err)
	}
	if cfg.State.Partitions != partitions {
		t.Errorf("state.partitions %d, want %d", cfg.State.Partitions, partitions)
	}
	if group {
		if cfg.State.Partitions%replicas != 0 {
			t.Errorf("state.partitions %d is not a multiple of the %d replicas", cfg.State.Partitions, replicas)
		}
		if !cfg.ScaleOut.Enabled || cfg.ScaleOut.InstanceName() != podName {
			t.Errorf("scale_out enabled %v, instance %q: want a group member named %q", cfg.ScaleOut.Enabled, cfg.ScaleOut.InstanceName(), podName)
		}
	} else if cfg.ScaleOut.Enabled {
		t.Error("one instance with scale_out enabled")
	}
	if cfg.NATS.URL == "" {
		t.Error("no nats.url")
	}
	if name, ok := mounts[cfg.State.DataDir]; !ok || (!claims[name] && volumes[name].EmptyDir == nil) {
		t.Errorf("state.data_dir %s is not on the pod's own volume", cfg.State.DataDir)
	}
	for field, f := range map[string]string{
		"nats.creds_file":    cfg.NATS.CredsFile,
		"nats.tls.ca_file":   cfg.NATS.TLS.CAFile,
		"nats.tls.cert_file": cfg.NATS.TLS.CertFile,
		"nats.tls.key_file":  cfg.NATS.TLS.KeyFile,
	} {
		if f != "" && !mountedFile(f) {
			t.Errorf("%s %s: no such file in a mounted Secret", field, f)
		}
	}

	// The probes ask paths the stage serves, on the port it listens on;
	// liveness and readiness wait for the startup probe.
	host, port, err := net.SplitHostPort(cfg.HTTP.Addr)
	if err != nil {
		t.Fatalf("http.addr %q: %v", cfg.HTTP.Addr, err)
	}
	if host != "0.0.0.0" && host != "" {
		t.Errorf("http.addr %q: the kubelet cannot reach it", cfg.HTTP.Addr)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for _, p := range []struct {
		name, path string
		probe      *corev1.Probe
	}{
		{"startup", "/readyz", c.StartupProbe},
		{"readiness", "/readyz", c.ReadinessProbe},
		{"liveness", "/healthz", c.LivenessProbe},
	} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no %s HTTP probe", p.name)
			continue
		}
		n := p.probe.HTTPGet.Port.IntVal
		if s := p.probe.HTTPGet.Port.StrVal; s != "" {
			n = ports[s]
		}
		if strconv.Itoa(int(n)) != port {
			t.Errorf("%s probe on port %v (%d), the stage listens on %s", p.name, p.probe.HTTPGet.Port.String(), n, port)
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s probe on %s, want %s", p.name, p.probe.HTTPGet.Path, p.path)
		}
		resp, err := http.Get(healthURL + p.probe.HTTPGet.Path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			t.Errorf("%s probe path %s: the stage does not serve it", p.name, p.probe.HTTPGet.Path)
		}
	}
	if !strings.Contains(o.notes, sts.Name+"-0") {
		t.Errorf("NOTES.txt does not name pod %s-0:\n%s", sts.Name, o.notes)
	}
}

// checkMonitoring checks the ServiceMonitor and the PrometheusRule: there
// only when asked for, scraping the Service's port, and holding
// configs/alerts.yml's rules with the job the scrapes are named after.
func checkMonitoring(t *testing.T, o objects, on bool, alerts ruleFile) {
	want := 0
	if on {
		want = 1
	}
	if len(o.serviceMonitors) != want || len(o.prometheusRules) != want {
		t.Fatalf("%d ServiceMonitors and %d PrometheusRules, want %d", len(o.serviceMonitors), len(o.prometheusRules), want)
	}
	for _, sm := range o.serviceMonitors {
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		var svc *corev1.Service
		for _, s := range o.services {
			if sel.Matches(labels.Set(s.Labels)) {
				svc = &s
			}
		}
		if svc == nil {
			t.Fatalf("ServiceMonitor %s selects no Service", sm.Name)
		}
		if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Path != "/metrics" {
			t.Fatalf("ServiceMonitor %s: endpoints %+v, want /metrics", sm.Name, sm.Spec.Endpoints)
		}
		found := false
		for _, p := range svc.Spec.Ports {
			found = found || p.Name == sm.Spec.Endpoints[0].Port
		}
		if !found {
			t.Errorf("ServiceMonitor %s scrapes port %q, which Service %s does not name", sm.Name, sm.Spec.Endpoints[0].Port, svc.Name)
		}
		// The Prometheus Operator names the scrapes' job after the
		// Service: the rules must match it.
		for _, pr := range o.prometheusRules {
			want := withJob(alerts, svc.Name)
			if !reflect.DeepEqual(pr.Spec, want) {
				t.Errorf("PrometheusRule %s's rules differ from configs/alerts.yml's with job %q:\n%s", pr.Name, svc.Name, diffRules(pr.Spec, want))
			}
		}
	}
}

// withJob returns the rules with the job DedupeStageDown matches set to job.
func withJob(f ruleFile, job string) ruleFile {
	b, err := yaml.Marshal(f)
	if err != nil {
		panic(err)
	}
	var out ruleFile
	if err := yaml.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	for i := range out.Groups {
		for j := range out.Groups[i].Rules {
			r := &out.Groups[i].Rules[j]
			r.Expr = strings.ReplaceAll(r.Expr, `job="dedupe-stage"`, fmt.Sprintf("job=%q", job))
		}
	}
	return out
}

// diffRules names the first rules that differ.
func diffRules(got, want ruleFile) string {
	var b bytes.Buffer
	type key struct{ group, alert string }
	index := func(f ruleFile) map[key]rule {
		m := map[key]rule{}
		for _, g := range f.Groups {
			for _, r := range g.Rules {
				m[key{g.Name, r.Alert}] = r
			}
		}
		return m
	}
	g, w := index(got), index(want)
	for k, wr := range w {
		if gr, ok := g[k]; !ok {
			fmt.Fprintf(&b, "missing %s/%s\n", k.group, k.alert)
		} else if !reflect.DeepEqual(gr, wr) {
			fmt.Fprintf(&b, "%s/%s:\n got %+v\nwant %+v\n", k.group, k.alert, gr, wr)
		}
	}
	for k := range g {
		if _, ok := w[k]; !ok {
			fmt.Fprintf(&b, "extra %s/%s\n", k.group, k.alert)
		}
	}
	if b.Len() == 0 {
		b.WriteString("(the same rules, in another order)")
	}
	return b.String()
}

// readRuleFile reads a Prometheus rule file strictly.
func readRuleFile(t *testing.T, path string) ruleFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(f.Groups) == 0 {
		t.Fatalf("%s has no groups", path)
	}
	return f
}

// TestAlertsCopy checks that the chart's copy of the alert rules is
// configs/alerts.yml's: Helm reads no file outside the chart, so the
// PrometheusRule is built from the copy. Copy the file again when it fails.
func TestAlertsCopy(t *testing.T) {
	want := readRuleFile(t, "../../configs/alerts.yml")
	got := readRuleFile(t, filepath.Join(chartDir, "files", "alerts.yml"))
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s differs from configs/alerts.yml (cp configs/alerts.yml %s):\n%s",
			filepath.Join("deploy/helm", chartDir, "files/alerts.yml"), filepath.Join("deploy/helm", chartDir, "files/"), diffRules(got, want))
	}
}

// TestConfigChangeRollsPods checks that a changed configuration changes
// the pod template, so that `helm upgrade` restarts the pods with it.
func TestConfigChangeRollsPods(t *testing.T) {
	template := func(values string) map[string]string {
		files, err := render(t, "dedupe-stage", parseValues(t, values))
		if err != nil {
			t.Fatal(err)
		}
		o := decode(t, files)
		for _, s := range o.statefulSets {
			return s.Spec.Template.Annotations
		}
		t.Fatal("no StatefulSet")
		return nil
	}
	before := template(``)
	after := template("config:\n  key: {source: header, header: Order-Id}\n")
	if before["checksum/config"] == "" || before["checksum/config"] == after["checksum/config"] {
		t.Errorf("the pod template's checksum/config did not change with the configuration: %q, %q", before["checksum/config"], after["checksum/config"])
	}
	token := template("nats:\n  auth:\n    token: another\n")
	if token["checksum/secret"] == before["checksum/secret"] {
		t.Errorf("the pod template's checksum/secret did not change with the token")
	}
}

// TestRenderRefuses checks that values which would run a group badly, or
// be silently overridden, fail the install with a message naming the
// value.
func TestRenderRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, values, want string
	}{
		{"uneven partitions", "group: {enabled: true, replicas: 5}", "partitions: 12 is not a multiple of group.replicas 5"},
		{"uneven partitions given", "group: {enabled: true, replicas: 3}\npartitions: 8", "partitions: 8 is not a multiple of group.replicas 3"},
		{"partitions in config", "config: {state: {partitions: 12}}", "config.state.partitions: the chart sets it; use the value partitions"},
		{"http.addr in config", "config: {http: {addr: 0.0.0.0:9000}}", "config.http.addr: the chart sets it; use the value httpPort"},
		{"scale_out.enabled in config", "config: {scale_out: {enabled: true}}", "config.scale_out.enabled: the chart sets it; use the value group.enabled"},
		{"no NATS", "nats: {url: ''}", "nats.url"},
		{"two logins", "nats: {auth: {token: a, user: b, password: c}}", "nats.auth: give a token, or a user and password, not both"},
		{"TLS without files", "nats: {tls: {enabled: true}}", "nats.tls.enabled: give nats.tls.existingSecret"},
		{"too many partitions", "partitions: 2048", "partitions"},
		{"a misspelt value", "group: {enable: true}", "enable"},
		{"a misspelt section", "serviceMonitors: {enabled: true}", "serviceMonitors"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, "dedupe-stage", parseValues(t, tc.values))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render: %v, want an error with %q", err, tc.want)
			}
			t.Log(err)
		})
	}
	// Uneven, when asked for.
	if _, err := render(t, "dedupe-stage", parseValues(t, "group: {enabled: true, replicas: 5, allowUnevenPartitions: true}")); err != nil {
		t.Errorf("group.allowUnevenPartitions: %v", err)
	}
}

// loadPodConfig loads the file at path as the stage does with the
// environment getenv: config.Load, ApplyEnv, Validate (kubetest.Config).
func loadPodConfig(path string, getenv func(string) string) (config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return cfg, fmt.Errorf("config.Load: %w", err)
	}
	if err := cfg.ApplyEnv(getenv); err != nil {
		return cfg, fmt.Errorf("ApplyEnv: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("invalid:\n%w", err)
	}
	return cfg, nil
}
