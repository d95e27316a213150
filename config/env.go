package config

import (
	"errors"
	"flag"
	"fmt"
	"strconv"

	"github.com/dedupe-stage/dedupe-stage/internal/redact"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// envVar is one environment variable ApplyEnv reads.
type envVar struct {
	name  string
	field string // YAML path it overrides
	set   func(c *Config, v string) error
}

func setString(p func(c *Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *p(c) = v; return nil }
}

func setInt(p func(c *Config) *int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%q, want an integer", v)
		}
		*p(c) = n
		return nil
	}
}

func setBool(p func(c *Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%q, want true or false", v)
		}
		*p(c) = b
		return nil
	}
}

// setOptBool sets an optional bool (nil: automatic) from true or false.
func setOptBool(p func(c *Config) **bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%q, want true or false", v)
		}
		*p(c) = &b
		return nil
	}
}

// setDuration sets a Duration from a Go duration or the file's units ("5s").
func setDuration(p func(c *Config) *Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := ParseDuration(v)
		if err != nil {
			return fmt.Errorf("%q, want a duration such as 5s", v)
		}
		*p(c) = d
		return nil
	}
}

// keyHeader is the key spec "the header named name".
func keyHeader(name string) keys.FieldSpec {
	return keys.FieldSpec{Source: keys.SourceHeader, Header: name}
}

// Setters of the connection fields, each read from the nats CLI's variable
// and from the stage's own.
var (
	setURL       = setString(func(c *Config) *string { return &c.NATS.URL })
	setContext   = setString(func(c *Config) *string { return &c.NATS.Context })
	setUser      = setString(func(c *Config) *string { return &c.NATS.User })
	setPassword  = setString(func(c *Config) *string { return &c.NATS.Password })
	setToken     = setString(func(c *Config) *string { return &c.NATS.Token })
	setCreds     = setString(func(c *Config) *string { return &c.NATS.CredsFile })
	setNKey      = setString(func(c *Config) *string { return &c.NATS.NKeySeedFile })
	setCert      = setString(func(c *Config) *string { return &c.NATS.TLS.CertFile })
	setKey       = setString(func(c *Config) *string { return &c.NATS.TLS.KeyFile })
	setCA        = setString(func(c *Config) *string { return &c.NATS.TLS.CAFile })
	setTimeout   = setDuration(func(c *Config) *Duration { return &c.NATS.ConnectTimeout })
	setTLSFirst  = setBool(func(c *Config) *bool { return &c.NATS.TLS.HandshakeFirst })
	setJSDomain  = setString(func(c *Config) *string { return &c.NATS.JetStreamDomain })
	setAPIPrefix = setString(func(c *Config) *string { return &c.NATS.JetStreamAPIPrefix })
)

// envVars lists every variable ApplyEnv reads, in the order applied: the
// nats CLI's NATS_* first, so that the stage's own DEDUPE_* win when both
// are set.
var envVars = []envVar{
	{"NATS_URL", "nats.url", setURL},
	{"NATS_CONTEXT", "nats.context", setContext},
	{"NATS_USER", "nats.user", setUser},
	{"NATS_PASSWORD", "nats.password", setPassword},
	{"NATS_TOKEN", "nats.token", setToken},
	{"NATS_CREDS", "nats.creds_file", setCreds},
	{"NATS_NKEY", "nats.nkey_seed_file", setNKey},
	{"NATS_CERT", "nats.tls.cert_file", setCert},
	{"NATS_KEY", "nats.tls.key_file", setKey},
	{"NATS_CA", "nats.tls.ca_file", setCA},
	{"NATS_TIMEOUT", "nats.connect_timeout", setTimeout},
	{"DEDUPE_NATS_URL", "nats.url", setURL},
	{"DEDUPE_NATS_CONTEXT", "nats.context", setContext},
	{"DEDUPE_NATS_USER", "nats.user", setUser},
	{"DEDUPE_NATS_PASSWORD", "nats.password", setPassword},
	{"DEDUPE_NATS_TOKEN", "nats.token", setToken},
	{"DEDUPE_NATS_CREDS", "nats.creds_file", setCreds},
	{"DEDUPE_NATS_NKEY", "nats.nkey_seed_file", setNKey},
	{"DEDUPE_NATS_CERT", "nats.tls.cert_file", setCert},
	{"DEDUPE_NATS_KEY", "nats.tls.key_file", setKey},
	{"DEDUPE_NATS_CA", "nats.tls.ca_file", setCA},
	{"DEDUPE_NATS_TLS_FIRST", "nats.tls.handshake_first", setTLSFirst},
	{"DEDUPE_NATS_JS_DOMAIN", "nats.jetstream_domain", setJSDomain},
	{"DEDUPE_NATS_JS_API_PREFIX", "nats.jetstream_api_prefix", setAPIPrefix},
	{"DEDUPE_CREATE_STREAMS", "nats.create_streams", setOptBool(func(c *Config) **bool { return &c.NATS.CreateStreams })},
	{"DEDUPE_EMBEDDED_HOST", "nats.embedded.host", setString(func(c *Config) *string { return &c.NATS.Embedded.Host })},
	{"DEDUPE_EMBEDDED_PORT", "nats.embedded.port", setInt(func(c *Config) *int { return &c.NATS.Embedded.Port })},
	{"DEDUPE_EMBEDDED_MONITOR_PORT", "nats.embedded.monitor_port", setInt(func(c *Config) *int { return &c.NATS.Embedded.MonitorPort })},
	{"DEDUPE_EMBEDDED_USER", "nats.embedded.user", setString(func(c *Config) *string { return &c.NATS.Embedded.User })},
	{"DEDUPE_EMBEDDED_PASSWORD", "nats.embedded.password", setString(func(c *Config) *string { return &c.NATS.Embedded.Password })},
	{"DEDUPE_EMBEDDED_TOKEN", "nats.embedded.token", setString(func(c *Config) *string { return &c.NATS.Embedded.Token })},
	{"DEDUPE_EMBEDDED_SYSTEM_ACCOUNT", "nats.embedded.system_account", setBool(func(c *Config) *bool { return &c.NATS.Embedded.SystemAccount })},
	{"DEDUPE_EMBEDDED_SYSTEM_PASSWORD", "nats.embedded.system_password", setString(func(c *Config) *string { return &c.NATS.Embedded.SystemPassword })},
	{"DEDUPE_KEY_HEADER", "key.header", func(c *Config, v string) error { c.Key.Field = keyHeader(v); return nil }},
	{"DEDUPE_KEY_VERSION_HEADER", "key.version.header", func(c *Config, v string) error { c.Key.Version = keyHeader(v); return nil }},
	{"DEDUPE_WINDOW_REFRESH_ON_REPEAT", "window.refresh_on_repeat", setBool(func(c *Config) *bool { return &c.Window.RefreshOnRepeat })},
	{"DEDUPE_INPUT_STREAM", "input.stream", setString(func(c *Config) *string { return &c.Input.Stream })},
	{"DEDUPE_OUTPUT_STREAM", "output.stream", setString(func(c *Config) *string { return &c.Output.Stream })},
	{"DEDUPE_DATA_DIR", "state.data_dir", setString(func(c *Config) *string { return &c.State.DataDir })},
	{"DEDUPE_PARTITIONS", "state.partitions", setInt(func(c *Config) *int { return &c.State.Partitions })},
	{"DEDUPE_SYNC_WRITES", "state.sync_writes", setOptBool(func(c *Config) **bool { return &c.State.SyncWrites })},
	{"DEDUPE_HTTP_ADDR", "http.addr", setString(func(c *Config) *string { return &c.HTTP.Addr })},
	{"DEDUPE_HTTP_INSPECT", "http.inspect", setBool(func(c *Config) *bool { return &c.HTTP.Inspect })},
	{"DEDUPE_HTTP_INSPECT_ADDR", "http.inspect_addr", setString(func(c *Config) *string { return &c.HTTP.InspectAddr })},
	{"DEDUPE_LOG_LEVEL", "log.level", setString(func(c *Config) *string { return &c.Log.Level })},
	{"DEDUPE_LOG_FORMAT", "log.format", setString(func(c *Config) *string { return &c.Log.Format })},
	{"DEDUPE_SCALE_OUT", "scale_out.enabled", setBool(func(c *Config) *bool { return &c.ScaleOut.Enabled })},
	{"DEDUPE_SCALE_OUT_GROUP", "scale_out.group", setString(func(c *Config) *string { return &c.ScaleOut.Group })},
	{"DEDUPE_INSTANCE", "scale_out.instance", setString(func(c *Config) *string { return &c.ScaleOut.Instance })},
	{"DEDUPE_TOTALS_POSTGRES_DSN", "totals.sinks.postgres.dsn", setString(func(c *Config) *string { return &c.Totals.Sinks.Postgres.DSN })},
}

// EnvVars returns the names of the environment variables ApplyEnv reads,
// each with the YAML field it overrides.
func EnvVars() map[string]string {
	m := make(map[string]string, len(envVars))
	for _, e := range envVars {
		m[e.name] = e.field
	}
	return m
}

// ApplyEnv overrides fields from environment variables read with getenv
// (normally os.Getenv); see EnvVars for the list. A variable that is unset
// or empty changes nothing, so an environment variable cannot clear a field
// (a flag can). Unparsable values are errors naming the variable, all
// reported, wrapping ErrEnv; the other variables are still applied.
func (c *Config) ApplyEnv(getenv func(string) string) error {
	var errs []error
	for _, e := range envVars {
		v := getenv(e.name)
		if v == "" {
			continue
		}
		if err := e.set(c, v); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %w", ErrEnv, e.name, err))
		}
	}
	return errors.Join(errs...)
}

// RegisterFlags defines on fs the flags that write straight into c (the
// list is in configs/README.md, "Flags"), with c's current values as their
// defaults: call it after Load and ApplyEnv, then fs.Parse, so that flags
// win. c must stay alive and uncopied until fs.Parse returns.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.registerConnFlags(fs)
	fs.StringVar(&c.State.DataDir, "data-dir", c.State.DataDir, "data directory for state and the embedded server (state.data_dir, $DEDUPE_DATA_DIR)")
	fs.StringVar(&c.HTTP.Addr, "http-addr", c.HTTP.Addr, "listen address for /metrics, /healthz, /readyz, /inspect; empty disables (http.addr, $DEDUPE_HTTP_ADDR)")
	fs.IntVar(&c.State.Partitions, "partitions", c.State.Partitions, "number of state partitions, 1..1024 (state.partitions, $DEDUPE_PARTITIONS)")
	fs.StringVar(&c.Log.Level, "log-level", c.Log.Level, "debug, info, warn or error (log.level, $DEDUPE_LOG_LEVEL)")
	fs.StringVar(&c.Log.Format, "log-format", c.Log.Format, "text or json (log.format, $DEDUPE_LOG_FORMAT)")
	fs.StringVar(&c.Input.Stream, "input-stream", c.Input.Stream, "input stream name (input.stream, $DEDUPE_INPUT_STREAM)")
	fs.StringVar(&c.Output.Stream, "output-stream", c.Output.Stream, "output stream name (output.stream, $DEDUPE_OUTPUT_STREAM)")
	fs.Var(&optBool{p: &c.NATS.CreateStreams}, "create-streams", "create missing streams and the consumer; default: true when embedded, false with a URL (nats.create_streams, $DEDUPE_CREATE_STREAMS)")
	fs.Var(&optBool{p: &c.State.SyncWrites}, "sync-writes", "fsync every state commit before acknowledging; default: as the embedded server syncs (nats.embedded.sync_always), true with a URL (state.sync_writes, $DEDUPE_SYNC_WRITES)")
	fs.Var(&keyHeaderFlag{c: c}, "key-header", "take the key from this header (key.source header, key.header, $DEDUPE_KEY_HEADER)")
	fs.BoolVar(&c.ScaleOut.Enabled, "scale-out", c.ScaleOut.Enabled, "run as one of N instances sharing the input over a JetStream cluster (scale_out.enabled, $DEDUPE_SCALE_OUT)")
	fs.StringVar(&c.ScaleOut.Group, "scale-out-group", c.ScaleOut.Group, "static consumer group of the instances (scale_out.group, $DEDUPE_SCALE_OUT_GROUP)")
	fs.StringVar(&c.ScaleOut.Instance, "instance", c.ScaleOut.Instance, "this instance's name; default the host name (scale_out.instance, $DEDUPE_INSTANCE)")
	e := &c.NATS.Embedded
	fs.StringVar(&e.Host, "embedded-host", e.Host, "embedded server's listen address; 0.0.0.0 lets other machines connect (nats.embedded.host, $DEDUPE_EMBEDDED_HOST)")
	fs.IntVar(&e.Port, "embedded-port", e.Port, "embedded server's client port (nats.embedded.port, $DEDUPE_EMBEDDED_PORT)")
	fs.IntVar(&e.MonitorPort, "embedded-monitor-port", e.MonitorPort, "embedded server's HTTP monitoring port (/varz, /jsz); 0 is off (nats.embedded.monitor_port, $DEDUPE_EMBEDDED_MONITOR_PORT)")
	fs.StringVar(&e.User, "embedded-user", e.User, "user every client of the embedded server must log in as (nats.embedded.user, $DEDUPE_EMBEDDED_USER)")
	fs.StringVar(&e.Password, "embedded-password", e.Password, "that user's password; prefer $DEDUPE_EMBEDDED_PASSWORD, flags show in ps (nats.embedded.password)")
	fs.StringVar(&e.Token, "embedded-token", e.Token, "token every client of the embedded server must present; prefer $DEDUPE_EMBEDDED_TOKEN (nats.embedded.token)")
	fs.BoolVar(&e.SystemAccount, "embedded-system-account", e.SystemAccount, "add the system account, for nats server ping (nats.embedded.system_account, $DEDUPE_EMBEDDED_SYSTEM_ACCOUNT)")
	fs.StringVar(&e.SystemPassword, "embedded-system-password", e.SystemPassword, "password of the system account's user; prefer $DEDUPE_EMBEDDED_SYSTEM_PASSWORD (nats.embedded.system_password)")
	for _, name := range []string{"embedded-password", "embedded-token", "embedded-system-password"} {
		fs.Lookup(name).DefValue = "" // the usage text never shows a credential
	}
}

// registerConnFlags defines the flags that say how to connect to NATS,
// named as the nats CLI names them: --server (-s, --nats-url), --context,
// --user, --password, --token, --creds, --nkey, --tlscert, --tlskey,
// --tlsca, --tlsfirst (--tls-first), --js-domain, --js-api-prefix.
func (c *Config) registerConnFlags(fs *flag.FlagSet) {
	n := &c.NATS
	const urlUsage = "NATS server URLs, comma-separated; empty runs an embedded server unless --context is given (nats.url, $NATS_URL, $DEDUPE_NATS_URL)"
	fs.StringVar(&n.URL, "server", n.URL, urlUsage)
	fs.StringVar(&n.URL, "s", n.URL, "the same as --server")
	fs.StringVar(&n.URL, "nats-url", n.URL, "the same as --server")
	fs.StringVar(&n.Context, "context", n.Context, "nats CLI context whose settings fill what nothing else sets (nats.context, $NATS_CONTEXT)")
	fs.StringVar(&n.User, "user", n.User, "user name (nats.user, $NATS_USER)")
	fs.StringVar(&n.Password, "password", n.Password, "password; prefer $NATS_PASSWORD, flags show in ps (nats.password)")
	fs.StringVar(&n.Token, "token", n.Token, "token; prefer $NATS_TOKEN, flags show in ps (nats.token)")
	fs.StringVar(&n.CredsFile, "creds", n.CredsFile, "user credentials file (nats.creds_file, $NATS_CREDS)")
	fs.StringVar(&n.NKeySeedFile, "nkey", n.NKeySeedFile, "file holding a user NKey seed (nats.nkey_seed_file, $NATS_NKEY)")
	fs.StringVar(&n.TLS.CertFile, "tlscert", n.TLS.CertFile, "TLS client certificate (nats.tls.cert_file, $NATS_CERT)")
	fs.StringVar(&n.TLS.KeyFile, "tlskey", n.TLS.KeyFile, "TLS client key (nats.tls.key_file, $NATS_KEY)")
	fs.StringVar(&n.TLS.CAFile, "tlsca", n.TLS.CAFile, "CAs that verify the server (nats.tls.ca_file, $NATS_CA)")
	fs.BoolVar(&n.TLS.HandshakeFirst, "tlsfirst", n.TLS.HandshakeFirst, "TLS handshake before the server's greeting (nats.tls.handshake_first, $DEDUPE_NATS_TLS_FIRST)")
	fs.BoolVar(&n.TLS.HandshakeFirst, "tls-first", n.TLS.HandshakeFirst, "the same as --tlsfirst")
	fs.StringVar(&n.JetStreamDomain, "js-domain", n.JetStreamDomain, "JetStream domain (nats.jetstream_domain, $DEDUPE_NATS_JS_DOMAIN)")
	fs.StringVar(&n.JetStreamAPIPrefix, "js-api-prefix", n.JetStreamAPIPrefix, "JetStream API subject prefix (nats.jetstream_api_prefix, $DEDUPE_NATS_JS_API_PREFIX)")
	// The usage text shows defaults: never a credential.
	for _, name := range []string{"server", "s", "nats-url"} {
		fs.Lookup(name).DefValue = redact.NATSURL(n.URL)
	}
	for _, name := range []string{"password", "token"} {
		fs.Lookup(name).DefValue = ""
	}
}

// keyHeaderFlag sets the key to a header: --key-header NAME.
type keyHeaderFlag struct{ c *Config }

func (f *keyHeaderFlag) String() string {
	if f == nil || f.c == nil || f.c.Key.Field.Source != keys.SourceHeader {
		return ""
	}
	return f.c.Key.Field.Header
}

func (f *keyHeaderFlag) Set(s string) error {
	if s == "" {
		return errors.New("empty header name")
	}
	f.c.Key.Field = keyHeader(s)
	return nil
}

// optBool is a boolean flag writing a *bool, which stays nil ("auto") until
// the flag is given.
type optBool struct{ p **bool }

func (o *optBool) String() string {
	if o == nil || o.p == nil || *o.p == nil {
		return "auto"
	}
	return strconv.FormatBool(**o.p)
}

func (o *optBool) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*o.p = &b
	return nil
}

func (o *optBool) IsBoolFlag() bool { return true }
