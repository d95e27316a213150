package main

import (
	"debug/buildinfo"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// CycloneDX is the part of a CycloneDX 1.5 BOM (cyclonedx.org) that the
// release writes: the binary as the application, and the Go modules
// built into it, standard library included, as its components.
type CycloneDX struct {
	BOMFormat    string          `json:"bomFormat"`
	SpecVersion  string          `json:"specVersion"`
	Version      int             `json:"version"`
	Metadata     cdxMetadata     `json:"metadata"`
	Components   []cdxComponent  `json:"components"`
	Dependencies []cdxDependency `json:"dependencies"`
}

type cdxMetadata struct {
	Timestamp string       `json:"timestamp"`
	Component cdxComponent `json:"component"`
}

type cdxComponent struct {
	BOMRef     string        `json:"bom-ref"`
	Type       string        `json:"type"`
	Name       string        `json:"name"`
	Version    string        `json:"version"`
	PURL       string        `json:"purl"`
	Hashes     []cdxHash     `json:"hashes,omitempty"`
	Properties []cdxProperty `json:"properties,omitempty"`
}

type cdxHash struct {
	Alg     string `json:"alg"`
	Content string `json:"content"`
}

type cdxProperty struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type cdxDependency struct {
	Ref       string   `json:"ref"`
	DependsOn []string `json:"dependsOn"`
}

// goPURL is the package URL of a Go module at a version.
func goPURL(path, version string) string {
	return "pkg:golang/" + path + "@" + version + "?type=module"
}

// cycloneDX returns the SBOM of the binary at bin, built from src for p:
// the modules its build information records (replacements as built), and
// the standard library at the Go version that built it.
func cycloneDX(bin string, src Source, p platform) ([]byte, error) {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("sbom: %w", err)
	}
	mainVersion := "v" + src.Version
	app := cdxComponent{BOMRef: goPURL(bi.Main.Path, mainVersion), Type: "application", Name: bi.Main.Path, Version: mainVersion,
		PURL: goPURL(bi.Main.Path, mainVersion), Properties: []cdxProperty{
			{Name: "go", Value: bi.GoVersion}, {Name: "GOOS", Value: p.OS}, {Name: "GOARCH", Value: p.Arch},
			{Name: "revision", Value: src.Revision}}}
	std := cdxComponent{Type: "library", Name: "std", Version: bi.GoVersion, PURL: goPURL("std", bi.GoVersion)}
	std.BOMRef = std.PURL
	comps := []cdxComponent{std}
	for _, d := range bi.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		c := cdxComponent{Type: "library", Name: m.Path, Version: m.Version, PURL: goPURL(m.Path, m.Version)}
		c.BOMRef = c.PURL
		if h, ok := strings.CutPrefix(m.Sum, "h1:"); ok {
			raw, err := base64.StdEncoding.DecodeString(h)
			if err != nil {
				return nil, fmt.Errorf("sbom: %s: sum %q: %w", m.Path, m.Sum, err)
			}
			c.Hashes = []cdxHash{{Alg: "SHA-256", Content: hex.EncodeToString(raw)}}
		}
		comps = append(comps, c)
	}
	slices.SortFunc(comps, func(a, b cdxComponent) int { return strings.Compare(a.BOMRef, b.BOMRef) })
	var refs []string
	for _, c := range comps {
		refs = append(refs, c.BOMRef)
	}
	bom := CycloneDX{BOMFormat: "CycloneDX", SpecVersion: "1.5", Version: 1,
		Metadata:     cdxMetadata{Timestamp: src.Time.UTC().Format(time.RFC3339), Component: app},
		Components:   comps,
		Dependencies: []cdxDependency{{Ref: app.BOMRef, DependsOn: refs}}}
	b, err := json.MarshalIndent(bom, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
