package config

import (
	"reflect"
	"testing"

	"go.yaml.in/yaml/v3"
)

// FuzzLoad parses arbitrary YAML: Parse must not panic; whatever it accepts
// must validate and summarise without panicking; and an accepted, valid
// configuration must survive a marshal and re-parse unchanged.
func FuzzLoad(f *testing.F) {
	f.Add([]byte("nats:\n  url: nats://127.0.0.1:4222\nwindow:\n  paths:\n    - {name: webhook-retry, max: 3d}\n"))
	f.Add([]byte("key: {source: json, json_path: id, scope: {source: header, header: Webhook-Source}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 8<<10 {
			return
		}
		c, err := Parse(data)
		if err != nil {
			return
		}
		verr := c.Validate()
		_ = c.Summary()
		if verr != nil {
			return
		}
		if _, err := c.Window.Derive(); err != nil {
			t.Fatalf("valid config, but Window.Derive: %v", err)
		}
		b, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("marshal a valid config: %v", err)
		}
		back, err := Parse(b)
		if err != nil {
			t.Fatalf("re-parse a marshalled valid config: %v\n%s", err, b)
		}
		if !reflect.DeepEqual(back, c) {
			t.Fatalf("round trip differs:\n got %+v\nwant %+v\n%s", back, c, b)
		}
	})
}
