package config

import (
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/dedupe-stage/dedupe-stage/internal/redact"
)

// Secrets returns every credential the configuration holds, for
// redact.New: the user information of nats.url, nats.password, nats.token, an
// NKey seed written where nats.nkey_seed_file's path belongs, the embedded
// server's password, token and system password, and the PostgreSQL sink's
// DSN (the whole string, replaced by its display form, and its password).
// Each is taken wherever it came from: the file, a variable (NATS_PASSWORD
// as DEDUPE_NATS_PASSWORD), a flag or a nats CLI context, so call it after
// ApplyContext.
func (c Config) Secrets() redact.Secrets {
	n := c.NATS
	var out redact.Secrets
	out = append(out, redact.NATSURLSecrets(n.URL)...)
	out = append(out, redact.Plain(n.Password, n.Token)...)
	out = append(out, redact.Plain(n.Embedded.Password, n.Embedded.Token, n.Embedded.SystemPassword)...)
	out = append(out, redact.NKeySeed(n.NKeySeedFile)...)
	out = append(out, redact.DSNSecrets(c.Totals.Sinks.Postgres.DSN)...)
	return out
}

// Redactor returns a Redactor for c's secrets. Everything the stage prints
// that may come from the configuration (log lines, errors, check-config's
// summary) passes through it.
func (c Config) Redactor() *redact.Redactor { return redact.New(c.Secrets()) }

// secretKeys are the YAML keys whose values are credentials or carry them.
var secretKeys = map[string]bool{"url": true, "password": true, "token": true, "dsn": true, "nkey_seed_file": true, "system_password": true}

// yamlSecrets returns the credentials a YAML document that did not decode
// into a Config may hold, wherever they were written: the value of every key
// named like a credential field, and every scalar that reads as a URL or a
// connection string with credentials. A document that does not parse as YAML
// at all gives nothing (yaml.v3's syntax errors quote no values).
func yamlSecrets(data []byte) redact.Secrets {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil {
		return nil
	}
	var out redact.Secrets
	var walk func(n *yaml.Node, key string)
	walk = func(n *yaml.Node, key string) {
		switch n.Kind {
		case yaml.ScalarNode:
			v := n.Value
			if secretKeys[key] {
				out = append(out, redact.Plain(v)...)
			}
			if strings.Contains(v, "://") || strings.Contains(v, "@") {
				out = append(out, redact.NATSURLSecrets(v)...)
			}
			if strings.Contains(strings.ToLower(v), "password") || strings.HasPrefix(v, "postgres") {
				out = append(out, redact.DSNSecrets(v)...)
			}
			out = append(out, redact.NKeySeed(v)...)
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				walk(n.Content[i+1], n.Content[i].Value)
			}
		default:
			for _, c := range n.Content {
				walk(c, key)
			}
		}
	}
	walk(&doc, "")
	return out
}
