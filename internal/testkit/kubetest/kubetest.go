// Package kubetest reads Kubernetes objects as the kubelet would run the
// stage from them: the environment a pod's container gets and the
// configuration it mounts. The tests of deploy/kubernetes and of the Helm
// chart share it, so that both hold their objects to one rule.
package kubetest

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ImageEnv returns the variables the Dockerfile's ENV instructions set (the
// "ENV K=V \" form, continued over lines).
func ImageEnv(dockerfile string) (map[string]string, error) {
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "ENV "); ok {
			line, in = rest, true
		} else if !in {
			continue
		}
		in = strings.HasSuffix(line, "\\")
		for _, kv := range strings.Fields(strings.TrimSuffix(line, "\\")) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, fmt.Errorf("%s: ENV %q: want K=V", dockerfile, kv)
			}
			env[k] = v
		}
	}
	if len(env) == 0 {
		return nil, fmt.Errorf("%s sets no ENV", dockerfile)
	}
	return env, nil
}

// Pod is what the environment and the mounted configuration of one pod's
// container are read from.
type Pod struct {
	Name       string                      // the pod's name, what metadata.name resolves to
	Container  corev1.Container            // the stage's container
	Volumes    map[string]corev1.Volume    // the pod's volumes by name
	Secrets    map[string]corev1.Secret    // the Secrets rendered beside the pod, by name
	ConfigMaps map[string]corev1.ConfigMap // the ConfigMaps rendered beside the pod, by name
	// OtherSecret is called for an envFrom Secret that is not in Secrets
	// (one the user brings); it may add to env, or refuse.
	OtherSecret func(name string, env map[string]string) error
}

// Env returns the container's environment as the kubelet sets it: the
// image's (image), then the Secrets of envFrom, then env, with
// metadata.name resolved to the pod's name.
func (p Pod) Env(image map[string]string) (map[string]string, error) {
	env := make(map[string]string, len(image))
	for k, v := range image {
		env[k] = v
	}
	for _, from := range p.Container.EnvFrom {
		if from.SecretRef == nil {
			return nil, fmt.Errorf("envFrom other than a Secret: %+v", from)
		}
		sec, ok := p.Secrets[from.SecretRef.Name]
		if !ok {
			if p.OtherSecret == nil {
				return nil, fmt.Errorf("envFrom: no Secret %s", from.SecretRef.Name)
			}
			if err := p.OtherSecret(from.SecretRef.Name, env); err != nil {
				return nil, err
			}
			continue
		}
		for k, v := range sec.StringData {
			env[k] = v
		}
		for k, v := range sec.Data {
			env[k] = string(v)
		}
	}
	for _, e := range p.Container.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = p.Name
		default:
			return nil, fmt.Errorf("env %s: unexpected source %+v", e.Name, e.ValueFrom)
		}
	}
	return env, nil
}

// UnknownVars returns the variables of env that the stage does not read,
// sorted: those not in known (config.EnvVars), but DEDUPE_CONFIG, which
// names the file.
func UnknownVars(env, known map[string]string) []string {
	var unknown []string
	for k := range env {
		if _, ok := known[k]; !ok && k != "DEDUPE_CONFIG" {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	return unknown
}

// Config returns the configuration the container runs with: the file
// DEDUPE_CONFIG names, read from the ConfigMap mounted at its directory,
// written to dir and loaded by load with env as the process's
// environment. load is the caller's, so that this package needs none of
// the module's configuration: config.Load, then ApplyEnv and Validate, as
// check-config does. The file's text comes back too, for error messages.
func Config[C any](p Pod, env map[string]string, dir string, load func(path string, getenv func(string) string) (C, error)) (C, string, error) {
	var zero C
	cfgPath := env["DEDUPE_CONFIG"]
	var vol corev1.Volume
	found := false
	for _, vm := range p.Container.VolumeMounts {
		if vm.MountPath == filepath.Dir(cfgPath) {
			vol, found = p.Volumes[vm.Name]
		}
	}
	if !found || vol.ConfigMap == nil {
		return zero, "", fmt.Errorf("DEDUPE_CONFIG %q is not in a mounted ConfigMap", cfgPath)
	}
	data, ok := p.ConfigMaps[vol.ConfigMap.Name].Data[filepath.Base(cfgPath)]
	if !ok {
		return zero, "", fmt.Errorf("ConfigMap %s has no key %s", vol.ConfigMap.Name, filepath.Base(cfgPath))
	}
	path := filepath.Join(dir, filepath.Base(cfgPath))
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		return zero, data, err
	}
	cfg, err := load(path, func(k string) string { return env[k] })
	if err != nil {
		return cfg, data, fmt.Errorf("the mounted configuration %s: %w", filepath.Base(cfgPath), err)
	}
	return cfg, data, nil
}

// Mounts checks the pod's storage: every volume the container mounts is
// the pod's or a claim template's, every ConfigMap a volume names is in
// configMaps, and every claim template requests storage. It returns the
// pod's volumes by name, the claim templates by name, the mounts (path to
// volume name) and each problem found.
func Mounts(spec corev1.PodSpec, c corev1.Container, claimTemplates []corev1.PersistentVolumeClaim, configMaps map[string]corev1.ConfigMap) (volumes map[string]corev1.Volume, claims map[string]bool, mounts map[string]string, problems []string) {
	volumes = map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
		if v.ConfigMap != nil {
			if _, ok := configMaps[v.ConfigMap.Name]; !ok {
				problems = append(problems, fmt.Sprintf("volume %s: no ConfigMap %s", v.Name, v.ConfigMap.Name))
			}
		}
	}
	claims = map[string]bool{}
	for _, pvc := range claimTemplates {
		claims[pvc.Name] = true
		if _, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; !ok {
			problems = append(problems, fmt.Sprintf("volume claim %s requests no storage", pvc.Name))
		}
	}
	mounts = map[string]string{}
	for _, vm := range c.VolumeMounts {
		if _, ok := volumes[vm.Name]; !ok && !claims[vm.Name] {
			problems = append(problems, fmt.Sprintf("mount %s: no volume %s", vm.MountPath, vm.Name))
		}
		mounts[vm.MountPath] = vm.Name
	}
	return volumes, claims, mounts, problems
}
