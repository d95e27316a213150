package config

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// contextDir writes nats CLI contexts (name to settings) under a temporary
// $XDG_CONFIG_HOME and returns a getenv that points there.
func contextDir(t *testing.T, contexts map[string]map[string]any) func(string) string {
	t.Helper()
	xdg := t.TempDir()
	dir := filepath.Join(xdg, "nats", "context")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, s := range contexts {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return func(k string) string { return map[string]string{"XDG_CONFIG_HOME": xdg, "HOME": "/home/op"}[k] }
}

// layered builds a configuration as the commands do: the YAML file, the
// environment, the flags, then the context.
func layered(t *testing.T, yml string, env map[string]string, args []string, getenv func(string) string) (Config, ContextUse) {
	t.Helper()
	c := mustParse(t, yml)
	if err := c.ApplyEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	use, err := c.ApplyContext(func(k string) string {
		if v, ok := env[k]; ok {
			return v
		}
		return getenv(k)
	})
	if err != nil {
		t.Fatal(err)
	}
	return c, use
}

// TestConnectionPrecedence: flag > environment > file > context, for the
// URL, the context's name itself, and the groups a context fills.
func TestConnectionPrecedence(t *testing.T) {
	getenv := contextDir(t, map[string]map[string]any{
		"prod": {"url": "nats://context:4222", "creds": "~/prod.creds", "ca": "/ctx/ca.pem", "jetstream_domain": "ctxdomain"},
		"dev":  {"url": "nats://dev:4222"},
	})
	tests := []struct {
		name    string
		yml     string
		env     map[string]string
		args    []string
		url     string
		context string
	}{
		{"context only", "nats: {context: prod}", nil, nil, "nats://context:4222", "prod"},
		{"file beats context", "nats: {context: prod, url: 'nats://file:4222'}", nil, nil, "nats://file:4222", "prod"},
		{"env beats file", "nats: {context: prod, url: 'nats://file:4222'}", map[string]string{"NATS_URL": "nats://env:4222"}, nil, "nats://env:4222", "prod"},
		{"DEDUPE_ beats NATS_", "nats: {context: prod}", map[string]string{"NATS_URL": "nats://env:4222", "DEDUPE_NATS_URL": "nats://dedupe:4222"}, nil, "nats://dedupe:4222", "prod"},
		{"flag beats env", "nats: {context: prod, url: 'nats://file:4222'}", map[string]string{"NATS_URL": "nats://env:4222"}, []string{"-s", "nats://flag:4222"}, "nats://flag:4222", "prod"},
		{"--nats-url is -s", "", nil, []string{"--nats-url", "nats://flag:4222"}, "nats://flag:4222", ""},
		{"context named by env", "nats: {context: dev}", map[string]string{"NATS_CONTEXT": "prod"}, nil, "nats://context:4222", "prod"},
		{"context named by flag", "nats: {context: dev}", map[string]string{"NATS_CONTEXT": "dev"}, []string{"--context", "prod"}, "nats://context:4222", "prod"},
		{"no context: embedded", "", nil, nil, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := layered(t, tt.yml, tt.env, tt.args, getenv)
			if c.NATS.URL != tt.url || c.NATS.Context != tt.context {
				t.Errorf("url %q, context %q; want %q, %q", c.NATS.URL, c.NATS.Context, tt.url, tt.context)
			}
			if c.NATS.IsEmbedded() != (tt.url == "") {
				t.Errorf("IsEmbedded %v with url %q", c.NATS.IsEmbedded(), c.NATS.URL)
			}
		})
	}

	t.Run("context fills what nothing set, by group", func(t *testing.T) {
		c, use := layered(t, "nats: {context: prod, url: 'nats://file:4222'}", nil, nil, getenv)
		n := c.NATS
		if n.CredsFile != "/home/op/prod.creds" || n.TLS.CAFile != "/ctx/ca.pem" || n.JetStreamDomain != "ctxdomain" {
			t.Errorf("from the context: creds %q, ca %q, domain %q", n.CredsFile, n.TLS.CAFile, n.JetStreamDomain)
		}
		want := []string{"nats.creds_file", "nats.tls.ca_file", "nats.jetstream_domain"}
		if !reflect.DeepEqual(use.Fields, want) {
			t.Errorf("fields filled %v, want %v", use.Fields, want)
		}
		if err := c.Validate(); err != nil {
			t.Error(err)
		}
	})
	t.Run("authentication set above keeps the context's out", func(t *testing.T) {
		c, _ := layered(t, "nats: {context: prod}", map[string]string{"NATS_USER": "u", "NATS_PASSWORD": "p"}, []string{"--js-api-prefix", "$JS.x.API"}, getenv)
		n := c.NATS
		if n.CredsFile != "" || n.User != "u" || n.JetStreamDomain != "" || n.JetStreamAPIPrefix != "$JS.x.API" {
			t.Errorf("creds %q, user %q, domain %q, prefix %q; want the context's creds and domain left out", n.CredsFile, n.User, n.JetStreamDomain, n.JetStreamAPIPrefix)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("one authentication method, one JetStream prefix, yet: %v", err)
		}
	})
}

func TestContextWithoutURLIsTheDefaultServer(t *testing.T) {
	getenv := contextDir(t, map[string]map[string]any{"local": {"user": "a", "password": "b", "tls_first": true}})
	c := Default()
	c.NATS.Context = "local"
	if _, err := c.ApplyContext(getenv); err != nil {
		t.Fatal(err)
	}
	if c.NATS.URL != nats.DefaultURL || c.NATS.User != "a" || c.NATS.Password != "b" || !c.NATS.TLS.HandshakeFirst {
		t.Errorf("got %+v", c.NATS)
	}
}

func TestContextRefused(t *testing.T) {
	// Every key the nats CLI writes, empty: nothing to refuse.
	full := map[string]any{
		"description": "", "url": "nats://x:4222", "socks_proxy": "", "token": "", "user": "", "password": "",
		"creds": "", "nkey": "", "cert": "", "key": "", "ca": "", "nsc": "", "jetstream_domain": "",
		"jetstream_api_prefix": "", "jetstream_event_prefix": "$JS.EVENT", "inbox_prefix": "", "user_jwt": "",
		"user_seed": "", "color_scheme": "", "tls_first": false, "windows_cert_store": "",
		"windows_cert_match_by": "", "windows_cert_match": "", "windows_ca_certs_match": []string{},
	}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for kk, vv := range full {
			m[kk] = vv
		}
		m[k] = v
		return m
	}
	getenv := contextDir(t, map[string]map[string]any{
		"full":    full,
		"socks":   with("socks_proxy", "socks5://proxy:1080"),
		"nsc":     with("nsc", "nsc://op/acc/user"),
		"inbox":   with("inbox_prefix", "_I.me"),
		"winca":   with("windows_ca_certs_match", []string{"My CA"}),
		"future":  with("select_rtt", true),
		"twoauth": with("token", "tok"),
		"both":    with("jetstream_api_prefix", "$JS.x.API"),
	})
	c := Default()
	c.NATS.Context = "full"
	if _, err := c.ApplyContext(getenv); err != nil {
		t.Fatalf("a context with every key empty: %v", err)
	}
	for name, want := range map[string]string{
		"socks": "socks_proxy", "nsc": "nsc", "inbox": "inbox_prefix", "winca": "windows_ca_certs_match",
		"future": "select_rtt", "missing": "no such file", "../etc": "not a context name",
	} {
		c := Default()
		c.NATS.Context = name
		_, err := c.ApplyContext(getenv)
		if !errors.Is(err, ErrContext) || !strings.Contains(err.Error(), want) {
			t.Errorf("context %s: %v, want ErrContext naming %q", name, err, want)
		}
	}
	// A token besides a user, and a domain besides a prefix, are refused.
	b := map[string]any{"url": "nats://x:4222", "user": "u", "password": "p", "token": "t"}
	d := map[string]any{"url": "nats://x:4222", "jetstream_domain": "d", "jetstream_api_prefix": "p"}
	getenv3 := contextDir(t, map[string]map[string]any{"b": b, "d": d})
	for name, want := range map[string]string{"b": "token", "d": "jetstream_api_prefix"} {
		c := Default()
		c.NATS.Context = name
		if _, err := c.ApplyContext(getenv3); !errors.Is(err, ErrContext) || !strings.Contains(err.Error(), want) {
			t.Errorf("context %s: %v, want ErrContext naming %q", name, err, want)
		}
	}
}

func TestContextByAbsolutePathAndHome(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ctx.json")
	if err := os.WriteFile(path, []byte(`{"url":"nats://abs:4222"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c := Default()
	c.NATS.Context = path
	if use, err := c.ApplyContext(func(string) string { return "" }); err != nil || use.Path != path || c.NATS.URL != "nats://abs:4222" {
		t.Errorf("absolute path: %+v %v, url %q", use, err, c.NATS.URL)
	}

	home := t.TempDir()
	dir := filepath.Join(home, ".config", "nats", "context")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "h.json"), []byte(`{"url":"nats://home:4222"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c = Default()
	c.NATS.Context = "h"
	if _, err := c.ApplyContext(func(k string) string { return map[string]string{"HOME": home}[k] }); err != nil || c.NATS.URL != "nats://home:4222" {
		t.Errorf("under $HOME/.config: %v, url %q", err, c.NATS.URL)
	}
}

func TestJetStreamDomainValidation(t *testing.T) {
	for yml, field := range map[string]string{
		"nats: {url: 'nats://x:4222', jetstream_domain: a, jetstream_api_prefix: '$JS.a.API'}": "nats.jetstream_api_prefix",
		"nats: {url: 'nats://x:4222', jetstream_domain: 'a.b'}":                                "nats.jetstream_domain",
		"nats: {url: 'nats://x:4222', jetstream_api_prefix: '$JS.*.API'}":                      "nats.jetstream_api_prefix",
	} {
		c := mustParse(t, yml)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v, want an error naming %s", yml, err, field)
		}
	}
}

func TestConnectionSecretsRedacted(t *testing.T) {
	getenv := contextDir(t, map[string]map[string]any{"p": {"url": "nats://x:4222", "user": "ctxuser", "password": "ctx-secret-pw"}})
	c, _ := layered(t, "nats: {context: p}", nil, nil, getenv)
	out := c.Redactor().String(c.Summary() + " " + c.NATS.Password)
	if strings.Contains(out, "ctx-secret-pw") {
		t.Errorf("a context's password is printed:\n%s", out)
	}
	c, _ = layered(t, "", map[string]string{"NATS_URL": "nats://x:4222", "NATS_TOKEN": "env-secret-token"}, nil, getenv)
	out = c.Redactor().String(c.Summary() + " " + c.NATS.Token)
	if strings.Contains(out, "env-secret-token") {
		t.Errorf("NATS_TOKEN is printed:\n%s", out)
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var usage strings.Builder
	fs.SetOutput(&usage)
	c.NATS.Password = "flag-secret-pw"
	c.RegisterFlags(fs)
	fs.PrintDefaults()
	if strings.Contains(usage.String(), "flag-secret-pw") || strings.Contains(usage.String(), "env-secret-token") {
		t.Errorf("the usage text shows a credential:\n%s", usage.String())
	}
}
