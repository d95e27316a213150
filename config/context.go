package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/synadia-io/orbit.go/natscontext"
)

// ErrContext wraps every error of ApplyContext: a context that cannot be
// read, or that asks for something the stage cannot do.
var ErrContext = errors.New("config: nats context")

// ContextUse says which nats CLI context ApplyContext read and which fields
// it filled.
type ContextUse struct {
	// Name is nats.context as given: a context name or a file's path.
	Name string
	// Path is the file read.
	Path string
	// Fields are the YAML paths of the fields the context filled, such as
	// "nats.url"; empty when every field was already set.
	Fields []string
}

// contextKeysUsed are the keys of a context file the stage reads.
// Description, name and color_scheme are the CLI's own, and the stage reads
// no advisories, so jetstream_event_prefix changes nothing.
var contextKeysUsed = []string{
	"url", "user", "password", "token", "creds", "nkey", "cert", "key", "ca", "tls_first",
	"jetstream_domain", "jetstream_api_prefix",
	"name", "description", "color_scheme", "jetstream_event_prefix",
}

// ApplyContext fills the connection fields the file, the environment and
// the flags left empty from the nats CLI context named by nats.context, as
// configs/README.md "Connecting as the nats CLI does" describes; getenv
// (normally os.Getenv) locates the context directory. A context asking for
// what the stage cannot do is an error wrapping ErrContext, not ignored.
func (c *Config) ApplyContext(getenv func(string) string) (ContextUse, error) {
	n := &c.NATS
	use := ContextUse{Name: n.Context}
	if n.Context == "" {
		return use, nil
	}
	s, path, err := readContext(n.Context, getenv)
	use.Path = path
	if err != nil {
		return use, err
	}
	fill := func(field string, dst *string, v string) {
		if v != "" {
			*dst = v
			use.Fields = append(use.Fields, field)
		}
	}
	if n.URL == "" {
		u := s.URL
		if u == "" {
			u = nats.DefaultURL
		}
		fill("nats.url", &n.URL, u)
	}
	if n.User == "" && n.Password == "" && n.Token == "" && n.CredsFile == "" && n.NKeySeedFile == "" {
		switch {
		case s.User != "":
			fill("nats.user", &n.User, s.User)
			fill("nats.password", &n.Password, s.Password)
		case s.Creds != "":
			fill("nats.creds_file", &n.CredsFile, expandHome(os.ExpandEnv(s.Creds), getenv))
		case s.NKey != "":
			fill("nats.nkey_seed_file", &n.NKeySeedFile, expandHome(s.NKey, getenv))
		case s.Token != "":
			fill("nats.token", &n.Token, s.Token)
		}
	}
	if n.TLS.CertFile == "" && n.TLS.KeyFile == "" {
		fill("nats.tls.cert_file", &n.TLS.CertFile, expandHome(s.Cert, getenv))
		fill("nats.tls.key_file", &n.TLS.KeyFile, expandHome(s.Key, getenv))
	}
	if n.TLS.CAFile == "" {
		fill("nats.tls.ca_file", &n.TLS.CAFile, expandHome(s.CA, getenv))
	}
	if !n.TLS.HandshakeFirst && s.TLSFirst {
		n.TLS.HandshakeFirst = true
		use.Fields = append(use.Fields, "nats.tls.handshake_first")
	}
	if n.JetStreamDomain == "" && n.JetStreamAPIPrefix == "" {
		fill("nats.jetstream_domain", &n.JetStreamDomain, s.JSDomain)
		fill("nats.jetstream_api_prefix", &n.JetStreamAPIPrefix, s.JSAPIPrefix)
	}
	return use, nil
}

// readContext reads the context named name, refusing one with settings the
// stage cannot honour. It returns the file's path with any error.
func readContext(name string, getenv func(string) string) (natscontext.Settings, string, error) {
	var s natscontext.Settings
	path := name
	if !filepath.IsAbs(name) {
		if strings.Contains(name, "..") || strings.ContainsRune(name, os.PathSeparator) {
			return s, "", fmt.Errorf("%w %q: not a context name (nor an absolute path to a context file)", ErrContext, name)
		}
		parent := getenv("XDG_CONFIG_HOME")
		if parent == "" {
			home := getenv("HOME")
			if home == "" {
				return s, "", fmt.Errorf("%w %q: neither $XDG_CONFIG_HOME nor $HOME is set, so the context directory is unknown", ErrContext, name)
			}
			parent = filepath.Join(home, ".config")
		}
		path = filepath.Join(parent, "nats", "context", name+".json")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return s, path, fmt.Errorf("%w %q: %w (`nats context ls` lists the contexts)", ErrContext, name, err)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		return s, path, fmt.Errorf("%w %q: %s: %w", ErrContext, name, path, err)
	}
	var unusable []string
	for k, v := range keys {
		if !slices.Contains(contextKeysUsed, k) && !zeroJSON(v) {
			unusable = append(unusable, k)
		}
	}
	if len(unusable) > 0 {
		slices.Sort(unusable)
		return s, path, fmt.Errorf("%w %q (%s) sets %s, which the stage cannot use; remove them or use a context without them",
			ErrContext, name, path, strings.Join(unusable, ", "))
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, path, fmt.Errorf("%w %q: %s: %w", ErrContext, name, path, err)
	}
	if s.Token != "" && (s.User != "" || s.Creds != "" || s.NKey != "") {
		return s, path, fmt.Errorf("%w %q (%s) sets a token besides a user, creds or nkey; keep one authentication method", ErrContext, name, path)
	}
	if s.JSDomain != "" && s.JSAPIPrefix != "" {
		return s, path, fmt.Errorf("%w %q (%s) sets both jetstream_domain and jetstream_api_prefix; keep one", ErrContext, name, path)
	}
	return s, path, nil
}

// zeroJSON reports whether v is an empty value: "", false, 0, null, [] or {}.
func zeroJSON(v json.RawMessage) bool {
	switch strings.TrimSpace(string(v)) {
	case `""`, "false", "0", "null", "[]", "{}":
		return true
	}
	return false
}

// expandHome replaces a leading ~ of path by $HOME, as the nats CLI does.
func expandHome(path string, getenv func(string) string) string {
	if !strings.HasPrefix(path, "~") {
		return path
	}
	if home := getenv("HOME"); home != "" {
		return home + path[1:]
	}
	return path
}
