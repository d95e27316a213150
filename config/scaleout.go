package config

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// ScaleOut runs N instances of the stage on one input over a JetStream
// cluster, each owning whole partitions (docs/scale-out.md). Off by
// default: one instance, embedded or not, exactly as without this section.
type ScaleOut struct {
	// Enabled turns scale-out on. Default false. It needs an external
	// NATS server (nats.url), preferably a cluster.
	Enabled bool `yaml:"enabled"`
	// Group is the static consumer group's name; its members are
	// p0..p<N-1>, consumed through the durable consumers <group>-p<i>.
	// Default "dedupe".
	Group string `yaml:"group"`
	// Instance names this instance in logs and fence messages; unique among
	// live instances. Default "" means the host name.
	Instance string `yaml:"instance"`
	// Replicas of the streams the stage creates with scale-out on (input,
	// output and dead-letter). Default 3; 1..5. One replica loses the
	// output, which is the changelog new owners restore from, with its
	// node.
	Replicas int `yaml:"replicas"`
	// Route says when the route step runs (docs/scale-out.md §3.2):
	// RouteAuto (default) when the key is not a subject token the server
	// can hash (layout.Partitioning.Transform fails), RouteAlways, or
	// RouteNever.
	Route string `yaml:"route"`
	// RoutedStream is the work-queue stream the route step copies the
	// input into, one subject per partition. Default "DEDUPE_ROUTED".
	RoutedStream string `yaml:"routed_stream"`
	// RoutedSubject is the middle of the routed subjects,
	// <p>.<routed_subject>.<input subject>. Default "dedupe.routed".
	RoutedSubject string `yaml:"routed_subject"`
	// RouteBundleMax is how many copies of one partition's inputs the
	// route step puts in one routed message (a bundle) when one route
	// batch has several: one replicated write, delivery and ack for all
	// of them (docs/scale-out.md §3.2). Default 16; 0 or 1 routes every
	// copy alone; at most MaxRouteBundle. A member holds up to
	// input.max_ack_pending routed messages, so up to that many bundles.
	// Bundles are written only while every live instance says, in the
	// presence bucket, that it reads them; an instance that cannot read
	// one dead-letters it whole (not_routed).
	RouteBundleMax int `yaml:"route_bundle_max"`
	// MaxEventTimeAhead bounds how far an event's time (totals.time) may
	// be ahead of the clock when it is judged; an event further ahead is
	// dead-lettered (future_time). A new owner restores a partition's
	// open totals from the output stream back to now - (W + totals.bucket
	// + this + the redelivery margin), which holds every event counted in
	// an open bucket only if none ran further ahead. Used with totals and
	// totals.time only. Default 1h; 0 to 366d.
	MaxEventTimeAhead Duration `yaml:"max_event_time_ahead"`
	// SnapshotInterval is how often an instance writes a snapshot of each
	// partition it owns into the Object Store bucket
	// "<group>-snapshots", so that a new owner loads it and replays only
	// the changelog after it (docs/scale-out.md §3.3). Default 2m; 0 turns
	// snapshots off (a new owner reads the whole changelog back), else 1s
	// to 24h. With totals on no snapshot is written
	// (ScaleOutSnapshots).
	SnapshotInterval Duration `yaml:"snapshot_interval"`
	// Standbys is how many warm standbys each partition has
	// (docs/scale-out.md §4.4): the instances next after its owner in its
	// ranking tail its changelog from the output stream into their own
	// local store every 2s, so that the one that takes it over after its
	// owner died restores only the tail. Default 1; 0 turns them off; at
	// most MaxStandbys. A group of k instances has at most k-1.
	Standbys int `yaml:"standbys"`
}

// MaxStandbys is the largest scale_out.standbys.
const MaxStandbys = 4

// MaxRouteBundle is the largest scale_out.route_bundle_max.
const MaxRouteBundle = 256

// MaxSnapshotInterval is the longest scale_out.snapshot_interval.
const MaxSnapshotInterval = Duration(24 * time.Hour)

// MinSnapshotInterval is the shortest scale_out.snapshot_interval but 0.
const MinSnapshotInterval = Duration(time.Second)

// MaxEventTimeAheadLimit is the longest scale_out.max_event_time_ahead.
const MaxEventTimeAheadLimit = Duration(366 * 24 * time.Hour)

// Values of scale_out.route.
const (
	RouteAuto   = layout.RouteAuto
	RouteAlways = layout.RouteAlways
	RouteNever  = layout.RouteNever
)

// DefaultScaleOut returns the scale_out section's defaults (off).
func DefaultScaleOut() ScaleOut {
	return ScaleOut{Group: "dedupe", Replicas: 3, Route: RouteAuto, RoutedStream: "DEDUPE_ROUTED", RoutedSubject: "dedupe.routed",
		RouteBundleMax: 16, MaxEventTimeAhead: Duration(time.Hour), SnapshotInterval: Duration(2 * time.Minute), Standbys: 1}
}

// InstanceName returns Instance, or the host name when Instance is empty
// ("" when the host name is unknown too).
func (s ScaleOut) InstanceName() string {
	if s.Instance != "" {
		return s.Instance
	}
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return h
}

// MaxScaleOutReplicas is the most replicas JetStream allows a stream.
const MaxScaleOutReplicas = 5

// MinScaleOutAckWait is the shortest input.ack_wait scale-out accepts. The
// group's pin TTL is input.ack_wait and each pull request lasts
// max(ack_wait/2, 1s) (pcgroups derives both from it): below 2s a pin can
// expire between two pulls of a live owner, and partitions flap between
// instances.
const MinScaleOutAckWait = 2 * time.Second

// ScaleOutPartitioning returns what decides how a scale-out group's
// input is partitioned (layout.Partitioning): its Transform and whether
// the route step runs (Routed).
func (c Config) ScaleOutPartitioning() layout.Partitioning {
	field, name := c.PartitionField()
	return layout.Partitioning{Subjects: c.Input.Subjects, Field: field, FieldName: name, Partitions: c.State.Partitions, Route: c.ScaleOut.Route}
}

// PartitionField returns where the partition key is read from, and the
// name of its setting: the key (key), or with totals on the group
// (totals.group), so that every event of a group meets in one partition.
func (c Config) PartitionField() (field keys.FieldSpec, name string) {
	if c.Totals.Enabled {
		return c.Totals.Group, "totals.group"
	}
	return c.Key.Field, "key"
}

// OutputRetention is how long the output stream, the changelog a new owner
// restores from, must keep messages with scale-out on, given the window w:
// the terms named by OutputRetentionTerms, each explained in
// docs/scale-out.md §8.
func (c Config) OutputRetention(w time.Duration) time.Duration {
	r := w + c.MinDuplicateWindow()
	if c.Totals.Enabled {
		r += c.Totals.Bucket.D()
		if c.Totals.Time.Enabled() {
			r += c.ScaleOut.MaxEventTimeAhead.D()
		}
	}
	return r
}

// ScaleOutSnapshots returns how partitions are snapshotted with scale-out
// on (docs/scale-out.md §3.3), given the window w: the Object Store bucket
// "<group>-snapshots", how often an owner writes each partition it owns
// (scale_out.snapshot_interval), and how long the bucket keeps an object
// (OutputRetention(w): a snapshot older than that covers a sequence whose
// successors the changelog may no longer hold, so no restore uses it).
// every is 0 when no snapshot is written, and off says why: the setting
// is 0, or totals are on (a snapshot holds the keys, not the open totals
// a new owner restores with them).
func (c Config) ScaleOutSnapshots(w time.Duration) (bucket string, every, keep time.Duration, off string) {
	bucket, keep = layout.SnapshotBucket(c.ScaleOut.Group), c.OutputRetention(w)
	switch {
	case c.ScaleOut.SnapshotInterval == 0:
		return bucket, 0, keep, "scale_out.snapshot_interval is 0"
	case c.Totals.Enabled:
		return bucket, 0, keep, "totals are on, and a snapshot does not hold the open totals"
	}
	return bucket, c.ScaleOut.SnapshotInterval.D(), keep, ""
}

// OutputRetentionTerms names the terms of OutputRetention, for messages.
func (c Config) OutputRetentionTerms() string {
	terms := "W + input.ack_wait + output.restart_margin"
	if c.Totals.Enabled {
		terms += " + totals.bucket"
		if c.Totals.Time.Enabled() {
			terms += " + scale_out.max_event_time_ahead"
		}
	}
	return terms
}

// validateScaleOut checks the scale_out section and what scale-out needs
// of the others (docs/scale-out.md §8).
func (c Config) validateScaleOut(v *validator) {
	s := c.ScaleOut
	if !s.Enabled {
		return
	}
	checkName(v, "scale_out.group", s.Group)
	if name := s.InstanceName(); name == "" {
		v.add("scale_out.instance", "empty and the host name is unknown; set a name unique among the live instances")
	} else if !validInstanceName(name) {
		v.add("scale_out.instance", "%q: want letters, digits and - _ = . only (it is a key in the presence bucket), not starting or ending with '.'", name)
	}
	if s.Replicas < 1 || s.Replicas > MaxScaleOutReplicas {
		v.add("scale_out.replicas", "%d, want 1..%d", s.Replicas, MaxScaleOutReplicas)
	}
	if c.Input.AckWait.D() < MinScaleOutAckWait {
		v.add("input.ack_wait", "%v with scale_out.enabled, want at least %v: it is the pin's TTL, and a live owner pulls every max(ack_wait/2, 1s), so a shorter one lets a pin expire between two pulls",
			c.Input.AckWait, Duration(MinScaleOutAckWait))
	}
	if c.NATS.IsEmbedded() {
		v.add("scale_out.enabled", "true with the embedded server (nats.url empty); scale-out needs a JetStream shared by every instance, preferably a cluster: set nats.url")
	}
	if c.Output.Publish == PublishAsync {
		v.add("output.publish", "%q with scale_out.enabled; scale-out publishes every output batch as one atomic batch checked against its partition's fence: use atomic or auto", c.Output.Publish)
	}
	if c.Output.BatchMax < c.Pipeline.BatchSize {
		v.add("output.batch_max", "%d, below pipeline.batch_size %d; with scale_out.enabled a partition's output batch is one atomic batch, so it must fit", c.Output.BatchMax, c.Pipeline.BatchSize)
	}
	if s.RouteBundleMax < 0 || s.RouteBundleMax > MaxRouteBundle {
		v.add("scale_out.route_bundle_max", "%d, want 0 (every copy alone) to %d", s.RouteBundleMax, MaxRouteBundle)
	}
	if si := s.SnapshotInterval; si != 0 && (si < MinSnapshotInterval || si > MaxSnapshotInterval) {
		v.add("scale_out.snapshot_interval", "%v, want 0 (off) or %v to %v", si, MinSnapshotInterval, MaxSnapshotInterval)
	}
	if s.Standbys < 0 || s.Standbys > MaxStandbys {
		v.add("scale_out.standbys", "%d, want 0 (no warm standbys: a new owner restores from the snapshot and the changelog) to %d", s.Standbys, MaxStandbys)
	}
	if s.MaxEventTimeAhead < 0 || s.MaxEventTimeAhead > MaxEventTimeAheadLimit {
		v.add("scale_out.max_event_time_ahead", "%v, want 0 to %v", s.MaxEventTimeAhead, MaxEventTimeAheadLimit)
	}
	if c.Input.FilterSubject != "" {
		v.add("input.filter_subject", "%q with scale_out.enabled; each partition's consumer filters on its partition token, so the input cannot be filtered too", c.Input.FilterSubject)
	}
	if w, err := c.Window.Derive(); err == nil && c.Output.Limits.MaxAge > 0 && c.Output.Limits.MaxAge.D() < c.OutputRetention(w.W) {
		v.add("output.max_age", "%v with scale_out.enabled, want 0 (computed) or at least %s = %v: the output stream is the changelog a new owner restores from",
			c.Output.Limits.MaxAge, c.OutputRetentionTerms(), Duration(c.OutputRetention(w.W)))
	}
	if c.Output.Limits.MaxBytes > 0 {
		v.add("output.max_bytes", "%v with scale_out.enabled, want 0: a full output stream would drop records inside the window that a new owner restores from", c.Output.Limits.MaxBytes)
	}
	c.validateScaleOutRoute(v)
}

// validInstanceName reports whether name can be a key in the presence
// bucket: letters, digits and - _ = . only, not starting or ending with '.'.
func validInstanceName(name string) bool {
	return !strings.ContainsFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_=.", r))
	}) && !strings.HasPrefix(name, ".") && !strings.HasSuffix(name, ".")
}

// validateScaleOutRoute checks scale_out.route and, when keys are routed,
// the routed stream and subject.
func (c Config) validateScaleOutRoute(v *validator) {
	s := c.ScaleOut
	switch s.Route {
	case RouteAuto, RouteAlways:
	case RouteNever:
		if _, _, err := c.ScaleOutPartitioning().Transform(); err != nil {
			_, field := c.PartitionField()
			if len(c.Input.Subjects) != 1 {
				field = "input.subjects"
			}
			v.add(field, "%v; or set scale_out.route to auto, which routes such keys", err)
		}
	default:
		v.add("scale_out.route", "%q, want auto, always or never", s.Route)
	}
	if routed, _ := c.ScaleOutPartitioning().Routed(); routed {
		checkName(v, "scale_out.routed_stream", s.RoutedStream)
		if s.RoutedStream == c.Input.Stream || s.RoutedStream == c.Output.Stream || s.RoutedStream == c.DeadLetter.Stream {
			v.add("scale_out.routed_stream", "%q is also the input, output or dead-letter stream", s.RoutedStream)
		}
		if msg := checkSubject(s.RoutedSubject, false); msg != "" {
			v.add("scale_out.routed_subject", "%q: %s", s.RoutedSubject, msg)
		}
	}
}

// PartitionBatch is the most messages a partition judges together: one
// state commit, one round of acks and one output publish. Without
// scale-out it is pipeline.batch_size. With scale-out a partition has one
// fenced atomic batch in flight at a time (a replicated stream refuses a
// second proposal that checks the same fence, 10164), so its throughput is
// its batch over that batch's round trip: the batch takes whatever arrived
// during the last one, up to output.batch_max (at least
// pipeline.batch_size, as Validate requires). At low load a batch is as
// small as before: it waits only pipeline.batch_linger.
func (c Config) PartitionBatch() int {
	if c.ScaleOut.Enabled {
		return max(c.Output.BatchMax, c.Pipeline.BatchSize)
	}
	return c.Pipeline.BatchSize
}

// evenInstanceCounts lists the instance counts that own p partitions
// equally: p's divisors.
func evenInstanceCounts(p int) string {
	var out []string
	for k := 1; k <= p; k++ {
		if p%k == 0 {
			out = append(out, strconv.Itoa(k))
		}
	}
	return strings.Join(out, ", ")
}

// scaleOutSummary describes the scale_out section for Summary: the
// group, this instance, the input's transform and the hand-over time
// after a crash. The stage prints the fence and output subjects it
// derives (stage.ScaleOutPlan).
func (c Config) scaleOutSummary() []string {
	s := c.ScaleOut
	if !s.Enabled {
		return []string{"off (one instance)"}
	}
	out := []string{
		fmt.Sprintf("instance %q in static consumer group %q: members %s..%s (consumers %s-%s..), one per partition; every instance consumes for every member, the server's pin picks the owner",
			s.InstanceName(), s.Group, layout.Member(0), layout.Member(c.State.Partitions-1), s.Group, layout.Member(0)),
		fmt.Sprintf("at most %d instances do work (one per partition, state.partitions); more stand by, and take partitions only when an owner leaves", c.State.Partitions),
		fmt.Sprintf("instance counts that share the %d partitions evenly: %s; with any other count the busiest instance, one partition more than others, bounds the group", c.State.Partitions, evenInstanceCounts(c.State.Partitions)),
		fmt.Sprintf("hand-over after a crash ≈ input.ack_wait %v (the pin's TTL) + the fence write + the restore; after a clean stop, one round trip (the stop unpins)", c.Input.AckWait),
	}
	pt := c.ScaleOutPartitioning()
	if routed, why := pt.Routed(); routed {
		out = append(out, fmt.Sprintf("route step on: %s; every instance routes the input through the shared consumer %s-route into stream %s, subjects <p>.%s.<input subject>",
			why, s.Group, s.RoutedStream, s.RoutedSubject))
	} else if src, dest, err := pt.Transform(); err != nil {
		out = append(out, "input transform: invalid: "+err.Error())
	} else {
		out = append(out, fmt.Sprintf("input stream transform %s -> %s (nats-server's FNV-1a 32-bit partition of the key token)", src, dest))
	}
	out = append(out, fmt.Sprintf("a partition judges up to %d messages together (output.batch_max): one fenced batch in flight per partition, so a batch grows with what arrives during the last one's round trip",
		c.PartitionBatch()))
	out = append(out, fmt.Sprintf("streams created with %d replicas", s.Replicas))
	if w, err := c.Window.Derive(); err == nil {
		bucket, every, keep, off := c.ScaleOutSnapshots(w.W)
		if every == 0 {
			out = append(out, "partition snapshots off ("+off+"): a new owner reads the partition's whole changelog back")
		} else {
			out = append(out, fmt.Sprintf("partition snapshots every %v into object store %s (as many replicas as the output stream, objects kept %v); a new owner loads the newest and replays only the changelog after it",
				Duration(every), bucket, Duration(keep)))
		}
	}
	return out
}

// OutputStreamSubjects returns the subjects of the output stream: the
// forwarded messages (Output.Subjects), and the changelog's control
// records beside them on a root of their own (changelog.ControlSubjects:
// "_dedupe.<prefix>.>": the partitions' key-state records, and with
// scale-out their fences), so that a consumer of the output prefix
// receives forwarded messages only.
func (c Config) OutputStreamSubjects() []string {
	return []string{c.Output.Subjects(), changelog.ControlSubjects(c.Output.SubjectPrefix)}
}

// DeadLetterStreamSubjects returns the subjects of the dead-letter stream:
// the dead letters (DeadLetter.Subjects), and with scale-out the fences
// that keep a former owner from dead-lettering an input its partition's
// new owner decides ("_dedupe.<dead_letter.subject>.>").
func (c Config) DeadLetterStreamSubjects() []string {
	subjects := []string{c.DeadLetter.Subjects()}
	if c.ScaleOut.Enabled {
		subjects = append(subjects, changelog.ControlSubjects(c.DeadLetter.Subject))
	}
	return subjects
}
