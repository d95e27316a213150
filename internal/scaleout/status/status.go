// Package status reads how a stage, or a scale-out group of them, stands,
// from the cluster alone: it asks the servers, never an instance, so it
// answers while every instance is down (`dedupe-stage status`).
//
// For a group it reads, per partition p: the member consumer
// "<group>-p<p>" (its pending and ack-pending messages, and the client its
// priority group pins), the partition's last fence message in the output
// stream (its sequence, when it was stored, and the instance that wrote
// it), and the age of the object "p<p>" in the Object Store bucket
// "<group>-snapshots" when that bucket exists, and the last takeover each
// owner recorded in "<group>-handovers"; for the group, the live
// instances in the presence bucket and, with the route step, the route
// consumer's pending. For a single instance it reads its consumer.
//
// A partition has an owner when its consumer pins a client. The pin is the
// server's; the instance behind it is the one named by the partition's
// fence, when the fence was written after the pin (an owner takes the
// fence on its first batch): otherwise the owner is shown as unconfirmed.
//
// A partition without an owner is idle when nothing of its input is
// pending or in flight: that is a healthy group with no input for it (a
// partition released for balance gets its next owner with its next
// message). When input waits, it has waited since the later of when its
// oldest unacknowledged message was stored and the consumer's last
// delivery or acknowledgement (the last owner's last work); the partition
// is stalled once that is longer than its hand-over time (HandOverTime),
// and only a stalled partition, or a route step whose input waits as long
// with no live instance, makes the report critical.
//
// Use:
//
//	r, err := status.Read(ctx, js, target, time.Now()) // target: stage.StatusTarget(cfg)
//	r.WriteTable(os.Stdout)
//	if err := r.Check(); err != nil { ... } // ErrStalled: input waits without an owner
package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/pcgroups"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/route"
	"github.com/dedupe-stage/dedupe-stage/internal/streams"
)

// ErrStalled is returned by Report.Check when input of a group has waited
// without an owner for longer than the hand-over time: a partition's, or
// the route step's with no live instance; or when a single instance's
// input has waited as long with no consumer activity. No instance takes it
// on its own any more; start one, or find why the live ones refuse it.
var ErrStalled = errors.New("input waits without an owner for longer than the hand-over time")

// ErrGroupMismatch is returned by Report.Check when the group's consumer
// group has another partition count than the configuration: the report
// reads partitions the group does not have, or misses some, so it cannot
// tell the group's health. Read status with the group's configuration.
var ErrGroupMismatch = errors.New("the configuration does not describe the group")

// States of a partition (Partition.State) and of the route step
// (Report.RouteState).
const (
	// StateOwned: a client is pinned to the partition (for the route
	// step: an instance is live to run it).
	StateOwned = "owned"
	// StateIdle: no owner, and none of its input is pending or in
	// flight; nothing waits for one.
	StateIdle = "idle"
	// StateWaiting: no owner, and input has waited for one for no longer
	// than the hand-over time, as during a hand-over after a crash.
	StateWaiting = "waiting"
	// StateStalled: no owner, and input has waited for one for longer
	// than the hand-over time.
	StateStalled = "stalled"
)

// Health values of a Report (Report.Health).
const (
	// HealthOK: no input has waited without an owner for longer than
	// the hand-over time.
	HealthOK = "ok"
	// HealthCritical: some has (Check returns ErrStalled).
	HealthCritical = "critical"
	// HealthUnknown: the configuration's partition count is not the
	// group's (Check returns ErrGroupMismatch).
	HealthUnknown = "unknown"
)

// Target is what Read reads: the stage, or the group, a configuration
// describes, in the values Read needs (stage.StatusTarget fills it from the
// configuration), so that this package reads no configuration itself.
type Target struct {
	// ScaleOut says whether the stage runs as a scale-out group.
	ScaleOut bool
	// InputStream is the input stream; Consumer a single instance's
	// durable consumer on it.
	InputStream, Consumer string
	// InputSubjects are input.subjects, FilterSubject the consumer's
	// input.filter_subject: what a single instance's consumer reads.
	InputSubjects []string
	FilterSubject string
	// Group is the scale-out group's name (scale_out.group), Partitions
	// its partition count (state.partitions).
	Group      string
	Partitions int
	// Routed says whether the route step partitions the input; the
	// members then consume RoutedStream.
	Routed       bool
	RoutedStream string
	// OutputStream and OutputPrefix are the output stream and its subject
	// prefix, which name the partitions' fences.
	OutputStream, OutputPrefix string
	// AckWait is input.ack_wait, RestartMargin output.restart_margin.
	AckWait, RestartMargin time.Duration
}

// HandOverTime is how long a partition's input may wait without an owner
// during a hand-over after a crash: input.ack_wait (the pin's TTL) plus
// the restore, taken as the longer of output.restart_margin (how long a
// crash and restart may take) and the partition's last recorded takeover
// (fence and restore; last may be nil). This is the one place it is
// computed.
func HandOverTime(t Target, last *changelog.HandOver) time.Duration {
	restore := t.RestartMargin
	if last != nil {
		restore = max(restore, time.Duration(last.RestoreSeconds*float64(time.Second)))
	}
	return t.AckWait + restore
}

// Waiting is input that waits for an owner.
type Waiting struct {
	// Since is when it began to wait: the later of when its oldest
	// unacknowledged message was stored and the consumer's last delivery
	// or acknowledgement.
	Since time.Time `json:"since"`
	// For is how long it has waited, until Report.At.
	For Duration `json:"for"`
	// HandOverTime is how long it may wait before the report is critical
	// (status.HandOverTime).
	HandOverTime Duration `json:"hand_over_time"`
}

// Stalled reports whether w has waited longer than its hand-over time.
func (w *Waiting) Stalled() bool { return w != nil && w.For > w.HandOverTime }

// pinGroup is the priority group pcgroups gives every member consumer
// (orbit.go pcgroups' priorityGroupName).
const pinGroup = "PCG"

// Consumer is a consumer's backlog.
type Consumer struct {
	// Stream and Name name the consumer.
	Stream string `json:"stream"`
	Name   string `json:"name"`
	// Exists is false when the consumer is not on the stream (never
	// created, or deleted); the counts are then zero.
	Exists bool `json:"exists"`
	// Pending is how many messages of the stream the consumer has not
	// delivered yet.
	Pending uint64 `json:"pending"`
	// AckPending is how many it delivered that are not acked yet.
	AckPending int `json:"ack_pending"`
}

// Partition is how one partition of a group stands.
type Partition struct {
	// Partition is its number.
	Partition int `json:"partition"`
	// Consumer is its member consumer.
	Consumer Consumer `json:"consumer"`
	// PinID is the pinned client's id, "" when no client is pinned: the
	// partition has no owner.
	PinID string `json:"pin_id"`
	// PinnedAt is when the server pinned it; nil without a pin.
	PinnedAt *time.Time `json:"pinned_at,omitempty"`
	// Owner is the instance behind the pin: the fence's writer. "" without
	// a pin.
	Owner string `json:"owner"`
	// State is StateOwned, StateIdle, StateWaiting or StateStalled.
	State string `json:"state"`
	// LastOwner is the instance that held the partition last, the fence's
	// writer, whether or not it still does; "" when it has no fence.
	LastOwner string `json:"last_owner,omitempty"`
	// Waiting is the input waiting for an owner, nil unless State is
	// StateWaiting or StateStalled.
	Waiting *Waiting `json:"waiting,omitempty"`
	// OwnerConfirmed is true when the fence was stored after the pin, so
	// the pinned client took it; false when the pinned client has not taken
	// the fence yet (no batch since it was pinned) and Owner is the last
	// writer's name.
	OwnerConfirmed bool `json:"owner_confirmed"`
	// FenceSeq is the sequence of the partition's last fence message in the
	// output stream, 0 when it has none.
	FenceSeq uint64 `json:"fence_seq"`
	// FenceAt is when the server stored it; nil without a fence.
	FenceAt *time.Time `json:"fence_at,omitempty"`
	// FenceInstance is the instance that wrote it.
	FenceInstance string `json:"fence_instance,omitempty"`
	// SnapshotAge is how old the partition's newest snapshot is, nil when
	// the group keeps no snapshots or has none of this partition.
	SnapshotAge *Duration `json:"snapshot_age,omitempty"`
	// LastHandOver is the partition's last takeover as its owner recorded
	// it (who, when, the restore's path, records and seconds); nil when
	// none was recorded.
	LastHandOver *changelog.HandOver `json:"last_handover,omitempty"`
}

// Duration is a time.Duration written as a Go duration string in JSON.
type Duration time.Duration

// MarshalText writes d as "1m30s".
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// Report is how a stage or group stands, as Read found it.
type Report struct {
	// At is when it was read.
	At time.Time `json:"at"`
	// Mode is "scale-out" or "single".
	Mode string `json:"mode"`
	// Group is the scale-out group, "" for a single instance.
	Group string `json:"group,omitempty"`
	// GroupProblem is "" when the static consumer group's record matches
	// the configuration; otherwise what is wrong with it (not created yet,
	// or another partition count).
	GroupProblem string `json:"group_problem,omitempty"`
	// GroupMismatch is true when the record has another partition count
	// than the configuration.
	GroupMismatch bool `json:"group_mismatch,omitempty"`
	// Instances are the live instances in the group's presence bucket.
	Instances []string `json:"instances,omitempty"`
	// Partitions are the group's partitions, in order.
	Partitions []Partition `json:"partitions,omitempty"`
	// Route is the route step's consumer on the input, nil when the group
	// is not routed.
	Route *Consumer `json:"route,omitempty"`
	// Single is a single instance's consumer on the input.
	Single *Consumer `json:"consumer,omitempty"`
	// State is a single instance's state, judged as a partition's:
	// StateOwned while a client pulls from its consumer (the stage runs),
	// else StateIdle, StateWaiting or StateStalled by its unacknowledged
	// input and the consumer's last activity. "" for a group.
	State string `json:"state,omitempty"`
	// Waiting is a single instance's input waiting with no consumer
	// activity, nil unless State is StateWaiting or StateStalled.
	Waiting *Waiting `json:"waiting,omitempty"`
	// Snapshots is the Object Store bucket read for snapshot ages, "" when
	// it does not exist.
	Snapshots string `json:"snapshots_bucket,omitempty"`
	// Ownerless lists the partitions without an owner, idle or not.
	Ownerless []int `json:"ownerless"`
	// Stalled lists the partitions in StateStalled.
	Stalled []int `json:"stalled"`
	// RouteState is the route step's state, "" when the group is not
	// routed: StateOwned while an instance is live to run it, else as a
	// partition's, by the input its consumer has not acknowledged.
	RouteState string `json:"route_state,omitempty"`
	// RouteWaiting is the input waiting for the route step with no live
	// instance, nil unless RouteState is StateWaiting or StateStalled.
	RouteWaiting *Waiting `json:"route_waiting,omitempty"`
	// Health is HealthCritical when a partition is stalled, or RouteState
	// or a single instance's State is, HealthOK otherwise (Check).
	Health string `json:"health"`
}

// Read reads how the stage or group t describes stands, from the
// cluster js is connected to; now dates the ages. A stream or consumer
// that is missing is reported as such, not as an error; an error is a
// request the cluster did not answer.
func Read(ctx context.Context, js jetstream.JetStream, t Target, now time.Time) (Report, error) {
	r := Report{At: now, Mode: "single", Ownerless: []int{}, Stalled: []int{}, Health: HealthOK}
	if !t.ScaleOut {
		if err := readSingle(ctx, js, t, &r); err != nil {
			return r, err
		}
		if r.State == StateStalled {
			r.Health = HealthCritical
		}
		return r, nil
	}
	r.Mode, r.Group = "scale-out", t.Group
	group := t.Group
	memberStream := t.InputStream
	routed := t.Routed
	if routed {
		memberStream = t.RoutedStream
	}
	var err error
	if r.GroupProblem, r.GroupMismatch, err = groupProblem(ctx, js, memberStream, group, t.Partitions); err != nil {
		return r, err
	}
	if r.Instances, err = liveInstances(ctx, js, t); err != nil {
		return r, err
	}
	if routed {
		if err := readRoute(ctx, js, t, &r); err != nil {
			return r, err
		}
	}
	src, err := openSources(ctx, js, t, memberStream)
	if err != nil {
		return r, err
	}
	if src.snaps != nil {
		r.Snapshots = layout.SnapshotBucket(t.Group)
	}
	for p := range t.Partitions {
		part, err := readPartition(ctx, js, t, src, memberStream, p, now)
		if err != nil {
			return r, err
		}
		if part.PinID == "" {
			r.Ownerless = append(r.Ownerless, p)
		}
		if part.State == StateStalled {
			r.Stalled = append(r.Stalled, p)
		}
		r.Partitions = append(r.Partitions, part)
	}
	switch {
	case len(r.Stalled) > 0 || r.RouteState == StateStalled:
		r.Health = HealthCritical
	case r.GroupMismatch:
		r.Health = HealthUnknown
	}
	return r, nil
}

// readSingle reads a single instance's consumer into r and judges it as
// a group's partition: running (StateOwned) while a client pulls from the
// consumer (a pull request waits on it), else idle when none of its input
// is unacknowledged, else waiting since the later of when the oldest of it
// was stored and the consumer's last delivery or acknowledgement, and
// stalled once that is longer than the hand-over time.
func readSingle(ctx context.Context, js jetstream.JetStream, t Target, r *Report) error {
	ci, err := consumerInfo(ctx, js, t.InputStream, t.Consumer)
	if err != nil {
		return err
	}
	c := consumerOf(t.InputStream, t.Consumer, ci)
	r.Single = &c
	running := ci != nil && ci.NumWaiting > 0
	var oldest, active *time.Time
	if !running {
		in, err := openStream(ctx, js, t.InputStream)
		if err != nil {
			return err
		}
		// Without the consumer (the stage has not run), its input is every
		// message on the input subjects.
		filters := t.InputSubjects
		if t.FilterSubject != "" {
			filters = []string{t.FilterSubject}
		}
		if len(filters) == 0 {
			filters = []string{">"}
		}
		if oldest, active, err = unacked(ctx, in, ci, filters); err != nil {
			return fmt.Errorf("status: input of consumer %s on %s: %w", t.Consumer, t.InputStream, err)
		}
	}
	r.State, r.Waiting = classify(running, oldest, active, HandOverTime(t, nil), r.At)
	return nil
}

// readRoute reads the route step's consumer into r and, with no live
// instance to run it, how long its input has waited.
func readRoute(ctx context.Context, js jetstream.JetStream, t Target, r *Report) error {
	name := route.ConsumerName(t.Group)
	ci, err := consumerInfo(ctx, js, t.InputStream, name)
	if err != nil {
		return err
	}
	c := consumerOf(t.InputStream, name, ci)
	r.Route = &c
	if len(r.Instances) > 0 {
		r.RouteState = StateOwned
		return nil
	}
	in, err := openStream(ctx, js, t.InputStream)
	if err != nil {
		return err
	}
	oldest, active, err := unacked(ctx, in, ci, []string{">"})
	if err != nil {
		return fmt.Errorf("status: route step's input: %w", err)
	}
	r.RouteState, r.RouteWaiting = classify(false, oldest, active, HandOverTime(t, nil), r.At)
	return nil
}

// classify says how a partition (or the route step) stands: owned when
// pinned; without an owner, idle when no input is unacknowledged (oldest
// nil), else waiting since the later of oldest and active (the last
// delivery or acknowledgement), stalled once that is longer than
// handOver before now.
func classify(pinned bool, oldest, active *time.Time, handOver time.Duration, now time.Time) (string, *Waiting) {
	switch {
	case pinned:
		return StateOwned, nil
	case oldest == nil:
		return StateIdle, nil
	}
	since := *oldest
	if active != nil && active.After(since) {
		since = *active
	}
	w := &Waiting{Since: since, For: Duration(max(now.Sub(since), 0)), HandOverTime: Duration(handOver)}
	if w.Stalled() {
		return StateStalled, w
	}
	return StateWaiting, w
}

// unacked returns when the oldest message of stream that the consumer ci
// has not acknowledged was stored (nil when there is none, or when stream
// is nil) and the consumer's last delivery or acknowledgement (nil when
// it had none). Without the consumer (ci nil) every message on filters
// counts; with it, its own filters replace filters. The first message
// after the ack floor on the consumer's filters is unacknowledged by
// definition of the floor, and no later one is older.
func unacked(ctx context.Context, stream jetstream.Stream, ci *jetstream.ConsumerInfo, filters []string) (oldest, active *time.Time, err error) {
	var floor uint64
	if ci != nil {
		if ci.NumPending == 0 && ci.NumAckPending == 0 {
			return nil, lastActive(ci), nil
		}
		floor = ci.AckFloor.Stream
		switch {
		case len(ci.Config.FilterSubjects) > 0:
			filters = ci.Config.FilterSubjects
		case ci.Config.FilterSubject != "":
			filters = []string{ci.Config.FilterSubject}
		default:
			filters = []string{">"}
		}
		active = lastActive(ci)
	}
	if stream == nil {
		return nil, active, nil
	}
	var first *jetstream.RawStreamMsg
	for _, f := range filters {
		m, err := ask(ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
			return stream.GetMsg(ctx, floor+1, jetstream.WithGetMsgSubject(f))
		}, jetstream.ErrMsgNotFound)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("first message on %s after %d: %w", f, floor, err)
		}
		if first == nil || m.Sequence < first.Sequence {
			first = m
		}
	}
	if first == nil {
		return nil, active, nil
	}
	at := first.Time
	return &at, active, nil
}

// lastActive is the later of ci's last delivery and last acknowledgement,
// nil when it had neither.
func lastActive(ci *jetstream.ConsumerInfo) *time.Time {
	var t *time.Time
	for _, at := range []*time.Time{ci.Delivered.Last, ci.AckFloor.Last} {
		if at != nil && (t == nil || at.After(*t)) {
			t = at
		}
	}
	return t
}

// openStream returns the stream name, nil when it does not exist.
func openStream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	s, err := ask(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, name) }, jetstream.ErrStreamNotFound)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("status: stream %s: %w", name, err)
	}
	return s, nil
}

// sources are what status reads besides the consumers; each is nil when
// the cluster does not hold it (yet).
type sources struct {
	members   jetstream.Stream
	out       jetstream.Stream
	snaps     jetstream.ObjectStore
	handOvers jetstream.KeyValue
}

// openSources opens the members' stream, the output stream, the snapshot
// bucket and the hand-over bucket of t's group.
func openSources(ctx context.Context, js jetstream.JetStream, t Target, memberStream string) (sources, error) {
	var src sources
	var err error
	if src.members, err = openStream(ctx, js, memberStream); err != nil {
		return src, err
	}
	if src.out, err = openStream(ctx, js, t.OutputStream); err != nil {
		return src, err
	}
	snaps, err := ask(ctx, func(ctx context.Context) (jetstream.ObjectStore, error) {
		return js.ObjectStore(ctx, layout.SnapshotBucket(t.Group))
	}, jetstream.ErrBucketNotFound, jetstream.ErrStreamNotFound)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
		snaps = nil
	case err != nil:
		return src, fmt.Errorf("status: snapshot bucket %s: %w", layout.SnapshotBucket(t.Group), err)
	}
	handOvers, err := ask(ctx, func(ctx context.Context) (jetstream.KeyValue, error) {
		return js.KeyValue(ctx, layout.HandOverBucket(t.Group))
	}, jetstream.ErrBucketNotFound, jetstream.ErrStreamNotFound)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
		handOvers = nil
	case err != nil:
		return src, fmt.Errorf("status: hand-over bucket %s: %w", layout.HandOverBucket(t.Group), err)
	}
	src.snaps, src.handOvers = snaps, handOvers
	return src, nil
}

// readPartition reads partition p's last hand-over, member consumer, pin,
// fence and snapshot age.
func readPartition(ctx context.Context, js jetstream.JetStream, t Target, src sources, memberStream string, p int, now time.Time) (Partition, error) {
	group := t.Group
	member := layout.Member(p)
	part := Partition{Partition: p}
	if src.handOvers != nil {
		e, err := ask(ctx, func(ctx context.Context) (jetstream.KeyValueEntry, error) { return src.handOvers.Get(ctx, member) },
			jetstream.ErrKeyNotFound)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return part, fmt.Errorf("status: hand-over of partition %d: %w", p, err)
		default:
			var h changelog.HandOver
			if err := json.Unmarshal(e.Value(), &h); err != nil {
				return part, fmt.Errorf("status: hand-over of partition %d: %w", p, err)
			}
			part.LastHandOver = &h
		}
	}
	consumer := layout.MemberConsumer(group, p)
	ci, err := consumerInfo(ctx, js, memberStream, consumer)
	if err != nil {
		return part, err
	}
	part.Consumer = consumerOf(memberStream, consumer, ci)
	if ci != nil {
		for _, pg := range ci.PriorityGroups {
			if pg.Group == pinGroup && pg.PinnedClientID != "" {
				part.PinID = pg.PinnedClientID
				at := pg.PinnedTS
				part.PinnedAt = &at
			}
		}
	}
	if src.out != nil {
		if err := readFence(ctx, src.out, changelog.FenceSubject(t.OutputPrefix, p), &part); err != nil {
			return part, err
		}
	}
	part.LastOwner = part.FenceInstance
	if part.PinID != "" {
		part.Owner = part.FenceInstance
		part.OwnerConfirmed = part.FenceAt != nil && !part.FenceAt.Before(*part.PinnedAt)
	}
	var oldest, active *time.Time
	if part.PinID == "" {
		// Without the consumer (no instance has created it yet), the
		// partition's input is every message of its subjects.
		if oldest, active, err = unacked(ctx, src.members, ci, []string{fmt.Sprintf("%d.>", p)}); err != nil {
			return part, fmt.Errorf("status: input of partition %d: %w", p, err)
		}
	}
	part.State, part.Waiting = classify(part.PinID != "", oldest, active, HandOverTime(t, part.LastHandOver), now)
	if src.snaps != nil {
		info, err := ask(ctx, func(ctx context.Context) (*jetstream.ObjectInfo, error) {
			return src.snaps.GetInfo(ctx, layout.SnapshotObject(p))
		}, jetstream.ErrObjectNotFound)
		switch {
		case errors.Is(err, jetstream.ErrObjectNotFound):
		case err != nil:
			return part, fmt.Errorf("status: snapshot %s/%s: %w", layout.SnapshotBucket(t.Group), member, err)
		default:
			age := Duration(now.Sub(info.ModTime))
			part.SnapshotAge = &age
		}
	}
	return part, nil
}

// Check returns an error wrapping ErrStalled that names the stalled
// partitions (and the route step when it is stalled), or a single
// instance's consumer, and how long their input has waited; else one
// wrapping ErrGroupMismatch when the group has another partition count
// than the configuration; nil when every partition (or the single
// instance) is owned or running, idle, or waiting within its hand-over
// time.
func (r Report) Check() error {
	if r.Single != nil {
		if r.State != StateStalled {
			return nil
		}
		return stalledError(fmt.Sprintf("the input of consumer %s on %s has waited %s with no consumer activity, longer than the hand-over time %s: the stage is not running, or takes none of it",
			r.Single.Name, r.Single.Stream, round(r.Waiting.For), round(r.Waiting.HandOverTime)))
	}
	var parts []string
	for _, p := range r.Partitions {
		if p.State == StateStalled {
			parts = append(parts, fmt.Sprintf("%d (%s)", p.Partition, p.Waiting.describe()))
		}
	}
	var msg []string
	if len(parts) > 0 {
		msg = append(msg, fmt.Sprintf("partitions %s of %d", strings.Join(parts, ", "), len(r.Partitions)))
	}
	if r.RouteState == StateStalled {
		msg = append(msg, fmt.Sprintf("the route step, with no live instance (%s)", r.RouteWaiting.describe()))
	}
	switch {
	case len(msg) > 0:
		return fmt.Errorf("%w: %s", ErrStalled, strings.Join(msg, "; "))
	case r.GroupMismatch:
		return fmt.Errorf("%w: %s", ErrGroupMismatch, r.GroupProblem)
	}
	return nil
}

// stalledError is a single instance's ErrStalled, which says it in its own
// words (ErrStalled's speak of owners).
type stalledError string

func (e stalledError) Error() string      { return string(e) }
func (stalledError) Is(target error) bool { return target == ErrStalled }

// describe says how long w has waited against its hand-over time.
func (w *Waiting) describe() string {
	return fmt.Sprintf("waiting %s, hand-over time %s", round(w.For), round(w.HandOverTime))
}

// round is d rounded up: to the millisecond under a second, to a tenth of
// a second under a minute, else to the second. Up, so that a wait just
// past a hand-over time never reads as long as it, or shorter.
func round(d Duration) string {
	unit := time.Second
	switch t := time.Duration(d); {
	case t < time.Second:
		unit = time.Millisecond
	case t < time.Minute:
		unit = 100 * time.Millisecond
	}
	t := time.Duration(d)
	if r := t % unit; r != 0 {
		t += unit - r
	}
	return t.String()
}

// groupProblem reads the static consumer group's record (pcgroups) and
// says what is wrong with it for a group of partitions partitions: "" when
// nothing is; mismatch when it has another partition count.
func groupProblem(ctx context.Context, js jetstream.JetStream, stream, group string, partitions int) (problem string, mismatch bool, err error) {
	rec, err := ask(ctx, func(ctx context.Context) (*pcgroups.StaticConsumerGroupConfig, error) {
		rec, err := pcgroups.GetStaticConsumerGroupConfig(ctx, js, stream, group)
		// pcgroups does not wrap its "not found" for a missing record.
		if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) && strings.HasSuffix(err.Error(), "not found") {
			err = fmt.Errorf("%w: %w", errNoGroup, err)
		}
		return rec, err
	}, jetstream.ErrBucketNotFound, errNoGroup)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, errNoGroup):
		return fmt.Sprintf("consumer group %s on %s not created yet (no instance has started)", group, stream), false, nil
	case err != nil:
		return "", false, fmt.Errorf("status: consumer group %s on %s: %w", group, stream, err)
	case int(rec.MaxMembers) != partitions:
		return fmt.Sprintf("consumer group %s on %s has %d partitions, the configuration %d (state.partitions): instances of this configuration refuse to join it",
			group, stream, rec.MaxMembers, partitions), true, nil
	}
	return "", false, nil
}

// liveInstances lists the keys of the group's presence bucket, nil when
// the bucket does not exist.
func liveInstances(ctx context.Context, js jetstream.JetStream, t Target) ([]string, error) {
	bucket, _, _ := layout.Presence(t.Group, t.AckWait)
	kv, err := ask(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return js.KeyValue(ctx, bucket) },
		jetstream.ErrBucketNotFound)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("status: presence bucket %s: %w", bucket, err)
	}
	names, err := ask(ctx, func(ctx context.Context) ([]string, error) { return kv.Keys(ctx) }, jetstream.ErrNoKeysFound)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("status: presence bucket %s: %w", bucket, err)
	}
	return names, nil
}

// readFence fills p's fence fields from the last message on subject.
func readFence(ctx context.Context, out jetstream.Stream, subject string, p *Partition) error {
	m, err := ask(ctx, func(ctx context.Context) (*jetstream.RawStreamMsg, error) {
		return out.GetLastMsgForSubject(ctx, subject)
	}, jetstream.ErrMsgNotFound)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("status: last fence on %s: %w", subject, err)
	}
	p.FenceSeq = m.Sequence
	at := m.Time
	p.FenceAt = &at
	if f, err := changelog.ParseFence(m.Data); err == nil {
		p.FenceInstance = f.Instance
	} else {
		p.FenceInstance = "?"
	}
	return nil
}

// consumerInfo returns a consumer's info, nil when the stream or the
// consumer does not exist.
func consumerInfo(ctx context.Context, js jetstream.JetStream, stream, name string) (*jetstream.ConsumerInfo, error) {
	c, err := ask(ctx, func(ctx context.Context) (jetstream.Consumer, error) { return js.Consumer(ctx, stream, name) },
		jetstream.ErrConsumerNotFound, jetstream.ErrStreamNotFound)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("status: consumer %s on %s: %w", name, stream, err)
	}
	return c.CachedInfo(), nil
}

func consumerOf(stream, name string, ci *jetstream.ConsumerInfo) Consumer {
	c := Consumer{Stream: stream, Name: name}
	if ci != nil {
		c.Exists, c.Pending, c.AckPending = true, ci.NumPending, ci.NumAckPending
	}
	return c
}

// errNoGroup marks pcgroups' error for a consumer group it has no record of.
var errNoGroup = errors.New("no consumer group record")

// ask runs op, one request to the cluster, for at most
// streams.RequestTimeout, and asks again with backoff while it fails
// transiently (retry.Do) and ctx lasts: a cluster can leave a request
// unanswered while it elects a leader, as when a group starts, and the
// request asked again is answered. An error that is one of answers (not
// found) is the cluster's answer, returned at once.
func ask[T any](ctx context.Context, op func(ctx context.Context) (T, error), answers ...error) (T, error) {
	var (
		v      T
		answer error
	)
	err := retry.Do(ctx, "request", func() error {
		rctx, cancel := context.WithTimeout(ctx, streams.RequestTimeout)
		defer cancel()
		var err error
		v, err = op(rctx)
		for _, a := range answers {
			if errors.Is(err, a) {
				answer = err
				return nil
			}
		}
		answer = nil
		return err
	}, retry.Options{})
	if err != nil {
		return v, err
	}
	return v, answer
}
