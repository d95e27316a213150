package config

import (
	"strings"
	"testing"
)

func TestHTTPInspect(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    map[string]string
		want   string // InspectOn
		errSub string // a part of the validation error, "" for none
	}{
		{"default: on http.addr", nil, "127.0.0.1:9464", ""},
		{"off", map[string]string{"DEDUPE_HTTP_INSPECT": "false"}, "", ""},
		{"own listener", map[string]string{"DEDUPE_HTTP_INSPECT_ADDR": "127.0.0.1:9465"}, "127.0.0.1:9465", ""},
		{"off wins", map[string]string{"DEDUPE_HTTP_INSPECT": "false", "DEDUPE_HTTP_INSPECT_ADDR": "127.0.0.1:9465"}, "", ""},
		{"same as http.addr", map[string]string{"DEDUPE_HTTP_INSPECT_ADDR": "127.0.0.1:9464"}, "127.0.0.1:9464", "http.inspect_addr: \"127.0.0.1:9464\" is http.addr"},
		{"bad address", map[string]string{"DEDUPE_HTTP_INSPECT_ADDR": "nowhere"}, "nowhere", "http.inspect_addr: \"nowhere\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			if err := c.ApplyEnv(func(k string) string { return tc.env[k] }); err != nil {
				t.Fatal(err)
			}
			if got := c.HTTP.InspectOn(); got != tc.want {
				t.Errorf("InspectOn() = %q, want %q", got, tc.want)
			}
			err := c.Validate()
			if tc.errSub == "" && err != nil {
				t.Errorf("Validate: %v", err)
			}
			if tc.errSub != "" && (err == nil || !strings.Contains(err.Error(), tc.errSub)) {
				t.Errorf("Validate: %v, want an error containing %q", err, tc.errSub)
			}
		})
	}
	c := Default()
	if err := c.ApplyEnv(func(k string) string {
		if k == "DEDUPE_HTTP_INSPECT" {
			return "maybe"
		}
		return ""
	}); err == nil || !strings.Contains(err.Error(), "DEDUPE_HTTP_INSPECT") {
		t.Errorf("DEDUPE_HTTP_INSPECT=maybe: %v, want an error naming the variable", err)
	}
}
