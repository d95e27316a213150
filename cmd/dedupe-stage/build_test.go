package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/config"
)

func TestBuildVersionFromBuildInfo(t *testing.T) {
	settings := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	cases := []struct {
		name     string
		bi       *debug.BuildInfo
		ok       bool
		ver, rev string
	}{
		{"go install at a tag", &debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}, true, "v1.4.0", "unknown"},
		{"local build in a clean checkout",
			&debug.BuildInfo{Main: debug.Module{Version: "v1.4.1-0.20261201080000-abcdef123456"}, Settings: settings("vcs.revision", "abcdef1234567890", "vcs.modified", "false")},
			true, "v1.4.1-0.20261201080000-abcdef123456", "abcdef1234567890"},
		{"local build with changes", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: settings("vcs.revision", "abcdef", "vcs.modified", "true")},
			true, "(devel)", "abcdef-dirty"},
		{"no build info", nil, false, "unknown", "unknown"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ver, rev := buildVersion(c.bi, c.ok)
			if ver != c.ver || rev != c.rev {
				t.Errorf("buildVersion = %q, %q; want %q, %q", ver, rev, c.ver, c.rev)
			}
		})
	}
}

func TestBuildVersionLdflagsWin(t *testing.T) {
	oldV, oldR := version, revision
	t.Cleanup(func() { version, revision = oldV, oldR })
	version, revision = "v9.9.9", "cafe"
	bi := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}}
	if ver, rev := buildVersion(bi, true); ver != "v9.9.9" || rev != "cafe" {
		t.Errorf("buildVersion = %q, %q; want the -ldflags values v9.9.9, cafe", ver, rev)
	}
}

func TestVersionCommandIsNotDev(t *testing.T) {
	var out, errb strings.Builder
	if code := realMain([]string{"version"}, &out, &errb); code != 0 {
		t.Fatalf("version: exit %d: %s", code, errb.String())
	}
	ver, rev := binaryVersion()
	want := "dedupe-stage " + ver + " (revision " + rev + ")\n"
	if out.String() != want || strings.Contains(out.String(), " dev ") {
		t.Errorf("version printed %q, want %q", out.String(), want)
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
