package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/config"
	vers "github.com/dedupe-stage/dedupe-stage/internal/version"
)

// TestVersionCommand: version prints what the build reports, the
// release's version (with -dev off a release), the revision, the Go
// version and the embedded nats-server's; the admin service and
// dedupe_build_info say the same version.
func TestVersionCommand(t *testing.T) {
	var out, errb strings.Builder
	if code := realMain([]string{"version"}, &out, &errb); code != 0 {
		t.Fatalf("version: exit %d: %s", code, errb.String())
	}
	in := buildInfo()
	if !strings.HasPrefix(in.Version, vers.Release) {
		t.Errorf("version %q does not start with the release %q", in.Version, vers.Release)
	}
	for _, want := range []string{"dedupe-stage " + in.Version + "\n", "revision:    " + in.Revision, "go:          " + runtime.Version(),
		"nats-server: " + in.NATSServer + " (embedded)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("version printed %q, which lacks %q", out.String(), want)
		}
	}
	if in.NATSServer == "" || in.NATSServer == "unknown" {
		t.Errorf("the embedded nats-server's version is %q", in.NATSServer)
	}
	if got := serviceVersion(in.Version); got != in.Version {
		t.Errorf("the admin service's version is %q, want %q", got, in.Version)
	}
	reg := newRegistry(in)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "dedupe_build_info" {
			continue
		}
		for _, lp := range mf.GetMetric()[0].GetLabel() {
			if lp.GetName() == "version" {
				found = lp.GetValue() == in.Version
			}
		}
	}
	if !found {
		t.Errorf("dedupe_build_info has no version=%q", in.Version)
	}
}

func TestJSONLogsPrintDurationsAsStrings(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			log := newLogger(config.Log{Level: "info", Format: format}, &buf)
			log.Info("dedupe window derived", "window", 70*time.Minute, slog.Group("g", "ack_wait", 10*time.Second))
			line := buf.String()
			if format == "json" {
				var m map[string]any
				if err := json.Unmarshal([]byte(line), &m); err != nil {
					t.Fatalf("not JSON: %v: %s", err, line)
				}
				if m["window"] != "1h10m0s" {
					t.Errorf(`"window" is %#v, want "1h10m0s": %s`, m["window"], line)
				}
				if g, _ := m["g"].(map[string]any); g["ack_wait"] != "10s" {
					t.Errorf(`"g.ack_wait" is %#v, want "10s": %s`, g["ack_wait"], line)
				}
				return
			}
			if !strings.Contains(line, "window=1h10m0s") || !strings.Contains(line, "g.ack_wait=10s") {
				t.Errorf("text log %q lacks window=1h10m0s and g.ack_wait=10s", line)
			}
		})
	}
}
