// Package config holds the configuration of the dedupe-stage service: where
// it reads and writes (NATS, streams), how it recognises a repeat (key,
// window), how it remembers (state, filter) and how it runs (pipeline, HTTP,
// logs).
//
// A configuration is built in layers, later layers winning, except the
// nats CLI context, which only fills the connection fields the others left
// empty (flag > environment > file > context):
//
//	cfg, err := config.Load(path)        // Default(), then the YAML file
//	err = cfg.ApplyEnv(os.Getenv)        // NATS_* and DEDUPE_* environment variables
//	fs := flag.NewFlagSet("dedupe-stage", flag.ExitOnError)
//	cfg.RegisterFlags(fs)                // flags write straight into cfg
//	err = fs.Parse(os.Args[1:])
//	_, err = cfg.ApplyContext(os.Getenv) // a nats CLI context fills what none set
//	err = cfg.Validate()                 // every problem, each naming its field
//	fmt.Println(cfg.Summary())           // what `check-config` prints
//
// The YAML file is strict: an unknown field is an error naming it. A null
// or empty value (`url:` with nothing after it) keeps the default, except
// for lists, which it empties. configs/README.md documents every field.
//
// config loads and validates; the subsystems name and build what they
// hold. Scale-out's names and the input's partitioning transform are
// internal/scaleout/layout's (ScaleOutPartitioning hands it the values),
// and the stage fills scaleout.Options from a Config.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/boot"
	"github.com/dedupe-stage/dedupe-stage/internal/redact"
	"github.com/dedupe-stage/dedupe-stage/internal/streams"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
	"go.yaml.in/yaml/v3"
)

// Errors returned by this package.
var (
	// ErrInvalid wraps every error of Validate (each a *FieldError).
	ErrInvalid = errors.New("config: invalid")
	// ErrParse wraps every error of Parse and Load about the YAML text.
	ErrParse = errors.New("config: cannot parse")
	// ErrEnv wraps every error of ApplyEnv.
	ErrEnv = errors.New("config: bad environment variable")
)

// Values of Pipeline.OnFingerprintMismatch.
const (
	// FingerprintDeadLetter dead-letters a copy whose payload fingerprint
	// differs from the first copy's (reason "fingerprint_mismatch").
	FingerprintDeadLetter = "dead-letter"
	// FingerprintRepeat treats such a copy as an ordinary repeat (acked and
	// counted, not forwarded).
	FingerprintRepeat = "repeat"
)

// Config is the whole service configuration. Default returns a valid one.
type Config struct {
	NATS       NATS           `yaml:"nats"`
	Input      Input          `yaml:"input"`
	Output     Output         `yaml:"output"`
	DeadLetter DeadLetter     `yaml:"dead_letter"`
	Key        keys.KeyConfig `yaml:"key"`
	Window     Window         `yaml:"window"`
	State      State          `yaml:"state"`
	Filter     Filter         `yaml:"filter"`
	Pipeline   Pipeline       `yaml:"pipeline"`
	HTTP       HTTP           `yaml:"http"`
	Log        Log            `yaml:"log"`
	Totals     Totals         `yaml:"totals"`
	ScaleOut   ScaleOut       `yaml:"scale_out"`
	Admin      Admin          `yaml:"admin"`
}

// NATS says which NATS server to use and how to authenticate.
type NATS struct {
	// URL of an existing server (or a comma-separated list of URLs of one
	// cluster). Empty (default) runs an embedded nats-server in the process,
	// unless Context names a context.
	URL string `yaml:"url"`
	// CreateStreams: create the input, output and dead-letter streams and
	// the consumer when missing. Unset (null, the default) means true with
	// the embedded server and false with URL; see ShouldCreateStreams.
	CreateStreams *bool `yaml:"create_streams"`
	// Context names a context of the nats CLI (a file under
	// ~/.config/nats/context, or an absolute path to one) whose settings
	// fill the connection fields nothing else set; see Config.ApplyContext.
	// Default "": none (the CLI's selected context is not used).
	Context string `yaml:"context"`
	// User and Password authenticate with a user name and password.
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	// Token authenticates with a token.
	Token string `yaml:"token"`
	// NKeySeedFile is a file holding an NKey seed to authenticate with.
	NKeySeedFile string `yaml:"nkey_seed_file"`
	// CredsFile is a .creds file (user JWT and NKey seed).
	CredsFile string `yaml:"creds_file"`
	// TLS configures TLS to the server.
	TLS TLS `yaml:"tls"`
	// JetStreamDomain is the JetStream domain to use (a leaf node's, for
	// one). Default "": the server's own. At most one of it and
	// JetStreamAPIPrefix.
	JetStreamDomain string `yaml:"jetstream_domain"`
	// JetStreamAPIPrefix is the subject prefix of the JetStream API, for an
	// account that imports it under another prefix. Default "": $JS.API.
	JetStreamAPIPrefix string `yaml:"jetstream_api_prefix"`
	// ConnectTimeout bounds each connection attempt. Default 5s.
	ConnectTimeout Duration `yaml:"connect_timeout"`
	// PingInterval is how often the stage pings the server it is connected
	// to. Default 5s. With MaxPingsOut it bounds how long a link that stops
	// answering without a reset (a network partition, a half-open TCP
	// connection) goes unnoticed: see StaleAfter.
	PingInterval Duration `yaml:"ping_interval"`
	// MaxPingsOut is how many pings may go unanswered before the stage
	// drops the connection and reconnects. Default 2.
	MaxPingsOut int `yaml:"max_pings_out"`
	// Embedded configures the embedded server (used when URL is empty).
	Embedded Embedded `yaml:"embedded"`
}

// Defaults of NATS.PingInterval and NATS.MaxPingsOut: a link that stops
// answering is noticed within 15s (NATS.StaleAfter), where nats.go's own
// defaults (2m, 2) took up to 6 minutes.
const (
	DefaultPingInterval = 5 * time.Second
	DefaultMaxPingsOut  = 2
)

// StaleAfter is the longest a connection that stopped answering without a
// reset goes unnoticed: the client pings every PingInterval and drops the
// connection when a ping finds MaxPingsOut still unanswered, so
// PingInterval x (MaxPingsOut + 1). It also bounds every write to the
// server (a write blocked that long is on a dead link) and how long a stop
// waits for a batch in flight on such a link (docs/failures.md, "A link
// that stops answering").
func (n NATS) StaleAfter() time.Duration {
	return n.PingInterval.D() * time.Duration(n.MaxPingsOut+1)
}

// TLS configures TLS from the client to the NATS server. All empty
// (default) means plain connections unless the URL says tls://.
type TLS struct {
	// CAFile is a PEM bundle of CAs that verify the server.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the client certificate and its key, for
	// mutual TLS; set both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// HandshakeFirst performs the TLS handshake before the server's first
	// message, for servers that require it (handshake_first in their tls
	// block). Default false.
	HandshakeFirst bool `yaml:"handshake_first"`
}

// Embedded configures the nats-server run inside the process when NATS.URL
// is empty.
type Embedded struct {
	// Host to listen on. Default "127.0.0.1" (not reachable from other
	// machines).
	Host string `yaml:"host"`
	// Port to listen on. Default 4222; -1 picks a free port (tests).
	Port int `yaml:"port"`
	// StoreDir is JetStream's storage directory. Default "" means
	// <state.data_dir>/nats.
	StoreDir string `yaml:"store_dir"`
	// SyncAlways: fsync every JetStream write before acknowledging it.
	// Default true. False uses JetStream's default of flushing every two
	// minutes, which is faster but can lose acknowledged messages (input,
	// output and dead letters) on a power failure or kernel crash.
	SyncAlways bool `yaml:"sync_always"`
	// MonitorPort serves nats-server's HTTP monitoring (/varz, /jsz,
	// /healthz, for prometheus-nats-exporter) on Host. Default 0: off; -1
	// picks a free port.
	MonitorPort int `yaml:"monitor_port"`
	// User and Password, when set, are required of every client (producers,
	// consumers and the stage itself). Default empty: no authentication,
	// which is only safe on a loopback Host.
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	// Token, when set, is required of every client instead of a user and
	// password. Default empty.
	Token string `yaml:"token"`
	// SystemAccount adds nats-server's system account ($SYS) with one user,
	// SystemUser/SystemPassword, so that `nats server ping` and the other
	// server-wide requests work. Default false.
	SystemAccount bool `yaml:"system_account"`
	// SystemUser is the system account's user. Default "sys".
	SystemUser string `yaml:"system_user"`
	// SystemPassword is the system account user's password; required when
	// SystemAccount is true.
	SystemPassword string `yaml:"system_password"`
}

// HasAuth reports whether clients of the embedded server must
// authenticate (a user and password, or a token; boot.Embedded.HasAuth).
func (e Embedded) HasAuth() bool { return e.server("").HasAuth() }

// server is what boot.StartEmbedded runs, storing in storeDir.
func (e Embedded) server(storeDir string) boot.Embedded {
	return boot.Embedded{Host: e.Host, Port: e.Port, StoreDir: storeDir, SyncAlways: e.SyncAlways, MonitorPort: e.MonitorPort,
		User: e.User, Password: e.Password, Token: e.Token,
		SystemAccount: e.SystemAccount, SystemUser: e.SystemUser, SystemPassword: e.SystemPassword}
}

// Input is the stream the stage consumes.
type Input struct {
	// Stream is the input stream's name. Default "EVENTS".
	Stream string `yaml:"stream"`
	// Subjects of the input stream, used only when creating it. Default
	// ["events.>"].
	Subjects []string `yaml:"subjects"`
	// Consumer is the durable pull consumer's name. Default "dedupe-stage".
	Consumer string `yaml:"consumer"`
	// FilterSubject restricts the consumer to a subset of the stream's
	// subjects. Default "" (all).
	FilterSubject string `yaml:"filter_subject"`
	// AckWait is how long a fetched message may stay unacknowledged before
	// JetStream redelivers it. Default 10s.
	AckWait Duration `yaml:"ack_wait"`
	// MaxAckPending bounds the messages delivered and not yet acknowledged.
	// Default 4096; at least pipeline.batch_size.
	MaxAckPending int `yaml:"max_ack_pending"`
	// MaxDeliver bounds deliveries of one message; -1 (default) is
	// unlimited. Only used when creating the consumer. A limit means a
	// message that keeps failing is eventually dropped by JetStream.
	MaxDeliver int `yaml:"max_deliver"`
	// Limits of the input stream, used only when creating it.
	Limits StreamLimits `yaml:",inline"`
}

// StreamLimits bound what a stream the stage creates keeps. They are used
// only when the stage creates the stream; an existing stream is never
// changed.
type StreamLimits struct {
	// MaxAge: messages older than this are removed. Default 0 means
	// computed (the stage's StreamMaxAge: the larger of 7 days and 2 x W,
	// and at least the stream's duplicate window).
	MaxAge Duration `yaml:"max_age"`
	// MaxBytes bounds the stream's size on disk. Default 0: no limit (then
	// max_age alone bounds it).
	MaxBytes ByteSize `yaml:"max_bytes"`
}

// Output is the stream that receives each intent once.
type Output struct {
	// Stream is the output stream's name. Default "EVENTS_DEDUPED".
	Stream string `yaml:"stream"`
	// SubjectPrefix: a message read on subject S is written to
	// SubjectPrefix + "." + S. Default "deduped".
	SubjectPrefix string `yaml:"subject_prefix"`
	// DuplicateWindow of the output stream, used only when creating it.
	// Default 0 means computed: see Config.OutputDuplicateWindow.
	DuplicateWindow Duration `yaml:"duplicate_window"`
	// RestartMargin is how long a crash and restart may take; the output
	// stream's duplicate window must cover input.ack_wait plus this.
	// Default 1m.
	RestartMargin Duration `yaml:"restart_margin"`
	// AllowShortDuplicateWindow: when the output stream's duplicate window
	// is shorter than input.ack_wait + restart_margin, warn instead of
	// refusing to start. Default false.
	AllowShortDuplicateWindow bool `yaml:"allow_short_duplicate_window"`
	// Publish says how a batch is published to the output: PublishAtomic,
	// PublishAsync or PublishAuto (default); see Config.PublishAtomic.
	Publish string `yaml:"publish"`
	// BatchMax is the most messages of one atomic batch; a larger batch is
	// split. At most the server's max_batch_size. Default 1000 (the
	// server's default).
	BatchMax int `yaml:"batch_max"`
	// AtomicMinBatch: with atomic batches, a batch of fewer messages is
	// published one message at a time, which is quicker below about 16
	// (configs/README.md has the costs). 1: every batch atomic. Default 16.
	AtomicMinBatch int `yaml:"atomic_min_batch"`
	// MaxBatchesInFlight bounds the atomic batches the stage has open on
	// the output stream at once, across its partitions. At most the
	// server's max_batch_inflight_per_stream (50 by default), which every
	// client of the stream shares. Default 32.
	MaxBatchesInFlight int `yaml:"max_batches_in_flight"`
	// Limits of the output stream, used only when creating it.
	Limits StreamLimits `yaml:",inline"`
}

// Values of Output.Publish.
const (
	// PublishAuto publishes atomic batches when the server syncs every
	// write before acknowledging it, as far as the stage knows (the
	// embedded server with sync_always) and the output stream allows
	// atomic publish; asynchronous publishes otherwise.
	PublishAuto = "auto"
	// PublishAtomic publishes each output batch as atomic batches: the
	// server syncs each once instead of each message. The output stream
	// must allow atomic publish.
	PublishAtomic = "atomic"
	// PublishAsync publishes each message of a batch asynchronously and
	// awaits every acknowledgement.
	PublishAsync = "async"
)

// ErrAtomicNotAllowed means output.publish is atomic and the output stream
// does not allow atomic publish.
var ErrAtomicNotAllowed = errors.New("output.publish is atomic, but the output stream does not allow atomic publish")

// PublishAtomic tells whether the output is published as atomic batches,
// given whether the stream allows them: atomic and, with scale-out, auto
// yes (ErrAtomicNotAllowed when it does not); async no; otherwise auto only
// when the server is known to sync every write, where a batch costs one
// sync instead of one per message (configs/README.md, output.publish).
func (c Config) PublishAtomic(streamAllowsAtomic bool) (bool, error) {
	publish := c.Output.Publish
	if c.ScaleOut.Enabled && publish == PublishAuto {
		publish = PublishAtomic
	}
	switch publish {
	case PublishAtomic:
		if !streamAllowsAtomic {
			return false, ErrAtomicNotAllowed
		}
		return true, nil
	case PublishAsync:
		return false, nil
	}
	return streamAllowsAtomic && c.KnownToSyncEveryWrite(), nil
}

// KnownToSyncEveryWrite tells whether the stage knows that the server
// fsyncs every write before acknowledging it: only the embedded server with
// sync_always; an external server's sync_interval cannot be read.
func (c Config) KnownToSyncEveryWrite() bool {
	return c.NATS.IsEmbedded() && c.NATS.Embedded.SyncAlways
}

// SideStreamAtomic tells whether the stage publishes to a stream beside the
// output (the dead-letter stream, the totals stream sink) as atomic
// batches, given whether that stream allows atomic publish. It follows
// output.publish, as the output does, without refusing: a stream that does
// not allow atomic publish gets one message at a time, and scale_out does
// not make auto atomic (these streams carry no fence). atomic: when the
// stream allows it; async: never; auto: when the stream allows it and the
// server is the embedded one with sync_always.
func (c Config) SideStreamAtomic(streamAllowsAtomic bool) bool {
	switch c.Output.Publish {
	case PublishAtomic:
		return streamAllowsAtomic
	case PublishAsync:
		return false
	}
	return streamAllowsAtomic && c.KnownToSyncEveryWrite()
}

// Subject returns the output subject for a message read on inputSubject.
func (o Output) Subject(inputSubject string) string { return o.SubjectPrefix + "." + inputSubject }

// Subjects returns the subjects of the output stream: SubjectPrefix + ".>".
func (o Output) Subjects() string { return o.SubjectPrefix + ".>" }

// DeadLetter is where messages that cannot be judged go.
type DeadLetter struct {
	// Subject: a dead letter with reason R is published to Subject + "." + R.
	// Default "dedupe.dlq".
	Subject string `yaml:"subject"`
	// Stream holding dead letters, created with subjects Subject + ".>" when
	// streams are created. Default "DEDUPE_DLQ".
	Stream string `yaml:"stream"`
	// Limits of the dead-letter stream, used only when creating it.
	Limits StreamLimits `yaml:",inline"`
}

// SubjectFor returns the dead-letter subject for reason.
func (d DeadLetter) SubjectFor(reason string) string { return d.Subject + "." + reason }

// Subjects returns the subjects of the dead-letter stream: Subject + ".>".
func (d DeadLetter) Subjects() string { return d.Subject + ".>" }

// Window derives the dedupe window W from named slow paths.
type Window struct {
	// Paths are the slow paths a repeat can take; W is the longest plus
	// Margin. Default client-retry 10m and redelivery 1h.
	Paths []Path `yaml:"paths"`
	// Margin added to the longest path. Default 10m.
	Margin Duration `yaml:"margin"`
	// NearFraction: a repeat caught at an age of at least NearFraction*W is
	// counted as near the end of the window. Default 0.8.
	NearFraction float64 `yaml:"near_fraction"`
	// RefreshOnRepeat makes the window slide: a repeat moves its key's
	// window end to the repeat's time + W, so a source that retries for
	// as long as it is not answered stays deduplicated. Default false: a
	// key's window ends at its first-seen time + W.
	RefreshOnRepeat bool `yaml:"refresh_on_repeat"`
}

// Path is one named slow path.
type Path struct {
	// Name of the path, e.g. "webhook-retry".
	Name string `yaml:"name"`
	// Max is the latest a copy can arrive on this path after the first.
	Max Duration `yaml:"max"`
}

// Derive returns the window derived from w's paths and margin, with w's
// NearFraction.
func (w Window) Derive() (window.Window, error) {
	paths := make([]window.Path, len(w.Paths))
	for i, p := range w.Paths {
		paths[i] = window.Path{Name: p.Name, Max: p.Max.D()}
	}
	ww, err := window.Derive(paths, w.Margin.D())
	if err != nil {
		return window.Window{}, err
	}
	ww.NearFraction = w.NearFraction
	if err := ww.Validate(); err != nil {
		return window.Window{}, err
	}
	return ww, nil
}

// State configures the Badger store of first-seen keys.
type State struct {
	// DataDir holds everything on disk: Badger state under
	// <data_dir>/state and, by default, the embedded server's JetStream
	// store under <data_dir>/nats. Default "./data".
	DataDir string `yaml:"data_dir"`
	// Partitions is the number of partitions, each one Badger instance and
	// one goroutine. Default 8; 1..1024. Existing state records its count
	// and refuses to open with another.
	Partitions int `yaml:"partitions"`
	// MemoryBudget is the memory for the store's Badger instance, which
	// every partition shares: its memtables (tables are read in place).
	// Default 64MiB; at least 8MiB, so that Badger's smallest memtables
	// stay inside it. state.Options.BadgerSizing derives Badger's sizes
	// from it.
	MemoryBudget ByteSize `yaml:"memory_budget"`
	// SyncWrites: fsync each commit before acknowledging the input. Unset
	// (the default), the state syncs as the output's server does: as
	// nats.embedded.sync_always when the stage embeds the server, and
	// always with an external server, whose setting the stage cannot read
	// (Config.StateSyncWrites; Summary says what each combination
	// guarantees). False is faster, but a power failure can forget keys
	// whose input was already acknowledged, so their later copies are
	// forwarded again.
	SyncWrites *bool `yaml:"sync_writes"`
	// GCInterval is how often expired keys are collected from disk
	// (value-log GC). Default 10m; 0 disables it (the disk then only grows).
	GCInterval Duration `yaml:"gc_interval"`
	// SnapshotInterval is how often the Bloom filters are snapshotted to
	// speed up the rebuild after a restart. Default 1m; 0 snapshots only at
	// a clean shutdown.
	SnapshotInterval Duration `yaml:"snapshot_interval"`
	// OnDamage is what run does with a damaged store (a table whose
	// checksums fail, a MANIFEST missing or unreadable, a table it lists
	// gone): "refuse" (the default) exits naming the file and the fix;
	// "rebuild" moves the store aside into <data_dir>/state/damaged-<time>
	// (never deleting it), starts empty and restores every partition from
	// the output stream before judging. A lock held, a full disk or an
	// unreadable file are never rebuilt (docs/failures.md).
	OnDamage string `yaml:"on_damage"`
}

// Dir returns the Badger state directory, <data_dir>/state.
func (s State) Dir() string { return filepath.Join(s.DataDir, "state") }

// Filter configures the windowed Bloom pre-check.
type Filter struct {
	// Enabled: consult the filter before the store. Default true. Disabled,
	// every message costs a store read.
	Enabled bool `yaml:"enabled"`
	// ExpectedKeys is the number of distinct keys expected per window W,
	// across all partitions. Default 1000000.
	ExpectedKeys uint64 `yaml:"expected_keys"`
	// FalsePositiveRate is the target rate of "maybe seen" answers for new
	// keys (each costs one store read, never an event). Default 0.01.
	FalsePositiveRate float64 `yaml:"false_positive_rate"`
	// Generations G: the filter is a ring of G+1 generations, each covering
	// W/G. Default 4.
	Generations int `yaml:"generations"`
}

// Pipeline configures batching and limits.
type Pipeline struct {
	// BatchSize is the most messages fetched and judged together. Default
	// 256; 1..10000.
	BatchSize int `yaml:"batch_size"`
	// BatchLinger is how long a partition waits for more messages to fill a
	// batch before judging what it has. Default 1ms; 0 does not wait.
	BatchLinger Duration `yaml:"batch_linger"`
	// MaxPublishInFlight bounds output publishes awaiting their PubAck.
	// Default 1024.
	MaxPublishInFlight int `yaml:"max_publish_in_flight"`
	// MaxMessageBytes: larger payloads are dead-lettered with reason
	// "oversized". Default 1MiB.
	MaxMessageBytes ByteSize `yaml:"max_message_bytes"`
	// OnFingerprintMismatch: what to do with a copy of a key whose payload
	// differs from the first copy's: "dead-letter" (default) or "repeat".
	OnFingerprintMismatch string `yaml:"on_fingerprint_mismatch"`
}

// HTTP configures the HTTP server for /metrics, /healthz, /readyz and
// /inspect.
type HTTP struct {
	// Addr to listen on. Default "127.0.0.1:9464"; "" disables the server.
	Addr string `yaml:"addr"`
	// Inspect serves /inspect?key=K, which tells anyone who can reach it
	// whether a key was seen. Default true; the container image sets it
	// false.
	Inspect bool `yaml:"inspect"`
	// InspectAddr, if set, serves /inspect on its own listener instead of
	// on Addr (which keeps /metrics, /healthz and /readyz). Default "".
	InspectAddr string `yaml:"inspect_addr"`
}

// InspectOn returns the address /inspect is served on: InspectAddr when
// set, else Addr; "" when /inspect is off or HTTP is disabled.
func (h HTTP) InspectOn() string {
	switch {
	case !h.Inspect:
		return ""
	case h.InspectAddr != "":
		return h.InspectAddr
	}
	return h.Addr
}

// Log configures logging (log/slog).
type Log struct {
	// Level: debug, info (default), warn or error.
	Level string `yaml:"level"`
	// Format: text (default) or json.
	Format string `yaml:"format"`
}

// Default returns the default configuration: an embedded nats-server on
// 127.0.0.1:4222 that gets its streams created, keys from the Nats-Msg-Id
// header, W = 1h10m (redelivery 1h + margin 10m), 8 partitions under ./data.
// It passes Validate.
func Default() Config {
	return Config{
		NATS: NATS{
			ConnectTimeout: Duration(5 * time.Second),
			PingInterval:   Duration(DefaultPingInterval),
			MaxPingsOut:    DefaultMaxPingsOut,
			Embedded: Embedded{
				Host:       "127.0.0.1",
				Port:       4222,
				SyncAlways: true,
				SystemUser: "sys",
			},
		},
		Input: Input{
			Stream:        "EVENTS",
			Subjects:      []string{"events.>"},
			Consumer:      "dedupe-stage",
			AckWait:       Duration(10 * time.Second),
			MaxAckPending: 4096,
			MaxDeliver:    -1,
		},
		Output: Output{
			Stream:             "EVENTS_DEDUPED",
			SubjectPrefix:      "deduped",
			RestartMargin:      Duration(streams.DefaultRestartMargin),
			Publish:            PublishAuto,
			BatchMax:           1000,
			AtomicMinBatch:     16,
			MaxBatchesInFlight: 32,
		},
		DeadLetter: DeadLetter{
			Subject: "dedupe.dlq",
			Stream:  "DEDUPE_DLQ",
		},
		Key: keys.DefaultKeyConfig(),
		Window: Window{
			Paths: []Path{
				{Name: "client-retry", Max: Duration(10 * time.Minute)},
				{Name: "redelivery", Max: Duration(time.Hour)},
			},
			Margin:       Duration(10 * time.Minute),
			NearFraction: window.DefaultNearFraction,
		},
		State: State{
			DataDir:          "./data",
			Partitions:       8,
			MemoryBudget:     state.DefaultMemoryBudget,
			GCInterval:       Duration(10 * time.Minute),
			SnapshotInterval: Duration(time.Minute),
			OnDamage:         string(state.DamageRefuse),
		},
		Filter: Filter{
			Enabled:           true,
			ExpectedKeys:      1_000_000,
			FalsePositiveRate: 0.01,
			Generations:       4,
		},
		Pipeline: Pipeline{
			BatchSize:             256,
			BatchLinger:           Duration(time.Millisecond),
			MaxPublishInFlight:    1024,
			MaxMessageBytes:       MiB,
			OnFingerprintMismatch: FingerprintDeadLetter,
		},
		HTTP:     HTTP{Addr: "127.0.0.1:9464", Inspect: true},
		Log:      Log{Level: "info", Format: "text"},
		Totals:   DefaultTotals(),
		ScaleOut: DefaultScaleOut(),
	}
}

// Load returns Default() overlaid with the YAML file at path; an empty path
// returns Default(). It does not validate: call Validate after ApplyEnv and
// flags.
func Load(path string) (Config, error) {
	if path == "" {
		return Default(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse returns Default() overlaid with the YAML document data. Unknown
// fields, values of the wrong type, more than one document and a top level
// that is not a mapping are errors wrapping ErrParse. An empty document
// gives Default(). It does not validate.
func Parse(data []byte) (Config, error) {
	c := Default()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return Default(), nil
		}
		// yaml.v3 quotes values it could not decode; some may be secrets.
		red := redact.New(c.Secrets(), yamlSecrets(data))
		return Config{}, fmt.Errorf("%w: %w", ErrParse, red.Error(yamlTypeWords(err)))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: more than one YAML document", ErrParse)
	}
	return c, nil
}

// StateSyncWrites reports whether the state fsyncs each commit before the
// input is acknowledged: state.sync_writes when set; unset, as the
// embedded server fsyncs its writes (nats.embedded.sync_always), and true
// with an external server. A state that syncs while the output's server
// does not is no safer: a power failure can then lose forwarded messages
// whose keys the state keeps, so their redelivered inputs are judged
// repeats and the events are lost, where a state that forgot them too
// forwards them again.
func (c Config) StateSyncWrites() bool {
	if c.State.SyncWrites != nil {
		return *c.State.SyncWrites
	}
	if c.NATS.IsEmbedded() {
		return c.NATS.Embedded.SyncAlways
	}
	return true
}

// ShouldCreateStreams reports whether missing streams and the consumer are
// created: CreateStreams when set, else true exactly when the embedded
// server is used.
func (n NATS) ShouldCreateStreams() bool {
	if n.CreateStreams != nil {
		return *n.CreateStreams
	}
	return n.IsEmbedded()
}

// IsEmbedded reports whether the embedded nats-server is used: URL and
// Context both empty.
func (n NATS) IsEmbedded() bool { return n.URL == "" && n.Context == "" }

// EmbeddedClient returns n set to connect, from another process, to the
// embedded server that `run` starts with n: its listen address (a
// wildcard host is reached on loopback) and the credentials it requires
// of every client. ok is false when the port is chosen at start (-1), so
// that no other process can know it.
func (n NATS) EmbeddedClient() (_ NATS, ok bool) {
	e := n.Embedded
	if e.Port < 0 {
		return n, false
	}
	host := e.Host
	if host == "" || host == "0.0.0.0" || host == "::" || host == "[::]" {
		host = "127.0.0.1"
	}
	n.URL = "nats://" + net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(e.Port))
	n.User, n.Password, n.Token = e.User, e.Password, e.Token
	return n, true
}

// EmbeddedStoreDir returns the embedded server's JetStream directory:
// nats.embedded.store_dir, or <state.data_dir>/nats when that is empty.
func (c Config) EmbeddedStoreDir() string {
	return c.NATS.Embedded.StoreDirIn(c.State.DataDir)
}

// EmbeddedServer returns how boot.StartEmbedded runs the embedded server:
// nats.embedded, storing in EmbeddedStoreDir.
func (c Config) EmbeddedServer() boot.Embedded {
	return c.NATS.Embedded.server(c.EmbeddedStoreDir())
}

// Dial returns how boot.Connect reaches the server with n's connection
// settings (after ApplyContext), and the credentials the embedded server
// requires of its clients.
func (n NATS) Dial() boot.Dial {
	e := n.Embedded
	return boot.Dial{URL: n.URL, User: n.User, Password: n.Password, Token: n.Token,
		NKeySeedFile: n.NKeySeedFile, CredsFile: n.CredsFile,
		TLSCAFile: n.TLS.CAFile, TLSCertFile: n.TLS.CertFile, TLSKeyFile: n.TLS.KeyFile, TLSHandshakeFirst: n.TLS.HandshakeFirst,
		ConnectTimeout: n.ConnectTimeout.D(), PingInterval: n.PingInterval.D(), MaxPingsOut: n.MaxPingsOut, StaleAfter: n.StaleAfter(),
		EmbeddedUser: e.User, EmbeddedPassword: e.Password, EmbeddedToken: e.Token}
}

// StoreDirIn returns the embedded server's JetStream directory when the
// state lives in dataDir: StoreDir, or dataDir/nats when that is empty.
func (e Embedded) StoreDirIn(dataDir string) string {
	if e.StoreDir != "" {
		return e.StoreDir
	}
	return filepath.Join(dataDir, "nats")
}

// MinDuplicateWindow is the shortest output duplicate window that still
// drops the copy republished after a crash between publish and commit:
// input.ack_wait + output.restart_margin (streams.RequiredDuplicateWindow
// of a consumer without backoff, which is what the stage creates).
func (c Config) MinDuplicateWindow() time.Duration {
	return streams.RequiredDuplicateWindow(c.Input.AckWait.D(), nil, c.Output.RestartMargin.D())
}

// OutputDuplicateWindow is the duplicate window to create the output stream
// with: output.duplicate_window when set, else streams.DuplicateWindow:
// twice MinDuplicateWindow and at least JetStream's default of 2m (2m20s
// with the defaults).
func (c Config) OutputDuplicateWindow() time.Duration {
	if c.Output.DuplicateWindow > 0 {
		return c.Output.DuplicateWindow.D()
	}
	return streams.DuplicateWindow(c.Input.AckWait.D(), c.Output.RestartMargin.D())
}
