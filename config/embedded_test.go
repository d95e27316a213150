package config

import (
	"flag"
	"strings"
	"testing"
)

func TestEmbeddedCredentialsAreRedacted(t *testing.T) {
	c := Default()
	c.NATS.Embedded.User, c.NATS.Embedded.Password = "producer", "emb-pw-3Kd9"
	c.NATS.Embedded.SystemAccount, c.NATS.Embedded.SystemPassword = true, "emb-sys-8Lq2"
	out := c.Redactor().String("user producer password emb-pw-3Kd9, system emb-sys-8Lq2")
	for _, s := range []string{"emb-pw-3Kd9", "emb-sys-8Lq2"} {
		if strings.Contains(out, s) {
			t.Errorf("redacted text still shows %q: %s", s, out)
		}
	}
	c = Default()
	c.NATS.Embedded.Token = "emb-tok-5Vx1"
	if out := c.Redactor().String("token emb-tok-5Vx1"); strings.Contains(out, "emb-tok-5Vx1") {
		t.Errorf("redacted text still shows the embedded token: %s", out)
	}
	if s := c.Summary(); strings.Contains(s, "emb-tok-5Vx1") {
		t.Errorf("Summary shows the embedded token:\n%s", s)
	}
}

func TestUsageNeverShowsEmbeddedCredentials(t *testing.T) {
	c := Default()
	env := map[string]string{
		"DEDUPE_EMBEDDED_PASSWORD":        "emb-pw-3Kd9",
		"DEDUPE_EMBEDDED_TOKEN":           "emb-tok-5Vx1",
		"DEDUPE_EMBEDDED_SYSTEM_PASSWORD": "emb-sys-8Lq2",
	}
	if err := c.ApplyEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var out strings.Builder
	fs.SetOutput(&out)
	c.RegisterFlags(fs)
	fs.PrintDefaults()
	if !strings.Contains(out.String(), "-embedded-token") {
		t.Fatalf("usage lacks -embedded-token:\n%s", out.String())
	}
	for _, secret := range env {
		if strings.Contains(out.String(), secret) {
			t.Errorf("usage shows %q:\n%s", secret, out.String())
		}
	}
	// The flags still carry the values from the environment.
	if c.NATS.Embedded.Token != "emb-tok-5Vx1" {
		t.Errorf("token %q after RegisterFlags", c.NATS.Embedded.Token)
	}
}
