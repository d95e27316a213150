// Package kubernetes_test checks the Kubernetes manifests in this
// directory without a cluster: every document decodes strictly into its
// Kubernetes API type (an unknown or misspelt field fails), the
// StatefulSet references the ConfigMap, Secret and Service defined beside
// it, its pods pass what Pod Security "restricted" asks of their security
// contexts, its probes ask paths the stage serves on the port it listens
// on, and the configuration it mounts passes what `dedupe-stage
// check-config` checks, with the environment the pod sets, over a
// partition count its replicas divide.
package kubernetes_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/kubetest"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// manifests is every object of the directory, by kind.
type manifests struct {
	configMaps   map[string]corev1.ConfigMap
	secrets      map[string]corev1.Secret
	services     map[string]corev1.Service
	statefulSets map[string]appsv1.StatefulSet
	pdbs         map[string]policyv1.PodDisruptionBudget
}

// decodeStrict decodes one YAML document into out, failing on a field out
// does not have.
func decodeStrict(doc []byte, out any) error {
	return yaml.UnmarshalStrict(doc, out)
}

// loadManifests decodes every document of every *.yaml file in dir.
func loadManifests(t *testing.T, dir string) manifests {
	t.Helper()
	m := manifests{
		configMaps:   map[string]corev1.ConfigMap{},
		secrets:      map[string]corev1.Secret{},
		services:     map[string]corev1.Service{},
		statefulSets: map[string]appsv1.StatefulSet{},
		pdbs:         map[string]policyv1.PodDisruptionBudget{},
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(b, []byte("\n---\n")) {
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			where := filepath.Base(f) + " " + tm.Kind
			var obj any
			var name func() string
			switch tm.APIVersion + " " + tm.Kind {
			case "v1 ConfigMap":
				var o corev1.ConfigMap
				obj, name = &o, func() string { m.configMaps[o.Name] = o; return o.Name }
			case "v1 Secret":
				var o corev1.Secret
				obj, name = &o, func() string { m.secrets[o.Name] = o; return o.Name }
			case "v1 Service":
				var o corev1.Service
				obj, name = &o, func() string { m.services[o.Name] = o; return o.Name }
			case "apps/v1 StatefulSet":
				var o appsv1.StatefulSet
				obj, name = &o, func() string { m.statefulSets[o.Name] = o; return o.Name }
			case "policy/v1 PodDisruptionBudget":
				var o policyv1.PodDisruptionBudget
				obj, name = &o, func() string { m.pdbs[o.Name] = o; return o.Name }
			default:
				t.Fatalf("%s document %d: unexpected %q %q", f, i, tm.APIVersion, tm.Kind)
			}
			if err := decodeStrict(doc, obj); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if name() == "" {
				t.Errorf("%s without a name", where)
			}
		}
	}
	return m
}

// TestStrictDecodingRefusesUnknownFields shows that the decoding the
// manifests pass would fail a misspelt field.
func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	var s appsv1.StatefulSet
	err := decodeStrict([]byte("apiVersion: apps/v1\nkind: StatefulSet\nspec:\n  replica: 3\n"), &s)
	if err == nil || !strings.Contains(err.Error(), "replica") {
		t.Fatalf("a StatefulSet with spec.replica decoded: %v", err)
	}
}

// TestManifests checks the group's manifests against each other and
// against the stage.
func TestManifests(t *testing.T) {
	m := loadManifests(t, ".")
	if len(m.statefulSets) != 1 {
		t.Fatalf("%d StatefulSets, want 1", len(m.statefulSets))
	}
	var sts appsv1.StatefulSet
	for _, s := range m.statefulSets {
		sts = s
	}
	pod := sts.Spec.Template.Spec
	podLabels := labels.Set(sts.Spec.Template.Labels)

	sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil || !sel.Matches(podLabels) {
		t.Errorf("the StatefulSet's selector %v does not select its pods %v: %v", sts.Spec.Selector, podLabels, err)
	}
	if svc, ok := m.services[sts.Spec.ServiceName]; !ok {
		t.Errorf("serviceName %q: no such Service", sts.Spec.ServiceName)
	} else if svc.Spec.ClusterIP != corev1.ClusterIPNone || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("Service %s is not headless or does not select the pods", svc.Name)
	}
	if len(m.pdbs) != 1 {
		t.Errorf("%d PodDisruptionBudgets, want 1", len(m.pdbs))
	}
	for _, pdb := range m.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || !sel.Matches(podLabels) {
			t.Errorf("PodDisruptionBudget %s does not select the pods: %v", pdb.Name, err)
		}
	}

	// Pod Security "restricted" requires a non-root user and the runtime's
	// default (or a local) seccomp profile; the container drops every
	// capability.
	if sc := pod.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault ||
		sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("the pod may run as root or its seccompProfile is not RuntimeDefault: %+v", sc)
	}

	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if sc := c.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("the container may escalate privileges or keeps capabilities: %+v", sc)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("no %s request", r)
		}
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
		t.Error("no memory limit")
	}

	// Every volume the container mounts is the pod's or the claim
	// template's; the ConfigMap and Secret referenced exist.
	volumes, claims, mounts, problems := kubetest.Mounts(pod, c, sts.Spec.VolumeClaimTemplates, m.configMaps)
	for _, p := range problems {
		t.Error(p)
	}

	// The environment of pod 0, as the kubelet sets it, and the mounted
	// configuration with that environment: what check-config accepts.
	podName := sts.Name + "-0"
	image, err := kubetest.ImageEnv("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	kp := kubetest.Pod{Name: podName, Container: c, Volumes: volumes, Secrets: m.secrets, ConfigMaps: m.configMaps}
	env, err := kp.Env(image)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kubetest.UnknownVars(env, config.EnvVars()) {
		t.Errorf("env %s: the stage reads no such variable", k)
	}
	cfg, _, err := kubetest.Config(kp, env, t.TempDir(), loadPodConfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stage.StreamsToCreate(cfg); err != nil {
		t.Fatalf("StreamsToCreate: %v", err)
	}
	if !cfg.ScaleOut.Enabled || cfg.ScaleOut.InstanceName() != podName {
		t.Errorf("scale_out enabled %v, instance %q: want a group member named %q", cfg.ScaleOut.Enabled, cfg.ScaleOut.InstanceName(), podName)
	}
	if cfg.NATS.Token == "" {
		t.Error("no NATS token from the Secret")
	}
	if !strings.HasPrefix(cfg.NATS.URL, "nats://nats:4222") {
		t.Errorf("nats.url %q, want the NATS Helm chart's service nats://nats:4222", cfg.NATS.URL)
	}
	// Instances balance whole partitions: a replica count that does not
	// divide them leaves the busiest pod bounding the group.
	if sts.Spec.Replicas == nil || cfg.State.Partitions%int(*sts.Spec.Replicas) != 0 {
		t.Errorf("state.partitions %d is not a multiple of the StatefulSet's replicas %v", cfg.State.Partitions, sts.Spec.Replicas)
	}
	if name, ok := mounts[cfg.State.DataDir]; !ok || !claims[name] {
		t.Errorf("state.data_dir %s is not on the pod's own volume (a volume claim template)", cfg.State.DataDir)
	}

	// The probes ask paths the stage serves, on the port it listens on.
	_, port, err := net.SplitHostPort(cfg.HTTP.Addr)
	if err != nil {
		t.Fatalf("http.addr %q: %v", cfg.HTTP.Addr, err)
	}
	if host, _, _ := net.SplitHostPort(cfg.HTTP.Addr); host != "0.0.0.0" && host != "" {
		t.Errorf("http.addr %q: the kubelet cannot reach it", cfg.HTTP.Addr)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	srv := httptest.NewServer(stage.NewHealthHandler(prometheus.NewRegistry(), &stage.Health{}))
	defer srv.Close()
	for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
		if probe == nil || probe.HTTPGet == nil {
			t.Errorf("no %s HTTP probe", name)
			continue
		}
		p := probe.HTTPGet.Port
		n := p.IntVal
		if p.StrVal != "" {
			n = ports[p.StrVal]
		}
		if strconv.Itoa(int(n)) != port {
			t.Errorf("%s probe on port %v (%d), the stage listens on %s", name, p.String(), n, port)
		}
		resp, err := http.Get(srv.URL + probe.HTTPGet.Path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			t.Errorf("%s probe path %s: the stage does not serve it", name, probe.HTTPGet.Path)
		}
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe on %s, want /healthz", c.LivenessProbe.HTTPGet.Path)
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe on %s, want /readyz", c.ReadinessProbe.HTTPGet.Path)
	}
	// Liveness and readiness wait for the startup probe: the first ready,
	// once the filters are built.
	if c.StartupProbe != nil && c.StartupProbe.HTTPGet != nil && c.StartupProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("startup probe on %s, want /readyz", c.StartupProbe.HTTPGet.Path)
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
