package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dedupe-stage/dedupe-stage/state"
)

// runTest runs `dedupe-stage test args...` in process (cliRun).
func runTest(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return cliRun(t, append([]string{"test"}, args...)...)
}

// writeFile writes content to name in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTestExampleConfigs runs `dedupe-stage test` over every example
// configuration in configs/ with the cases file beside it: each ships
// with one, and every case passes.
func TestTestExampleConfigs(t *testing.T) {
	paths, err := filepath.Glob("../../configs/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, path := range paths {
		if strings.HasSuffix(path, ".cases.yaml") {
			continue
		}
		n++
		t.Run(filepath.Base(path), func(t *testing.T) {
			if _, err := os.Stat(strings.TrimSuffix(path, ".yaml") + ".cases.yaml"); err != nil {
				t.Fatalf("%s has no cases file beside it: %v", path, err)
			}
			code, out, errOut := runTest(t, path)
			if code != exitOK || !strings.Contains(out, " 0 failed") {
				t.Errorf("test %s: exit %d, want 0\n%s%s", path, code, out, errOut)
			}
		})
	}
	if n < 4 {
		t.Errorf("found %d example configurations in configs/, want at least 4", n)
	}
}

// failingCases are cases against configs/local.yaml of which three must
// fail: a wrong Nats-Msg-Id, a repeat expected as forwarded, and a wrong
// dead-letter reason.
const failingCases = `cases:
  - name: passes
    messages:
      - {subject: events.a, headers: {Nats-Msg-Id: k-0}, payload: x, want: forwarded}
  - name: wrong id
    messages:
      - subject: events.orders
        headers: {Nats-Msg-Id: order-1}
        payload: one
        want: {verdict: forwarded, subject: deduped.events.orders, msg_id: order-9}
  - name: a repeat expected as forwarded
    messages:
      - {subject: events.orders, headers: {Nats-Msg-Id: order-2}, payload: two, want: forwarded}
      - {subject: events.orders, headers: {Nats-Msg-Id: order-2}, payload: two, at: 30m, want: forwarded}
  - name: wrong reason
    messages:
      - {subject: events.orders, payload: no id, want: {verdict: dead_letter, reason: bad_key}}
`

// TestTestFailuresPrintTheDiff checks that a failing case prints the case,
// the message and expected against actual, and exits 1, while the cases
// that pass say ok.
func TestTestFailuresPrintTheDiff(t *testing.T) {
	cases := writeFile(t, t.TempDir(), "local.cases.yaml", failingCases)
	code, out, errOut := runTest(t, "../../configs/local.yaml", "--cases", cases)
	if code != exitFindings {
		t.Errorf("exit %d, want %d\n%s%s", code, exitFindings, out, errOut)
	}
	for _, want := range []string{
		"ok    passes (1 message)",
		"FAIL  wrong id (" + cases + ":5)",
		"message 1 (line 7): events.orders at 0s, Nats-Msg-Id: order-1, payload one",
		`expected: forwarded to deduped.events.orders as Nats-Msg-Id "order-9"`,
		`actual:   forwarded to deduped.events.orders as Nats-Msg-Id "order-1"`,
		`- Nats-Msg-Id: expected "order-9", actual "order-1"`,
		"FAIL  a repeat expected as forwarded",
		"message 2 (line 14): events.orders at 30m, Nats-Msg-Id: order-2, payload two",
		"expected: forwarded\n        actual:   repeat",
		"FAIL  wrong reason",
		"expected: dead_letter bad_key",
		`actual:   dead_letter no_key (header "Nats-Msg-Id" absent)`,
		"1 passed, 3 failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
}

// TestTestVersionWins checks stale: under key.version, versions 1, 3, 2,
// 3, 4 of one key forward 1, 3 and 4, each with its own Nats-Msg-Id, and
// a copy without a version is dead-lettered no_version.
func TestTestVersionWins(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "cdc.yaml", `key:
  source: json
  json_path: id
  version:
    source: json
    json_path: meta.version
window:
  paths: [{name: replay, max: 1h}]
  margin: 10m
`)
	writeFile(t, dir, "cdc.cases.yaml", `cases:
  - name: an older version never overwrites a newer one
    messages:
      - {subject: events.rows, json: {id: order-7, meta: {version: 1}}, want: {verdict: forwarded, msg_id: "order-7:v1"}}
      - {subject: events.rows, json: {id: order-7, meta: {version: 3}}, at: 1s, want: {verdict: forwarded, msg_id: "order-7:v3", headers: {Dedupe-Version: "3"}}}
      - {subject: events.rows, json: {id: order-7, meta: {version: 2}}, at: 2s, want: stale}
      - {subject: events.rows, json: {id: order-7, meta: {version: 3}}, at: 3s, want: stale}
      - {subject: events.rows, json: {id: order-7, meta: {version: 4}}, at: 4s, want: {verdict: forwarded, msg_id: "order-7:v4"}}
      - {subject: events.rows, json: {id: order-7}, at: 5s, want: {verdict: dead_letter, reason: no_version}}
`)
	if code, out, errOut := runTest(t, cfg); code != exitOK {
		t.Errorf("exit %d, want 0\n%s%s", code, out, errOut)
	}
}

// TestTestExplain checks --explain: a header key given by flags, a JSON
// key and scope given as JSON on stdin, and a message without its scope.
func TestTestExplain(t *testing.T) {
	t.Run("header key", func(t *testing.T) {
		code, out, errOut := runTest(t, "../../configs/local.yaml", "--explain", "--subject", "events.orders",
			"--header", "Nats-Msg-Id: order-1", "--payload", "hello")
		if code != exitOK {
			t.Fatalf("exit %d\n%s%s", code, out, errOut)
		}
		p := state.PartitionOf([]byte("order-1"), 8) // local.yaml has 8 partitions
		for _, want := range []string{
			"message:   events.orders at 0s, Nats-Msg-Id: order-1, payload hello",
			`key:       order-1 (header "Nats-Msg-Id", at most 256 bytes)`,
			"scope:     none (key.scope is not set)",
			"version:   none (key.version is not set)",
			fmt.Sprintf("partition: %d of 8", p),
			`verdict:   forwarded to deduped.events.orders as Nats-Msg-Id "order-1"`,
			"reason:    its key is new",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("the output lacks %q:\n%s", want, out)
			}
		}
	})
	explainStdin := func(t *testing.T, msg string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		err := testCmd([]string{"../../configs/webhooks.yaml", "--explain"}, strings.NewReader(msg), &out, &errOut)
		if err != nil {
			t.Fatalf("explain: %v\n%s%s", err, out.String(), errOut.String())
		}
		return out.String()
	}
	t.Run("json key on stdin", func(t *testing.T) {
		out := explainStdin(t, `{"subject": "webhooks.github.push", "headers": {"Webhook-Source": "github"}, "json": {"id": "evt-1"}}`)
		p := state.PartitionOf([]byte("github:evt-1"), 8) // webhooks.yaml has 8 partitions
		for _, want := range []string{
			`key:       github:evt-1 (json "id" scoped by header "Webhook-Source", at most 256 bytes)`,
			"scope:     github",
			fmt.Sprintf("partition: %d of 8", p),
			`verdict:   forwarded to deduped.webhooks.github.push as Nats-Msg-Id "github:evt-1"`,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("the output lacks %q:\n%s", want, out)
			}
		}
	})
	t.Run("bad message", func(t *testing.T) {
		out := explainStdin(t, `{"subject": "webhooks.github.push", "payload": "{\"id\": \"evt-1\"}"}`)
		for _, want := range []string{
			`key:       none (no_scope: scope: header "Webhook-Source" absent)`,
			`scope:     none (no_key: header "Webhook-Source" absent)`,
			"partition: none (dead-lettered before it reached a partition)",
			`verdict:   dead_letter no_scope (scope: header "Webhook-Source" absent)`,
			`reason:    no_scope: scope: header "Webhook-Source" absent`,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("the output lacks %q:\n%s", want, out)
			}
		}
	})
	t.Run("usage", func(t *testing.T) {
		if code, out, errOut := runTest(t, "../../configs/local.yaml", "--explain", "--header", "A:b"); code != exitUsage {
			t.Errorf("--header without --subject: exit %d, want %d\n%s%s", code, exitUsage, out, errOut)
		}
		if code, out, errOut := runTest(t, "../../configs/local.yaml", "--subject", "events.a"); code != exitUsage {
			t.Errorf("--subject without --explain: exit %d, want %d\n%s%s", code, exitUsage, out, errOut)
		}
	})
}

// TestTestTouchesNothingOutside runs cases of a configuration that names
// a NATS server, a data dir and an HTTP address, with $NATS_URL set too:
// the server (a listener the test holds) gets no connection, the data dir
// is never made, and the temporary directory is left as it was.
func TestTestTouchesNothingOutside(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	url := "nats://" + ln.Addr().String()
	t.Setenv("NATS_URL", url)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	cfg := writeFile(t, dir, "remote.yaml", fmt.Sprintf(`nats:
  url: %s
  create_streams: false
state:
  data_dir: %s
http:
  addr: %s
`, url, dataDir, ln.Addr()))
	writeFile(t, dir, "remote.cases.yaml", `cases:
  - name: a repeat
    messages:
      - {subject: events.a, headers: {Nats-Msg-Id: a}, payload: x, want: forwarded}
      - {subject: events.a, headers: {Nats-Msg-Id: a}, payload: x, at: 1m, want: repeat}
`)
	if code, out, errOut := runTest(t, cfg); code != exitOK {
		t.Fatalf("exit %d, want 0\n%s%s", code, out, errOut)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the configured NATS server got %d connections, want none", n)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("the configured data dir %s exists (%v), want it untouched", dataDir, err)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("the temporary directory holds %d entries after the run, want none: %v", len(left), left)
	}
}

// TestTestBadCasesFile checks that an invalid cases file exits 1 naming
// each problem with its line, and a missing one names the path.
func TestTestBadCasesFile(t *testing.T) {
	dir := t.TempDir()
	bad := writeFile(t, dir, "bad.cases.yaml", `cases:
  - name: x
    messages:
      - {subject: events.a, payload: x, at: 1m, want: forwarded, extra: 1}
      - {subject: events.a, payload: x, at: 10s, want: {verdict: dead_letter, reason: no_such}}
`)
	code, out, errOut := runTest(t, "../../configs/local.yaml", "--cases", bad)
	if code != exitFindings {
		t.Errorf("exit %d, want %d", code, exitFindings)
	}
	for _, want := range []string{
		`line 4: unknown field "extra" in a message`,
		`line 5: case "x", message 2: at 10s is before the message before it (1m)`,
		`line 5: want.reason: "no_such" is not a reason the stage dead-letters with`,
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s%s", want, out, errOut)
		}
	}
	missing := filepath.Join(dir, "none.yaml")
	writeFile(t, dir, "none.yaml", "")
	code, _, errOut = runTest(t, missing)
	if code != exitFindings || !strings.Contains(errOut, filepath.Join(dir, "none.cases.yaml")) {
		t.Errorf("a configuration without cases: exit %d, want 1 naming its cases file:\n%s", code, errOut)
	}
}
