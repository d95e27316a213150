package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/dedupe-stage/dedupe-stage/bloom"
	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/redact"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// Summary describes the configuration in words for `dedupe-stage
// check-config`: how the window was derived, the key, partitions, the
// filter's sizing, memory, durability and its risks, the NATS target and the
// streams. It never prints secrets. It works on invalid configurations too,
// marking what cannot be computed.
func (c Config) Summary() string {
	var b strings.Builder
	line := func(label, format string, args ...any) {
		fmt.Fprintf(&b, "%-12s %s\n", label+":", fmt.Sprintf(format, args...))
	}
	more := func(format string, args ...any) {
		fmt.Fprintf(&b, "%-12s %s\n", "", fmt.Sprintf(format, args...))
	}

	if w, err := c.Window.Derive(); err != nil {
		line("window", "invalid: %v", err)
	} else {
		line("window", "W %v", w)
		more("repeats caught after %v (near_fraction %v of W) count as near the end of the window", Duration(time.Duration(w.NearFraction*float64(w.W))), w.NearFraction)
		if c.Window.RefreshOnRepeat {
			more("sliding (refresh_on_repeat): each repeat moves its key's window end to the repeat's time + W")
			if c.ScaleOut.Enabled {
				more("with scale-out each refreshed repeat also writes a key-state record to the output stream, under %s", changelog.ControlSubjects(c.Output.SubjectPrefix))
			}
		}
	}
	line("key", "%v", c.Key)

	line("partitions", "%d", c.State.Partitions)

	filterTotal := c.filterSummary(line, more)
	c.memorySummary(line, more, filterTotal)
	c.durabilitySummary(line, more)
	c.natsSummary(line)
	c.streamsSummary(line, more)
	c.runSummary(line)
	for i, s := range c.scaleOutSummary() {
		if i == 0 {
			line("scale-out", "%s", s)
		} else {
			more("%s", s)
		}
	}
	for i, s := range c.totalsSummary() {
		if i == 0 {
			line("totals", "%s", s)
		} else {
			more("%s", s)
		}
	}
	return c.Redactor().String(b.String())
}

// filterSummary describes the filter's sizing and returns the memory it
// takes, 0 when it is disabled or its sizing is invalid.
func (c Config) filterSummary(line func(label, format string, args ...any), more func(format string, args ...any)) uint64 {
	f := c.Filter
	if sz, err := c.filterSizing(); err != nil {
		line("filter", "invalid sizing (expected_keys %d, false_positive_rate %v, generations %d): %v", f.ExpectedKeys, f.FalsePositiveRate, f.Generations, err)
	} else {
		state := "enabled"
		if !f.Enabled {
			state = "DISABLED (every message reads the store); sizing if enabled"
		}
		parts := c.State.Partitions
		total := filterBytes(sz, parts)
		line("filter", "%s: %d keys per window, target false-positive rate %v, %d+1 generations of %d keys",
			state, f.ExpectedKeys, f.FalsePositiveRate, f.Generations, uint64(sz.KeysPerGeneration)*uint64(parts))
		more("each of %d partitions: %d+1 generations of %d keys, p=%.3g, m=%d bits, k=%d hash functions, %.2f bits per key, %s",
			parts, f.Generations, sz.KeysPerGeneration, sz.FalsePositiveRatePerGeneration, sz.BitsPerGeneration, sz.Hashes,
			float64(sz.BitsPerGeneration)/float64(sz.KeysPerGeneration), humanBytes(sz.MemoryBytes))
		more("total %s (%.2f bits per expected key), split across %d partitions",
			humanBytes(total), float64(total)*8/float64(f.ExpectedKeys), parts)
		if f.Enabled {
			return total
		}
	}
	return 0
}

// memorySummary describes the state's memory budget beside the filter's
// filterTotal bytes, and what Badger adds while it writes.
func (c Config) memorySummary(line func(label, format string, args ...any), more func(format string, args ...any), filterTotal uint64) {
	sz := c.StateOptions(window.Window{}).BadgerSizing()
	line("memory", "state.memory_budget %v (one Badger instance for the %d partitions) + filter %s + table builders %s while writing = %s",
		c.State.MemoryBudget, c.State.Partitions, humanBytes(filterTotal), humanBytes(uint64(sz.BuilderPool)),
		humanBytes(c.memoryBytes(filterTotal)))
	if c.State.Partitions > 0 {
		more("badger %s", sz)
		more("table builders: %s", sz.BuildersNote())
	}
}

// natsSummary describes the NATS server the stage connects to.
func (c Config) natsSummary(line func(label, format string, args ...any)) {
	if c.NATS.IsEmbedded() {
		e := c.NATS.Embedded
		port := strconv.Itoa(e.Port)
		if e.Port == -1 {
			port = "<free port>"
		}
		line("nats", "embedded nats-server on %s, JetStream store %s", net.JoinHostPort(e.Host, port), c.EmbeddedStoreDir())
	} else {
		js := ""
		switch n := c.NATS; {
		case n.JetStreamDomain != "":
			js = ", JetStream domain " + n.JetStreamDomain
		case n.JetStreamAPIPrefix != "":
			js = ", JetStream API prefix " + n.JetStreamAPIPrefix
		}
		line("nats", "server %s (%s)%s", redact.NATSURL(c.NATS.URL), c.authSummary(), js)
	}
}

// streamsSummary describes the input, output and dead-letter streams and
// whether they are created.
func (c Config) streamsSummary(line func(label, format string, args ...any), more func(format string, args ...any)) {
	in, out, dl := c.Input, c.Output, c.DeadLetter
	create := c.NATS.ShouldCreateStreams()
	filter := ""
	if in.FilterSubject != "" {
		filter = ", filter " + in.FilterSubject
	}
	maxDeliver := "unlimited"
	if in.MaxDeliver != -1 {
		maxDeliver = strconv.Itoa(in.MaxDeliver)
	}
	line("input", "stream %s (subjects %s), consumer %s%s, ack_wait %v, max_ack_pending %d, max_deliver %s",
		in.Stream, strings.Join(in.Subjects, " "), in.Consumer, filter, in.AckWait, in.MaxAckPending, maxDeliver)
	dup := fmt.Sprintf("duplicate window %v", out.DuplicateWindow)
	if out.DuplicateWindow == 0 {
		dup = fmt.Sprintf("duplicate window %v (computed)", Duration(c.OutputDuplicateWindow()))
	}
	if !create {
		dup += " if created"
	}
	onShort := "refuses to start"
	if out.AllowShortDuplicateWindow {
		onShort = "only warns"
	}
	line("output", "stream %s (subjects %s), %s", out.Stream, strings.Join(c.OutputStreamSubjects(), ", "), dup)
	more("a crash needs a duplicate window >= %v (ack_wait + restart_margin); with a shorter one the stage %s",
		Duration(c.MinDuplicateWindow()), onShort)
	more("%s", c.publishSummary())
	line("dead letter", "stream %s (subjects %s, e.g. %s)", dl.Stream, strings.Join(c.DeadLetterStreamSubjects(), ", "), dl.SubjectFor("no_key"))
	if create {
		more("missing streams and the consumer are created")
	} else {
		more("streams and the consumer must exist (nats.create_streams is false)")
	}
}

// runSummary describes the pipeline, the HTTP endpoints and the log.
func (c Config) runSummary(line func(label, format string, args ...any)) {
	p := c.Pipeline
	line("pipeline", "batch %d, linger %v, %d publishes in flight, max message %v, fingerprint mismatch: %s",
		p.BatchSize, p.BatchLinger, p.MaxPublishInFlight, p.MaxMessageBytes, p.OnFingerprintMismatch)
	switch h := c.HTTP; {
	case h.Addr == "" && h.InspectOn() == "":
		line("http", "disabled")
	case h.InspectOn() == h.Addr:
		line("http", "%s (/metrics /healthz /readyz /inspect)", h.Addr)
	case h.Addr == "":
		line("http", "/inspect on %s; /metrics /healthz /readyz disabled", h.InspectOn())
	case h.InspectOn() == "":
		line("http", "%s (/metrics /healthz /readyz; /inspect off)", h.Addr)
	default:
		line("http", "%s (/metrics /healthz /readyz), /inspect on %s", h.Addr, h.InspectOn())
	}
	line("log", "%s, %s", c.Log.Level, c.Log.Format)
}

// filterSizing is the sizing of each partition's filter, from the state
// options `run` opens the store with.
func (c Config) filterSizing() (bloom.Sizing, error) {
	if c.State.Partitions < 1 || c.State.Partitions > MaxPartitions {
		return bloom.Sizing{}, fmt.Errorf("state.partitions %d, want 1..%d", c.State.Partitions, MaxPartitions)
	}
	w, err := c.Window.Derive()
	if err != nil {
		return bloom.Sizing{}, fmt.Errorf("needs a valid window: %w", err)
	}
	return c.StateOptions(w).FilterSizing()
}

// authSummary names the authentication configured, without secrets.
func (c Config) authSummary() string {
	n := c.NATS
	var parts []string
	switch {
	case n.CredsFile != "":
		parts = append(parts, "creds file "+n.CredsFile)
	case n.NKeySeedFile != "":
		parts = append(parts, "nkey seed file "+n.NKeySeedFile)
	case n.Token != "":
		parts = append(parts, "token")
	case n.User != "":
		parts = append(parts, "user "+n.User)
	case strings.Contains(redact.NATSURL(n.URL), redact.Mask):
		parts = append(parts, "credentials in nats.url")
	default:
		parts = append(parts, "no authentication")
	}
	switch t := n.TLS; {
	case t.HandshakeFirst:
		parts = append(parts, "TLS, handshake first")
	case t.CAFile != "" || t.CertFile != "":
		parts = append(parts, "TLS")
	}
	return strings.Join(parts, ", ")
}

// humanBytes formats n in binary units with two decimals, e.g. "1.55 MiB".
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		v /= unit
		if v < unit {
			return fmt.Sprintf("%.2f %s", v, u)
		}
	}
	return fmt.Sprintf("%.2f PiB", v/unit)
}

// durabilitySummary says what the state's and the server's syncs
// guarantee together (Config.StateSyncWrites).
func (c Config) durabilitySummary(line func(label, format string, args ...any), more func(format string, args ...any)) {
	sync := c.StateSyncWrites()
	how := "set"
	if c.State.SyncWrites == nil {
		how = "as the embedded server syncs"
		if !c.NATS.IsEmbedded() {
			how = "the default with an external server"
		}
	}
	if sync {
		line("durability", "state.sync_writes=true (%s): each commit of keys is fsynced before the input is acknowledged", how)
	} else {
		line("durability", "state.sync_writes=false (%s): a process crash (kill -9) forgets nothing, the kernel holds the writes; a power failure or kernel crash can forget recently recorded keys, whose later copies are forwarded again", how)
	}
	if !c.NATS.IsEmbedded() {
		more("JetStream durability is the external server's (its sync_interval setting)")
		if !sync {
			more("RISK unless the server does not fsync every write either: then both forget the same recent writes together")
		}
		return
	}
	switch serverSync := c.NATS.Embedded.SyncAlways; {
	case serverSync && sync:
		more("nats.embedded.sync_always=true: JetStream fsyncs every message before acknowledging it; nothing acknowledged is lost or forwarded twice, even on a power failure")
	case serverSync:
		more("nats.embedded.sync_always=true: RISK: the streams keep every acknowledged message through a power failure, the state may not: keys it forgot are forwarded again")
	case sync:
		more("nats.embedded.sync_always=false: RISK: JetStream flushes every 2 minutes; a power failure can lose forwarded messages whose keys the state kept, and their redelivered inputs are then judged repeats: events lost (leave state.sync_writes unset to follow the server)")
	default:
		more("nats.embedded.sync_always=false: RISK: JetStream flushes every 2 minutes; a power failure can lose acknowledged input, output and dead-letter messages, and the state forgets the same recent writes, so nothing is judged a repeat of a lost forward")
	}
}

// smallBatches says which batches go one message at a time although the
// output is atomic (Output.AtomicMinBatch).
func smallBatches(out Output) string {
	if out.AtomicMinBatch <= 1 {
		return ""
	}
	return fmt.Sprintf(" (a batch of fewer than %d messages goes one message at a time, all in flight together: output.atomic_min_batch)", out.AtomicMinBatch)
}

// publishSummary says how the output is published (see PublishAtomic).
func (c Config) publishSummary() string {
	out := c.Output
	atomic := fmt.Sprintf("atomic batches of up to %d messages, at most %d open at once", out.BatchMax, out.MaxBatchesInFlight)
	switch {
	case c.ScaleOut.Enabled && out.Publish != PublishAsync:
		return "output.publish " + out.Publish + " with scale-out: " + atomic + ", each checked against its partition's fence; the stage refuses to start if the stream does not allow atomic publish"
	case out.Publish == PublishAtomic:
		return "output.publish atomic: " + atomic + smallBatches(out) + "; the stage refuses to start if the stream does not allow atomic publish"
	case out.Publish == PublishAsync:
		return "output.publish async: one asynchronous publish per message"
	case c.KnownToSyncEveryWrite():
		return "output.publish auto: " + atomic + smallBatches(c.Output) + " when the stream allows atomic publish, else one publish per message"
	}
	return "output.publish auto: one asynchronous publish per message (atomic needs the embedded server with sync_always, or output.publish atomic)"
}
