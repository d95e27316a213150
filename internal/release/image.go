package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/version"
)

// ImageName is the repository of the release's image; its tag is the
// version.
const ImageName = "dedupe-stage"

// imageUID owns the image's /data and /licenses, as the Dockerfile's
// COPY --chown=65532:65532 rootfs/ / does.
const imageUID = 65532

// ImageConfig is the "config" of an OCI image configuration: what the
// Dockerfile's instructions set.
type ImageConfig struct {
	User         string              `json:"User,omitempty"`
	ExposedPorts map[string]struct{} `json:"ExposedPorts,omitempty"`
	Env          []string            `json:"Env,omitempty"`
	Entrypoint   []string            `json:"Entrypoint,omitempty"`
	Cmd          []string            `json:"Cmd,omitempty"`
	Volumes      map[string]struct{} `json:"Volumes,omitempty"`
	Labels       map[string]string   `json:"Labels,omitempty"`
	StopSignal   string              `json:"StopSignal,omitempty"`
	Healthcheck  *Healthcheck        `json:"Healthcheck,omitempty"`
}

// Healthcheck is Docker's health check in an image configuration.
type Healthcheck struct {
	Test        []string      `json:"Test"`
	Interval    time.Duration `json:"Interval,omitempty"`
	Timeout     time.Duration `json:"Timeout,omitempty"`
	StartPeriod time.Duration `json:"StartPeriod,omitempty"`
	Retries     int           `json:"Retries,omitempty"`
}

// dockerfileConfig reads the image configuration from the Dockerfile at
// path: FROM must be scratch; ENV, LABEL, USER, VOLUME, EXPOSE,
// HEALTHCHECK, STOPSIGNAL, ENTRYPOINT and CMD are read; COPY is what
// imageLayer builds.
func dockerfileConfig(path string) (ImageConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ImageConfig{}, err
	}
	c := ImageConfig{ExposedPorts: map[string]struct{}{}, Volumes: map[string]struct{}{}, Labels: map[string]string{}}
	for _, line := range dockerfileLines(string(b)) {
		instr, args, _ := strings.Cut(line, " ")
		if err := c.apply(strings.ToUpper(instr), strings.TrimSpace(args)); err != nil {
			return c, fmt.Errorf("%s: %s: %w", path, instr, err)
		}
	}
	return c, nil
}

// apply sets what one Dockerfile instruction sets.
func (c *ImageConfig) apply(instr, args string) error {
	var err error
	switch instr {
	case "FROM":
		if args != "scratch" {
			return fmt.Errorf("FROM %s: the release builds images FROM scratch only", args)
		}
	case "ENV":
		for _, kv := range keyValues(args) {
			c.Env = append(c.Env, kv[0]+"="+kv[1])
		}
	case "LABEL":
		for _, kv := range keyValues(args) {
			c.Labels[kv[0]] = kv[1]
		}
	case "USER":
		c.User = args
	case "STOPSIGNAL":
		c.StopSignal = args
	case "EXPOSE":
		for _, p := range strings.Fields(args) {
			if !strings.Contains(p, "/") {
				p += "/tcp"
			}
			c.ExposedPorts[p] = struct{}{}
		}
	case "VOLUME":
		var list []string
		list, err = jsonList(args)
		for _, v := range list {
			c.Volumes[v] = struct{}{}
		}
	case "ENTRYPOINT":
		c.Entrypoint, err = jsonList(args)
	case "CMD":
		c.Cmd, err = jsonList(args)
	case "HEALTHCHECK":
		c.Healthcheck, err = parseHealthcheck(args)
	}
	return err
}

// jsonList reads an instruction's JSON form: ["a", "b"].
func jsonList(args string) ([]string, error) {
	var list []string
	if err := json.Unmarshal([]byte(args), &list); err != nil {
		return nil, fmt.Errorf("%s: want the JSON form: %w", args, err)
	}
	return list, nil
}

// dockerfileLines returns a Dockerfile's instructions, one a line: comment
// lines dropped, continued lines joined.
func dockerfileLines(text string) []string {
	var out []string
	var cur strings.Builder
	for _, l := range strings.Split(text, "\n") {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "#") || (t == "" && cur.Len() == 0) {
			continue
		}
		if s, ok := strings.CutSuffix(t, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(t)
		out = append(out, strings.TrimSpace(cur.String()))
		cur.Reset()
	}
	return out
}

// keyValue matches key=value and key="value" pairs of ENV and LABEL.
var keyValue = regexp.MustCompile(`([\w.-]+)=("(?:[^"\\]|\\.)*"|\S+)`)

// keyValues returns the key=value pairs of an ENV or LABEL instruction.
func keyValues(args string) [][2]string {
	var out [][2]string
	for _, m := range keyValue.FindAllStringSubmatch(args, -1) {
		v := m[2]
		if u, err := strconv.Unquote(v); err == nil {
			v = u
		}
		out = append(out, [2]string{m[1], v})
	}
	return out
}

// parseHealthcheck reads "--interval=10s ... CMD [...]".
func parseHealthcheck(args string) (*Healthcheck, error) {
	opts, cmd, ok := strings.Cut(args, "CMD ")
	if !ok {
		return nil, fmt.Errorf("%q: want [OPTIONS] CMD [...]", args)
	}
	hc := &Healthcheck{}
	if err := json.Unmarshal([]byte(strings.TrimSpace(cmd)), &hc.Test); err != nil {
		return nil, fmt.Errorf("CMD %s: want the JSON form: %w", cmd, err)
	}
	hc.Test = append([]string{"CMD"}, hc.Test...)
	for _, o := range strings.Fields(opts) {
		k, v, _ := strings.Cut(strings.TrimPrefix(o, "--"), "=")
		var err error
		switch k {
		case "interval":
			hc.Interval, err = time.ParseDuration(v)
		case "timeout":
			hc.Timeout, err = time.ParseDuration(v)
		case "start-period":
			hc.StartPeriod, err = time.ParseDuration(v)
		case "retries":
			hc.Retries, err = strconv.Atoi(v)
		default:
			err = fmt.Errorf("unknown option")
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o, err)
		}
	}
	return hc, nil
}

// imageLayer is the image's one layer, as the Dockerfile's two COPY lines
// make it from what deploy/build-images.sh lays out: /dedupe-stage, and
// /data and /licenses (LICENSE, NOTICE) owned by imageUID.
func imageLayer(root string, bin []byte, mtime time.Time) ([]byte, error) {
	entries := []entry{
		{name: "dedupe-stage", mode: 0o755, data: bin},
		{name: "data/", mode: 0o755 | fs.ModeDir, uid: imageUID, gid: imageUID},
		{name: "licenses/", mode: 0o755 | fs.ModeDir, uid: imageUID, gid: imageUID},
	}
	for _, f := range []string{"LICENSE", "NOTICE"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		entries = append(entries, entry{name: "licenses/" + f, mode: 0o644, data: b, uid: imageUID, gid: imageUID})
	}
	return tarball(entries, mtime)
}

// ociDescriptor is an OCI content descriptor.
type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    map[string]string `json:"platform,omitempty"`
}

// blob is content of an OCI layout, by digest.
type blob struct {
	mediaType string
	data      []byte
}

func (b blob) descriptor() ociDescriptor {
	sum := sha256.Sum256(b.data)
	return ociDescriptor{MediaType: b.mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(b.data))}
}

func (b blob) path() string {
	return "blobs/sha256/" + strings.TrimPrefix(b.descriptor().Digest, "sha256:")
}

// ociImage returns the image of bin for p as an OCI image layout in a tar
// archive, which docker load -i takes (its manifest.json names the tag,
// as docker save writes it): the Dockerfile's configuration with the OCI
// labels of src's version and revision (version.ImageLabels).
func ociImage(root string, bin []byte, src Source, p platform) ([]byte, error) {
	cfg, err := dockerfileConfig(filepath.Join(root, "Dockerfile"))
	if err != nil {
		return nil, err
	}
	for k, v := range version.ImageLabels(src.Version, src.Revision) {
		cfg.Labels[k] = v
	}
	cfg.Labels["org.opencontainers.image.created"] = src.Time.UTC().Format(time.RFC3339)
	layerTar, err := imageLayer(root, bin, src.Time)
	if err != nil {
		return nil, err
	}
	layer := blob{"application/vnd.oci.image.layer.v1.tar", layerTar}
	created := src.Time.UTC().Format(time.RFC3339)
	configJSON, err := json.Marshal(map[string]any{
		"created": created, "architecture": p.Arch, "os": p.OS, "config": cfg,
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{layer.descriptor().Digest}},
		"history": []map[string]string{{"created": created, "created_by": "go run ./internal/release (Dockerfile)"}},
	})
	if err != nil {
		return nil, err
	}
	config := blob{"application/vnd.oci.image.config.v1+json", configJSON}
	manifestJSON, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": config.descriptor(), "layers": []ociDescriptor{layer.descriptor()},
		"annotations": map[string]string{"org.opencontainers.image.version": src.Version, "org.opencontainers.image.created": created},
	})
	if err != nil {
		return nil, err
	}
	manifest := blob{"application/vnd.oci.image.manifest.v1+json", manifestJSON}
	ref := ImageName + ":" + src.Version
	md := manifest.descriptor()
	md.Annotations = map[string]string{"io.containerd.image.name": "docker.io/library/" + ref, "org.opencontainers.image.ref.name": src.Version}
	md.Platform = map[string]string{"architecture": p.Arch, "os": p.OS}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
		"manifests": []ociDescriptor{md}})
	if err != nil {
		return nil, err
	}
	dockerManifest, err := json.Marshal([]map[string]any{{"Config": config.path(), "RepoTags": []string{ref}, "Layers": []string{layer.path()}}})
	if err != nil {
		return nil, err
	}
	entries := []entry{
		{name: "blobs/", mode: 0o755 | fs.ModeDir}, {name: "blobs/sha256/", mode: 0o755 | fs.ModeDir},
		{name: "oci-layout", mode: 0o644, data: []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{name: "index.json", mode: 0o644, data: index},
		{name: "manifest.json", mode: 0o644, data: dockerManifest},
	}
	for _, b := range []blob{layer, config, manifest} {
		entries = append(entries, entry{name: b.path(), mode: 0o644, data: b.data})
	}
	return tarball(entries, src.Time)
}
