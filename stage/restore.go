package stage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/finding"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/streams"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// ErrKeyStateSubjects means the output stream has no subjects for the
// partitions' key-state records (changelog.KeyStateSubject: a moved
// window, a forget), which a restore reads back with the forwards; New
// refuses to start, naming the nats stream edit that adds them.
var ErrKeyStateSubjects = errors.New("the output stream has no subjects for the partitions' key-state records")

// restoreProgressEvery is how often a restore at start logs how far it is.
const restoreProgressEvery = 5 * time.Second

// restore brings every partition of one instance up to date from the
// output stream before any batch is judged, on the path a group's new
// owner of a partition takes (changelog.Apply): from each partition's
// cursor + 1 (the output sequence up to which its claims are committed),
// or, for a partition without one (a new, wiped or replaced data dir),
// from everything the output keeps of the last output retention, up to
// the last message on the pipeline's output subjects and key-state
// subjects. So a forward a crash left between publish and commit is a
// repeat however long the restart took, and a lost data dir forgets no key
// whose window is open, with its version, moved window, forget and
// contribution to a total (docs/state.md, "One recovery path").
func (src *singleSource) restore(ctx context.Context) error {
	s, cfg := src.s, src.cfg
	started := time.Now()
	info, err := changelog.StreamState(ctx, s.js, cfg.Output.Stream)
	if err != nil {
		return fmt.Errorf("restore from the output stream: %w", err)
	}
	if err := checkKeyStateSubjects(info.Config, cfg.Output.SubjectPrefix, s.store.Partitions()); err != nil {
		return err
	}
	subjects, err := src.readSubjects(ctx)
	if err != nil {
		return err
	}
	keyState := changelog.KeyStateSubjects(cfg.Output.SubjectPrefix)
	target, err := lastSeqOn(ctx, s.js, cfg.Output.Stream, append(slices.Clone(subjects), keyState))
	if err != nil {
		return err
	}
	targets, from, since, err := src.restoreTargets(ctx, info)
	if err != nil {
		return err
	}
	sp := changelog.Span{Stream: cfg.Output.Stream, Forwards: subjects, KeyState: keyState, From: from, Since: since, UpTo: target, SkipForeign: true}
	rt := &restoreRoute{prefix: cfg.Output.SubjectPrefix, parts: len(targets)}
	if cfg.Totals.Enabled {
		rt.bucket = cfg.Totals.Bucket.D()
	}
	progress := restoreProgress{s: s, next: time.Now().Add(restoreProgressEvery), sp: sp}
	st, err := changelog.Apply(ctx, s.js, sp, targets, changelog.ApplyOptions{Route: rt.route, Progress: progress.report})
	for p := range targets {
		s.status.setRestoring(p, 0, false)
	}
	if err != nil {
		return fmt.Errorf("restore from the output stream: %w", err)
	}
	s.metrics.StartRestored.Add(float64(st.Stored))
	s.log.Info("restored the partitions from the output stream after their cursors", "output_stream", cfg.Output.Stream,
		"from_seq", from, "since", since, "to_seq", target, "records_read", st.Records, "records_stored", st.Stored,
		"skipped_without_record", st.Skipped, "skipped_malformed_total", rt.badTotal, "readers_replaced", st.Reopens,
		"took", time.Since(started).Round(time.Millisecond))
	return nil
}

// restoreTargets returns every partition with its cursor, and where the
// restore reads from: the lowest cursor + 1, or, when a partition has no
// cursor into this output stream, since = the output server's time minus
// the output retention (from 0). A partition whose cursor is past the
// stream's last sequence is repaired first (changelog.CheckAhead,
// storeAhead), and restored from what the output was found to hold.
func (src *singleSource) restoreTargets(ctx context.Context, info *jetstream.StreamInfo) ([]changelog.Target, uint64, time.Time, error) {
	s, cfg := src.s, src.cfg
	targets := make([]changelog.Target, s.store.Partitions())
	from := uint64(0)
	fresh := false
	for i := range targets {
		p := s.store.Partition(i)
		a, ahead, err := changelog.CheckAhead(ctx, s.js, cfg.Output.Stream, p, info.State.LastSeq)
		if err != nil {
			return nil, 0, time.Time{}, fmt.Errorf("restore from the output stream: %w", err)
		}
		c := a.Cursor
		if ahead {
			s.storeAhead(a)
			c = a.Kept
		}
		targets[i] = changelog.Target{P: p, Cursor: c}
		switch {
		case c == 0:
			fresh = true
		case from == 0 || c+1 < from:
			from = c + 1
		}
	}
	if !fresh {
		return targets, from, time.Time{}, nil
	}
	now := info.TimeStamp
	if now.IsZero() {
		now = time.Now() // a server that does not say its time
	}
	since := now.Add(-cfg.OutputRetention(src.s.win.W))
	if first := info.State.FirstTime; info.State.Msgs > 0 && first.After(since) && info.State.FirstSeq > 1 {
		s.log.Warn("the output stream no longer holds everything a partition without a cursor restores from: keys whose forwards were removed before its first message are forwarded again",
			"output_stream", cfg.Output.Stream, "first_seq", info.State.FirstSeq, "first_time", first, "restore_since", since)
	}
	return targets, 0, since, nil
}

// restoreRoute routes a record read back to the partition its key's copies
// are judged in (intake.deliver): a forward by its group with totals on,
// by its key otherwise; a key-state record by its subject.
type restoreRoute struct {
	prefix   string // output.subject_prefix
	parts    int
	bucket   time.Duration // totals.bucket; 0: totals off, and a forward's contribution is not kept
	badTotal int
}

// route implements changelog.ApplyOptions.Route.
func (rt *restoreRoute) route(r *changelog.Record, subject string) int {
	if p, ok := changelog.KeyStatePartition(rt.prefix, subject); ok {
		if p < rt.parts {
			return p
		}
		return -1
	}
	key := r.Key
	switch g := r.Group; {
	case rt.bucket == 0:
		r.Group, r.Bucket, r.Value = "", time.Time{}, 0 // written with totals on, read with totals off
	case g == "" || len(g) > state.MaxGroupSize || !r.Bucket.Equal(state.BucketOf(r.Bucket, rt.bucket)):
		rt.badTotal++ // not restored; its input's copy, if it comes back, is judged and counted instead
		return -1
	default:
		key = []byte(g)
	}
	return state.PartitionOf(key, rt.parts)
}

// restoreProgress logs a restore's progress every restoreProgressEvery
// and tells the health status (/readyz) how far each partition is.
type restoreProgress struct {
	s    *Stage
	sp   changelog.Span
	next time.Time
}

// report implements changelog.ApplyOptions.Progress.
func (pr *restoreProgress) report(p, records int) {
	pr.s.status.setRestoring(p, records, true)
	if now := time.Now(); now.After(pr.next) {
		pr.next = now.Add(restoreProgressEvery)
		pr.s.log.Info("restoring the partitions from the output stream", "partition", p, "records", records, "to_seq", pr.sp.UpTo)
	}
}

// checkKeyStateSubjects checks that the output stream, as configured in
// oc, stores every partition's key-state subject; an output stream the
// stage creates does (config.Config.OutputStreamSubjects).
func checkKeyStateSubjects(oc jetstream.StreamConfig, prefix string, partitions int) error {
	for p := range partitions {
		sub := changelog.KeyStateSubject(prefix, p)
		if !slices.ContainsFunc(oc.Subjects, func(s string) bool { return server.SubjectMatchesFilter(sub, s) }) {
			control := changelog.ControlSubjects(prefix)
			fix := fmt.Sprintf("nats stream edit %s --subjects '%s' --force", oc.Name, strings.Join(append(slices.Clone(oc.Subjects), control), ","))
			return finding.WithFix(fmt.Errorf("%w: stream %s has subjects %v, none of which holds %s, partition %d's; add %s (fix: %s)",
				ErrKeyStateSubjects, oc.Name, oc.Subjects, sub, p, control, fix), fix)
		}
	}
	return nil
}

// readSubjects returns the output subjects of this pipeline's forwards:
// the consumer's filter subjects, else the input stream's subjects, under
// the output prefix (config.Output.Subject); else every output subject.
func (src *singleSource) readSubjects(ctx context.Context) ([]string, error) {
	cc := src.cons.CachedInfo().Config
	in := cc.FilterSubjects
	if cc.FilterSubject != "" {
		in = []string{cc.FilterSubject}
	}
	if len(in) == 0 {
		st, err := src.s.js.Stream(ctx, src.cfg.Input.Stream)
		if err != nil {
			return nil, fmt.Errorf("read back: input stream %s: %w", src.cfg.Input.Stream, err)
		}
		in = st.CachedInfo().Config.Subjects
	}
	if len(in) == 0 {
		return []string{src.cfg.Output.Subjects()}, nil
	}
	out := make([]string, len(in))
	for i, sub := range in {
		out[i] = src.cfg.Output.Subject(sub)
	}
	return out, nil
}

// lastSeqOn returns the highest sequence of a message on subjects
// (wildcards allowed) in stream, as the stream's leader stores it: 0 when
// none is. It asks the leader (forward.LastOnLeader), not any replica as a
// direct get may, which answers from what it has applied.
func lastSeqOn(ctx context.Context, js jetstream.JetStream, stream string, subjects []string) (uint64, error) {
	octx, cancel := context.WithTimeout(ctx, streams.SetUpTimeout)
	defer cancel()
	last, err := forward.LastSeqOn(octx, js, stream, subjects, streams.RequestTimeout, "read back")
	if err != nil {
		return 0, fmt.Errorf("read back output stream %s: %w", stream, err)
	}
	return last, nil
}

// storeAhead says that partition a.Partition's store was found ahead of
// the output stream, at start or at a takeover (changelog.CheckAhead): one
// log line and the counters dedupe_store_ahead_of_output_total and
// dedupe_store_ahead_dropped_records_total.
func (s *Stage) storeAhead(a changelog.Ahead) {
	label := strconv.Itoa(a.Partition)
	s.metrics.StoreAhead.WithLabelValues(label).Inc()
	s.metrics.StoreAheadDropped.WithLabelValues(label).Add(float64(a.Dropped))
	s.log.Error("the store is ahead of the output stream: the output no longer holds forwards it acknowledged (a server that lost writes it had not synced, or a stream made again); "+
		"their keys are dropped from the store and forwarded again when the input gives their copies again, and events whose inputs the server lost too are lost (docs/state.md, \"A server that lost acknowledged writes\")",
		"partition", a.Partition, "cursor", a.Cursor, "output_last_seq", a.LastSeq, "kept_up_to_seq", a.Kept,
		"records_dropped", a.Dropped, "output_rewritten", a.Rewritten)
}
