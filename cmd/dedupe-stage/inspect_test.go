package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// get returns the status code and body of GET u, or -1 when it cannot be
// reached.
func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		return -1, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestInspectControl runs the binary with /inspect on (the default), off,
// and on its own listener: metrics and health stay on http.addr in every
// case, /inspect answers only where configured, and a key too long for
// the store is 400.
func TestInspectControl(t *testing.T) {
	srv := natstest.RunServer(t, "")
	for _, tc := range []struct {
		name      string
		fields    func(inspectAddr string) []string
		onMain    bool
		onOwn     bool
		ownListen bool
	}{
		{"default", func(string) []string { return nil }, true, false, false},
		{"off", func(string) []string { return []string{"inspect: false"} }, false, false, false},
		{"own listener", func(a string) []string { return []string{"inspect_addr: " + a} }, false, true, true},
		{"off wins over its own listener", func(a string) []string { return []string{"inspect: false", "inspect_addr: " + a} }, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, own := proctest.Addr(t), proctest.Addr(t)
			p := startStage(t, srv.ClientURL(), t.TempDir(), addr, tc.fields(own)...)
			for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
				if code, body := get(t, "http://"+addr+path); code != http.StatusOK {
					t.Errorf("%s on http.addr: %d %s", path, code, body)
				}
			}
			code, body := get(t, "http://"+addr+"/inspect?key=k")
			if tc.onMain != (code == http.StatusOK) {
				t.Errorf("/inspect on http.addr: %d %s; want served %v", code, body, tc.onMain)
			}
			code, body = get(t, "http://"+own+"/inspect?key=k")
			if tc.onOwn != (code == http.StatusOK) {
				t.Errorf("/inspect on http.inspect_addr: %d %s; want served %v", code, body, tc.onOwn)
			}
			if tc.ownListen {
				if code, _ := get(t, "http://"+own+"/metrics"); code != http.StatusNotFound {
					t.Errorf("/metrics on http.inspect_addr: %d, want 404", code)
				}
			}
			where := addr
			if tc.onOwn {
				where = own
			}
			if tc.onMain || tc.onOwn {
				long := strings.Repeat("k", 70000)
				if code, body := get(t, "http://"+where+"/inspect?key="+long); code != http.StatusBadRequest {
					t.Errorf("/inspect of a 70000-byte key: %d %s, want 400", code, proctest.Tail(body, 200))
				}
			}
			if !tc.onMain && !tc.onOwn && !strings.Contains(p.Log(), "/inspect is off") {
				t.Error("the log does not say /inspect is off")
			}
		})
	}
}
