package config

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// TestEverySecretFieldIsRedacted sets every string field of Config whose
// YAML name says it holds a credential (password, token, secret, dsn, url)
// to a distinct secret and checks that Secrets covers it: the Redactor masks
// it, and check-config's summary and validation errors never show it. A new
// credential field fails here until Secrets lists it.
func TestEverySecretFieldIsRedacted(t *testing.T) {
	c := Default()
	secrets := map[string]string{} // YAML path -> secret
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		ty := v.Type()
		for i := range ty.NumField() {
			f := ty.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" || !f.IsExported() {
				continue
			}
			p := strings.TrimPrefix(path+"."+name, ".")
			fv := v.Field(i)
			switch fv.Kind() {
			case reflect.Struct:
				walk(fv, p)
			case reflect.String:
				secret := fmt.Sprintf("s3cret-%d-value", len(secrets))
				switch {
				case name == "url":
					fv.SetString("nats://app:" + secret + "@127.0.0.1:4222")
				case name == "dsn":
					fv.SetString("host=127.0.0.1 user=app password='" + secret + "' dbname=ads")
				case strings.Contains(name, "password") || strings.Contains(name, "token") || strings.Contains(name, "secret"):
					fv.SetString(secret)
				default:
					continue
				}
				secrets[p] = secret
			}
		}
	}
	walk(reflect.ValueOf(&c).Elem(), "")
	if len(secrets) < 4 {
		t.Fatalf("found only %v: the walk is broken", secrets)
	}
	c.NATS.User = "app"
	red := c.Redactor()
	out := c.Summary()
	if err := c.Validate(); err != nil {
		out += err.Error()
	}
	for path, secret := range secrets {
		if got := red.String("x " + secret + " x"); strings.Contains(got, secret) {
			t.Errorf("%s: Config.Secrets does not cover it (add it in config/redact.go)", path)
		}
		if strings.Contains(out, secret) {
			t.Errorf("%s: check-config's output shows it", path)
		}
	}
	t.Logf("credential fields: %v", secrets)
}
