package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	ringbloom "github.com/dedupe-stage/dedupe-stage/bloom"
	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/redact"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Limits enforced by Validate.
const (
	MaxPartitions      = state.MaxPartitions
	MaxBatchSize       = 10000
	MaxPublishInFlight = 65536
	MaxGenerations     = ringbloom.MaxGenerations
	MaxExpectedKeys    = 100_000_000_000
	MaxMessageBytes    = 64 * MiB // NATS's hard payload limit
	MaxBatchLinger     = Duration(time.Second)
	MaxAckWait         = Duration(12 * time.Hour)
	MaxRestartMargin   = Duration(24 * time.Hour)
	MinMemoryBudget    = 8 * MiB // three of Badger's smallest memtables (1 MiB, 2.3 MiB in RAM each) fit
	MaxOutputBatch     = 10000   // output.batch_max
	MaxBatchesInFlight = 1000    // output.max_batches_in_flight: nats-server's default max_batch_inflight_total
)

// FieldError is one problem with one field. Its message starts with the
// field's YAML path and names the value, e.g.
// `pipeline.batch_size: 0, want 1..10000`. It wraps ErrInvalid.
type FieldError struct {
	// Field is the YAML path, e.g. "window.paths[1].max".
	Field string
	// Msg is the value and what was wanted.
	Msg string
}

// Error returns Field + ": " + Msg.
func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Unwrap returns ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// keyError carries an error of keys.KeyConfig.Validate (which names its
// field) so that it also wraps ErrInvalid.
type keyError struct{ err error }

func (e keyError) Error() string   { return e.err.Error() }
func (e keyError) Unwrap() []error { return []error{e.err, ErrInvalid} }

// validator collects errors.
type validator struct{ errs []error }

func (v *validator) add(field, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
}

// Validate checks the whole configuration and reports every problem found,
// joined with errors.Join; each is a *FieldError (or, for the key section, an
// error from keys) naming the YAML field and its value, and wraps
// ErrInvalid. nil means the configuration is usable.
func (c Config) Validate() error {
	v := &validator{}
	c.validateNATS(v)
	c.validateStreams(v)
	if err := c.Key.Validate("key"); err != nil {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				v.errs = append(v.errs, keyError{e})
			}
		} else {
			v.errs = append(v.errs, keyError{err})
		}
	}
	c.validateWindow(v)
	c.validateState(v)
	c.validatePipeline(v)
	c.validateTotals(v)
	c.validateScaleOut(v)
	c.validateAdmin(v)
	if a := c.HTTP.Addr; a != "" {
		if msg := checkHostPort(a); msg != "" {
			v.add("http.addr", "%q: %s", a, msg)
		}
	}
	if a := c.HTTP.InspectAddr; a != "" {
		if msg := checkHostPort(a); msg != "" {
			v.add("http.inspect_addr", "%q: %s", a, msg)
		} else if a == c.HTTP.Addr {
			v.add("http.inspect_addr", "%q is http.addr; leave it empty to serve /inspect there", a)
		}
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		v.add("log.level", "%q, want debug, info, warn or error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		v.add("log.format", "%q, want text or json", c.Log.Format)
	}
	// Messages name values; none may show a credential.
	red := c.Redactor()
	for i, e := range v.errs {
		if fe, ok := e.(*FieldError); ok {
			fe.Msg = red.String(fe.Msg)
		} else {
			v.errs[i] = red.Error(e)
		}
	}
	return errors.Join(v.errs...)
}

func (c Config) validateNATS(v *validator) {
	n := c.NATS
	if n.URL != "" {
		for _, u := range strings.Split(n.URL, ",") {
			if msg := checkNATSURL(strings.TrimSpace(u)); msg != "" {
				v.add("nats.url", "%q: %s", redact.NATSURL(n.URL), msg)
				break
			}
		}
	}
	n.validateTimes(v)
	if n.Password != "" && n.User == "" {
		v.add("nats.password", "set while nats.user is empty")
	}
	if n.User != "" && n.Password == "" {
		v.add("nats.user", "%q set while nats.password is empty", n.User)
	}
	// One authentication method at most.
	type method struct{ field, name string }
	var methods []method
	if n.User != "" || n.Password != "" {
		methods = append(methods, method{"nats.user", "user/password"})
	}
	if n.Token != "" {
		methods = append(methods, method{"nats.token", "token"})
	}
	if n.NKeySeedFile != "" {
		methods = append(methods, method{"nats.nkey_seed_file", "nkey seed"})
	}
	if n.CredsFile != "" {
		methods = append(methods, method{"nats.creds_file", "creds file"})
	}
	for i := 1; i < len(methods); i++ {
		v.add(methods[i].field, "set together with %s (%s); configure one authentication method", methods[0].field, methods[0].name)
	}
	if n.TLS.CertFile != "" && n.TLS.KeyFile == "" {
		v.add("nats.tls.key_file", "empty while nats.tls.cert_file is %q; set both or neither", n.TLS.CertFile)
	}
	if n.TLS.KeyFile != "" && n.TLS.CertFile == "" {
		v.add("nats.tls.cert_file", "empty while nats.tls.key_file is %q; set both or neither", n.TLS.KeyFile)
	}
	if n.JetStreamDomain != "" && n.JetStreamAPIPrefix != "" {
		v.add("nats.jetstream_api_prefix", "%q set together with nats.jetstream_domain %q; a domain is an API prefix ($JS.<domain>.API), so set one", n.JetStreamAPIPrefix, n.JetStreamDomain)
	}
	if d := n.JetStreamDomain; d != "" && strings.ContainsAny(d, " \t\r\n.*>") {
		v.add("nats.jetstream_domain", "%q, want one subject token (no dots, spaces or wildcards)", d)
	}
	if p := n.JetStreamAPIPrefix; p != "" && strings.ContainsAny(p, " \t\r\n*>") {
		v.add("nats.jetstream_api_prefix", "%q, want a subject prefix without spaces or wildcards", p)
	}
	if n.IsEmbedded() {
		c.validateEmbedded(v)
	}
}

// validateTimes checks the connection's timeouts and pings.
func (n NATS) validateTimes(v *validator) {
	if n.ConnectTimeout <= 0 {
		v.add("nats.connect_timeout", "%v, want > 0", n.ConnectTimeout)
	}
	if n.PingInterval < Duration(10*time.Millisecond) || n.PingInterval > Duration(10*time.Minute) {
		v.add("nats.ping_interval", "%v, want 10ms..10m", n.PingInterval)
	}
	if n.MaxPingsOut < 1 || n.MaxPingsOut > 100 {
		v.add("nats.max_pings_out", "%d, want 1..100", n.MaxPingsOut)
	}
}

// validateEmbedded checks the embedded nats-server's settings.
func (c Config) validateEmbedded(v *validator) {
	e := c.NATS.Embedded
	if e.Host == "" {
		v.add("nats.embedded.host", "empty, want an address to listen on such as 127.0.0.1")
	}
	if e.Port != -1 && (e.Port < 1 || e.Port > 65535) {
		v.add("nats.embedded.port", "%d, want 1..65535 (or -1 for a free port)", e.Port)
	}
	if e.MonitorPort != 0 && e.MonitorPort != -1 && (e.MonitorPort < 1 || e.MonitorPort > 65535) {
		v.add("nats.embedded.monitor_port", "%d, want 0 (off), 1..65535 or -1 for a free port", e.MonitorPort)
	}
	if e.MonitorPort > 0 && e.MonitorPort == e.Port {
		v.add("nats.embedded.monitor_port", "%d, the same as nats.embedded.port", e.MonitorPort)
	}
	if e.Password != "" && e.User == "" {
		v.add("nats.embedded.password", "set while nats.embedded.user is empty")
	}
	if e.User != "" && e.Password == "" {
		v.add("nats.embedded.user", "%q set while nats.embedded.password is empty", e.User)
	}
	if e.Token != "" && e.User != "" {
		v.add("nats.embedded.token", "set together with nats.embedded.user; require a user and password or a token, not both")
	}
	if e.SystemAccount {
		if e.SystemUser == "" {
			v.add("nats.embedded.system_user", "empty while nats.embedded.system_account is true, want a user name such as sys")
		}
		if e.SystemPassword == "" {
			v.add("nats.embedded.system_password", "empty while nats.embedded.system_account is true; set it (or $DEDUPE_EMBEDDED_SYSTEM_PASSWORD) to the password `nats --user %s --password ... server ping` will use", e.SystemUser)
		}
		if e.SystemUser != "" && e.SystemUser == e.User {
			v.add("nats.embedded.system_user", "%q, the same as nats.embedded.user", e.SystemUser)
		}
		if e.Token != "" {
			v.add("nats.embedded.token", "set while nats.embedded.system_account is true; nats-server cannot combine a token with the system account's user, so use nats.embedded.user and password")
		}
	}
}

func (c Config) validateStreams(v *validator) {
	in, out, dl := c.Input, c.Output, c.DeadLetter
	checkName(v, "input.stream", in.Stream)
	checkName(v, "input.consumer", in.Consumer)
	checkName(v, "output.stream", out.Stream)
	checkName(v, "dead_letter.stream", dl.Stream)
	if in.Stream != "" && in.Stream == out.Stream {
		v.add("output.stream", "%q, the same as input.stream", out.Stream)
	}
	if dl.Stream != "" && (dl.Stream == in.Stream || dl.Stream == out.Stream) {
		v.add("dead_letter.stream", "%q, the same as the input or output stream", dl.Stream)
	}
	inputs := c.validateInput(v)
	prefixOK := c.validateOutput(v)
	c.validateSubjectOverlaps(v, inputs, prefixOK)
}

// validateInput checks the input stream's subjects and consumer settings
// and returns the subjects the input stream holds, as far as the
// configuration knows.
func (c Config) validateInput(v *validator) []string {
	in := c.Input
	var inputs []string
	if len(in.Subjects) == 0 && c.NATS.ShouldCreateStreams() {
		v.add("input.subjects", "empty, want at least one subject to create the input stream with")
	}
	for i, s := range in.Subjects {
		if msg := checkSubject(s, true); msg != "" {
			v.add(fmt.Sprintf("input.subjects[%d]", i), "%q: %s", s, msg)
			continue
		}
		inputs = append(inputs, s)
	}
	if f := in.FilterSubject; f != "" {
		if msg := checkSubject(f, true); msg != "" {
			v.add("input.filter_subject", "%q: %s", f, msg)
		} else {
			if c.NATS.ShouldCreateStreams() && len(inputs) > 0 && !overlapsAny(f, inputs) {
				v.add("input.filter_subject", "%q matches none of input.subjects %q", f, inputs)
			}
			inputs = append(inputs, f)
		}
	}
	if in.AckWait <= 0 || in.AckWait > MaxAckWait {
		v.add("input.ack_wait", "%v, want > 0 and <= %v", in.AckWait, MaxAckWait)
	}
	if in.MaxAckPending < c.Pipeline.BatchSize || in.MaxAckPending < 1 {
		v.add("input.max_ack_pending", "%d, want >= pipeline.batch_size (%d) and >= 1", in.MaxAckPending, c.Pipeline.BatchSize)
	}
	if in.MaxDeliver != -1 && in.MaxDeliver < 1 {
		v.add("input.max_deliver", "%d, want -1 (unlimited) or >= 1", in.MaxDeliver)
	}
	return inputs
}

// validateOutput checks the output's subject prefix, duplicate window,
// limits and publishing, and the limits of every stream. It reports
// whether the prefix is a valid subject.
func (c Config) validateOutput(v *validator) bool {
	in, out, dl := c.Input, c.Output, c.DeadLetter
	prefixOK := true
	if msg := checkSubject(out.SubjectPrefix, false); msg != "" {
		v.add("output.subject_prefix", "%q: %s", out.SubjectPrefix, msg)
		prefixOK = false
	}
	if out.DuplicateWindow < 0 {
		v.add("output.duplicate_window", "%v, want >= 0 (0 = computed)", out.DuplicateWindow)
	}
	checkLimits(v, "input", in.Limits)
	checkLimits(v, "output", out.Limits)
	checkLimits(v, "dead_letter", dl.Limits)
	if dup := c.OutputDuplicateWindow(); out.Limits.MaxAge > 0 && out.Limits.MaxAge.D() < dup {
		v.add("output.max_age", "%v, shorter than the output duplicate window %v; JetStream needs max_age >= duplicate_window", out.Limits.MaxAge, Duration(dup))
	}
	if out.RestartMargin < 0 || out.RestartMargin > MaxRestartMargin {
		v.add("output.restart_margin", "%v, want 0..%v", out.RestartMargin, MaxRestartMargin)
	}
	switch out.Publish {
	case PublishAuto, PublishAtomic, PublishAsync:
	default:
		v.add("output.publish", "%q, want %s, %s or %s", out.Publish, PublishAuto, PublishAtomic, PublishAsync)
	}
	if out.BatchMax < 1 || out.BatchMax > MaxOutputBatch {
		v.add("output.batch_max", "%d, want 1..%d (and at most the server's max_batch_size, 1000 by default)", out.BatchMax, MaxOutputBatch)
	}
	if out.AtomicMinBatch < 1 || out.AtomicMinBatch > MaxOutputBatch {
		v.add("output.atomic_min_batch", "%d, want 1..%d; 1 publishes every batch atomically", out.AtomicMinBatch, MaxOutputBatch)
	}
	if out.MaxBatchesInFlight < 1 || out.MaxBatchesInFlight > MaxBatchesInFlight {
		v.add("output.max_batches_in_flight", "%d, want 1..%d (and below the server's max_batch_inflight_per_stream, 50 by default)", out.MaxBatchesInFlight, MaxBatchesInFlight)
	}
	if floor := c.MinDuplicateWindow(); out.DuplicateWindow > 0 && out.DuplicateWindow.D() < floor && !out.AllowShortDuplicateWindow {
		v.add("output.duplicate_window", "%v, want >= input.ack_wait + output.restart_margin (%v), or 0 to compute it; "+
			"a shorter window lets a copy republished after a crash through (set output.allow_short_duplicate_window to accept)",
			out.DuplicateWindow, Duration(floor))
	}
	return prefixOK
}

// validateSubjectOverlaps checks that the output, dead-letter and control
// subjects overlap neither each other nor the input's subjects.
func (c Config) validateSubjectOverlaps(v *validator, inputs []string, prefixOK bool) {
	if prefixOK {
		c.validateOutputOverlaps(v, inputs)
	}
	c.validateDeadLetterOverlaps(v, inputs, prefixOK)
}

// validateOutputOverlaps checks that the output subjects, and with
// scale-out the group's control subjects, overlap no input subject (nor
// the dead-letter subjects, for the control subjects).
func (c Config) validateOutputOverlaps(v *validator, inputs []string) {
	out := c.Output
	outputs := out.Subjects()
	for _, s := range inputs {
		if subjectsOverlap(outputs, s) {
			v.add("output.subject_prefix", "%q: output subjects %q overlap input subject %q", out.SubjectPrefix, outputs, s)
		}
	}
	control := changelog.ControlSubjects(out.SubjectPrefix)
	for _, s := range append(slices.Clone(inputs), c.DeadLetter.Subjects()) {
		if subjectsOverlap(control, s) {
			v.add("output.subject_prefix", "%q: the changelog's control subjects %q overlap subject %q of another stream", out.SubjectPrefix, control, s)
		}
	}
}

// validateDeadLetterOverlaps checks dead_letter.subject, and that the
// dead-letter subjects, and with scale-out their fence subjects, overlap no
// input or output subject; output subjects count only when prefixOK.
func (c Config) validateDeadLetterOverlaps(v *validator, inputs []string, prefixOK bool) {
	out, dl := c.Output, c.DeadLetter
	if msg := checkSubject(dl.Subject, false); msg != "" {
		v.add("dead_letter.subject", "%q: %s", dl.Subject, msg)
		return
	}
	outputs := out.Subjects()
	dead := dl.Subjects()
	for _, s := range inputs {
		if subjectsOverlap(dead, s) {
			v.add("dead_letter.subject", "%q: dead-letter subjects %q overlap input subject %q", dl.Subject, dead, s)
		}
	}
	if prefixOK && subjectsOverlap(dead, outputs) {
		v.add("dead_letter.subject", "%q: dead-letter subjects %q overlap output subjects %q", dl.Subject, dead, outputs)
	}
	if !c.ScaleOut.Enabled {
		return
	}
	control := changelog.ControlSubjects(dl.Subject)
	others := append(slices.Clone(inputs), outputs)
	if prefixOK {
		others = append(others, changelog.ControlSubjects(out.SubjectPrefix))
	}
	for _, s := range others {
		if subjectsOverlap(control, s) {
			v.add("dead_letter.subject", "%q: the group's dead-letter fence subjects %q overlap subject %q of another stream", dl.Subject, control, s)
		}
	}
}

// checkLimits checks the limits of a stream the stage may create.
func checkLimits(v *validator, section string, l StreamLimits) {
	if l.MaxAge < 0 {
		v.add(section+".max_age", "%v, want >= 0 (0 = computed)", l.MaxAge)
	}
	if l.MaxBytes < 0 {
		v.add(section+".max_bytes", "%v, want >= 0 (0 = no limit)", l.MaxBytes)
	}
}

func (c Config) validateWindow(v *validator) {
	w := c.Window
	before := len(v.errs)
	if len(w.Paths) == 0 {
		v.add("window.paths", "empty, want at least one slow path (name and max)")
	}
	seen := map[string]int{}
	for i, p := range w.Paths {
		f := fmt.Sprintf("window.paths[%d]", i)
		if strings.TrimSpace(p.Name) == "" {
			v.add(f+".name", "%q, want a name such as webhook-retry", p.Name)
		} else if j, dup := seen[p.Name]; dup {
			v.add(f+".name", "%q, already the name of window.paths[%d]", p.Name, j)
		} else {
			seen[p.Name] = i
		}
		if p.Max <= 0 {
			v.add(f+".max", "%v, want > 0", p.Max)
		}
	}
	if w.Margin < 0 {
		v.add("window.margin", "%v, want >= 0", w.Margin)
	}
	if !(w.NearFraction > 0 && w.NearFraction <= 1) {
		v.add("window.near_fraction", "%v, want in (0, 1]", w.NearFraction)
	}
	if len(v.errs) == before {
		if _, err := w.Derive(); err != nil {
			v.add("window.paths", "%v", err)
		}
	}
}

func (c Config) validateState(v *validator) {
	before := len(v.errs)
	s := c.State
	if strings.TrimSpace(s.DataDir) == "" {
		v.add("state.data_dir", "%q, want a directory", s.DataDir)
	}
	if s.Partitions < 1 || s.Partitions > MaxPartitions {
		v.add("state.partitions", "%d, want 1..%d", s.Partitions, MaxPartitions)
	}
	if s.MemoryBudget < MinMemoryBudget {
		v.add("state.memory_budget", "%v, want >= %v (Badger's smallest memtables)", s.MemoryBudget, MinMemoryBudget)
	}
	if s.GCInterval < 0 {
		v.add("state.gc_interval", "%v, want >= 0 (0 disables value-log GC)", s.GCInterval)
	}
	if s.SnapshotInterval < 0 {
		v.add("state.snapshot_interval", "%v, want >= 0 (0 snapshots only at shutdown)", s.SnapshotInterval)
	}
	switch state.DamagePolicy(s.OnDamage) {
	case state.DamageRefuse, state.DamageRebuild:
	default:
		v.add("state.on_damage", "%q, want %q or %q", s.OnDamage, state.DamageRefuse, state.DamageRebuild)
	}
	f := c.Filter
	if f.ExpectedKeys < 1 || f.ExpectedKeys > MaxExpectedKeys {
		v.add("filter.expected_keys", "%d, want 1..%d", f.ExpectedKeys, uint64(MaxExpectedKeys))
	}
	if !(f.FalsePositiveRate > 0 && f.FalsePositiveRate < 1) {
		v.add("filter.false_positive_rate", "%v, want in (0, 1), e.g. 0.01", f.FalsePositiveRate)
	} else if f.FalsePositiveRate < 1e-9 {
		v.add("filter.false_positive_rate", "%v, want >= 1e-9", f.FalsePositiveRate)
	}
	if f.Generations < 1 || f.Generations > MaxGenerations {
		v.add("filter.generations", "%d, want 1..%d", f.Generations, MaxGenerations)
	}
	if len(v.errs) > before {
		return
	}
	// What the state section and the filter build: state and bloom own
	// these checks and the sizing; ask them rather than recompute.
	w, err := c.Window.Derive()
	if err != nil {
		return // reported by validateWindow
	}
	so := c.StateOptions(w)
	sz, err := so.FilterSizing()
	switch {
	case err != nil:
		v.add("filter.expected_keys", "%d at false_positive_rate %v with generations %d is outside the filter's limits (%d partitions): %v",
			f.ExpectedKeys, f.FalsePositiveRate, f.Generations, s.Partitions, err)
	case filterBytes(sz, s.Partitions) > ringbloom.MaxMemoryBytes:
		v.add("filter.expected_keys", "%d at false_positive_rate %v needs %s of filter, more than the %s limit",
			f.ExpectedKeys, f.FalsePositiveRate, humanBytes(filterBytes(sz, s.Partitions)), humanBytes(ringbloom.MaxMemoryBytes))
	}
	if err := so.Validate(); err != nil && len(v.errs) == before {
		v.add("state", "%v", err)
	}
}

// filterBytes is the memory of the filters of all partitions, each sized
// as sz.
func filterBytes(sz ringbloom.Sizing, partitions int) uint64 {
	return sz.MemoryBytes * uint64(max(partitions, 0))
}

func (c Config) validatePipeline(v *validator) {
	p := c.Pipeline
	if p.BatchSize < 1 || p.BatchSize > MaxBatchSize {
		v.add("pipeline.batch_size", "%d, want 1..%d", p.BatchSize, MaxBatchSize)
	}
	if p.BatchLinger < 0 || p.BatchLinger > MaxBatchLinger {
		v.add("pipeline.batch_linger", "%v, want 0..%v", p.BatchLinger, MaxBatchLinger)
	}
	if p.MaxPublishInFlight < 1 || p.MaxPublishInFlight > MaxPublishInFlight {
		v.add("pipeline.max_publish_in_flight", "%d, want 1..%d", p.MaxPublishInFlight, MaxPublishInFlight)
	}
	if p.MaxMessageBytes < 1 || p.MaxMessageBytes > MaxMessageBytes {
		v.add("pipeline.max_message_bytes", "%v, want 1B..%v", p.MaxMessageBytes, MaxMessageBytes)
	}
	switch p.OnFingerprintMismatch {
	case FingerprintDeadLetter, FingerprintRepeat:
	default:
		v.add("pipeline.on_fingerprint_mismatch", "%q, want %q or %q", p.OnFingerprintMismatch, FingerprintDeadLetter, FingerprintRepeat)
	}
}

// checkName returns a problem with a JetStream stream or consumer name.
func checkName(v *validator, field, name string) {
	if name == "" {
		v.add(field, `"", want a name`)
		return
	}
	if len(name) > 255 {
		v.add(field, "%q is %d bytes, want at most 255", name, len(name))
		return
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c <= ' ' || c == 0x7f, c == '.', c == '*', c == '>', c == '/', c == '\\':
			v.add(field, "%q: byte %d (%q) not allowed in a name (no whitespace, '.', '*', '>', '/' or '\\\\')", name, i, c)
			return
		}
	}
}

// checkSubject returns "" when s is a valid subject, a pattern with whole
// token wildcards if wildcards, else why not. Validity is nats-server's
// (server.IsValidSubject); control characters, which the server lets
// through, are refused too.
func checkSubject(s string, wildcards bool) string {
	switch {
	case s == "":
		return "empty, want a subject"
	case strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return "whitespace or control character"
	case !server.IsValidSubject(s):
		// With whitespace ruled out, an empty token or a token after '>'.
		if strings.Contains("."+s+".", "..") {
			return "empty token"
		}
		return "'>' must be the last token"
	case !wildcards && !server.IsValidLiteralSubject(s):
		return "wildcards not allowed here"
	}
	return ""
}

// subjectsOverlap reports whether some subject matches both patterns a and b
// ('*' matches one token, '>' one or more trailing tokens).
func subjectsOverlap(a, b string) bool { return server.SubjectsCollide(a, b) }

func overlapsAny(s string, list []string) bool {
	for _, l := range list {
		if subjectsOverlap(s, l) {
			return true
		}
	}
	return false
}

// checkNATSURL returns "" when u is a usable server URL, else why not.
func checkNATSURL(u string) string {
	if u == "" {
		return "empty URL in the list"
	}
	if !strings.Contains(u, "://") {
		u = "nats://" + u
	}
	p, err := url.Parse(u)
	if err != nil {
		// net/url's error quotes the URL, and its inner error may quote a
		// part of the user information.
		var ue *url.Error
		if strings.Contains(u, "@") || !errors.As(err, &ue) {
			return "does not parse as a URL"
		}
		return "does not parse as a URL: " + ue.Err.Error()
	}
	switch p.Scheme {
	case "nats", "tls", "ws", "wss":
	default:
		return fmt.Sprintf("scheme %q, want nats, tls, ws or wss", p.Scheme)
	}
	if p.Hostname() == "" {
		return "no host"
	}
	if port := p.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("port %q, want 1..65535", port)
		}
	}
	return ""
}

// checkHostPort returns "" when a is host:port with a numeric port, else why
// not.
func checkHostPort(a string) string {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return "want host:port, e.g. 127.0.0.1:9464 or :9464"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > math.MaxUint16 {
		return fmt.Sprintf("port %q, want 0..65535", port)
	}
	return ""
}
