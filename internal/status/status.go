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
// Use:
//
//	r, err := status.Read(ctx, js, cfg, time.Now())
//	r.WriteTable(os.Stdout)
//	if err := r.Check(); err != nil { ... } // ErrNoOwner: a partition has no owner
package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/pcgroups"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/handover"
	"github.com/dedupe-stage/dedupe-stage/internal/route"
)

// ErrNoOwner is returned by Report.Check when a partition of a group has no
// pinned client: its input waits until an instance takes it.
var ErrNoOwner = errors.New("partitions without an owner")

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
	LastHandOver *handover.HandOver `json:"last_handover,omitempty"`
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
	// Instances are the live instances in the group's presence bucket.
	Instances []string `json:"instances,omitempty"`
	// Partitions are the group's partitions, in order.
	Partitions []Partition `json:"partitions,omitempty"`
	// Route is the route step's consumer on the input, nil when the group
	// is not routed.
	Route *Consumer `json:"route,omitempty"`
	// Single is a single instance's consumer on the input.
	Single *Consumer `json:"consumer,omitempty"`
	// Snapshots is the Object Store bucket read for snapshot ages, "" when
	// it does not exist.
	Snapshots string `json:"snapshots_bucket,omitempty"`
	// Ownerless lists the partitions without an owner.
	Ownerless []int `json:"ownerless"`
}

// Read reads how the stage or group cfg describes stands, from the
// cluster js is connected to; now dates the ages. A stream or consumer
// that is missing is reported as such, not as an error; an error is a
// request the cluster did not answer.
func Read(ctx context.Context, js jetstream.JetStream, cfg config.Config, now time.Time) (Report, error) {
	r := Report{At: now, Mode: "single", Ownerless: []int{}}
	if !cfg.ScaleOut.Enabled {
		c, err := readConsumer(ctx, js, cfg.Input.Stream, cfg.Input.Consumer)
		if err != nil {
			return r, err
		}
		r.Single = &c
		return r, nil
	}
	r.Mode, r.Group = "scale-out", cfg.ScaleOut.Group
	group := cfg.ScaleOut.Group
	memberStream := cfg.Input.Stream
	if routed, _ := cfg.ScaleOutRouted(); routed {
		memberStream = cfg.ScaleOut.RoutedStream
		c, err := readConsumer(ctx, js, cfg.Input.Stream, route.ConsumerName(group))
		if err != nil {
			return r, err
		}
		r.Route = &c
	}
	var err error
	if r.GroupProblem, err = groupProblem(ctx, js, memberStream, group, cfg.State.Partitions); err != nil {
		return r, err
	}
	if r.Instances, err = liveInstances(ctx, js, cfg); err != nil {
		return r, err
	}
	src, err := openSources(ctx, js, cfg)
	if err != nil {
		return r, err
	}
	if src.snaps != nil {
		r.Snapshots = cfg.ScaleOutSnapshotBucket()
	}
	for p := range cfg.State.Partitions {
		part, err := readPartition(ctx, js, cfg, src, memberStream, p, now)
		if err != nil {
			return r, err
		}
		if part.PinID == "" {
			r.Ownerless = append(r.Ownerless, p)
		}
		r.Partitions = append(r.Partitions, part)
	}
	return r, nil
}

// sources are what status reads besides the consumers; each is nil when
// the cluster does not hold it (yet).
type sources struct {
	out       jetstream.Stream
	snaps     jetstream.ObjectStore
	handOvers jetstream.KeyValue
}

// openSources opens the output stream, the snapshot bucket and the
// hand-over bucket of cfg's group.
func openSources(ctx context.Context, js jetstream.JetStream, cfg config.Config) (sources, error) {
	var src sources
	out, err := js.Stream(ctx, cfg.Output.Stream)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return src, fmt.Errorf("status: output stream %s: %w", cfg.Output.Stream, err)
	}
	src.out = out
	snaps, err := js.ObjectStore(ctx, cfg.ScaleOutSnapshotBucket())
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
		snaps = nil
	case err != nil:
		return src, fmt.Errorf("status: snapshot bucket %s: %w", cfg.ScaleOutSnapshotBucket(), err)
	}
	handOvers, err := js.KeyValue(ctx, cfg.ScaleOutHandOverBucket())
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
		handOvers = nil
	case err != nil:
		return src, fmt.Errorf("status: hand-over bucket %s: %w", cfg.ScaleOutHandOverBucket(), err)
	}
	src.snaps, src.handOvers = snaps, handOvers
	return src, nil
}

// readPartition reads partition p's last hand-over, member consumer, pin,
// fence and snapshot age.
func readPartition(ctx context.Context, js jetstream.JetStream, cfg config.Config, src sources, memberStream string, p int, now time.Time) (Partition, error) {
	group := cfg.ScaleOut.Group
	member := config.ScaleOutMember(p)
	part := Partition{Partition: p}
	if src.handOvers != nil {
		e, err := src.handOvers.Get(ctx, member)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return part, fmt.Errorf("status: hand-over of partition %d: %w", p, err)
		default:
			var h handover.HandOver
			if err := json.Unmarshal(e.Value(), &h); err != nil {
				return part, fmt.Errorf("status: hand-over of partition %d: %w", p, err)
			}
			part.LastHandOver = &h
		}
	}
	consumer := config.ScaleOutMemberConsumer(group, p)
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
		if err := readFence(ctx, src.out, handover.FenceSubject(cfg.Output.SubjectPrefix, p), &part); err != nil {
			return part, err
		}
	}
	if part.PinID != "" {
		part.Owner = part.FenceInstance
		part.OwnerConfirmed = part.FenceAt != nil && !part.FenceAt.Before(*part.PinnedAt)
	}
	if src.snaps != nil {
		info, err := src.snaps.GetInfo(ctx, config.ScaleOutSnapshotObject(p))
		switch {
		case errors.Is(err, jetstream.ErrObjectNotFound):
		case err != nil:
			return part, fmt.Errorf("status: snapshot %s/%s: %w", cfg.ScaleOutSnapshotBucket(), member, err)
		default:
			age := Duration(now.Sub(info.ModTime))
			part.SnapshotAge = &age
		}
	}
	return part, nil
}

// Check returns an error wrapping ErrNoOwner that names the partitions
// without an owner, nil when every partition has one (always for a
// single instance).
func (r Report) Check() error {
	if len(r.Ownerless) == 0 {
		return nil
	}
	names := ""
	for i, p := range r.Ownerless {
		if i > 0 {
			names += ", "
		}
		names += strconv.Itoa(p)
	}
	return fmt.Errorf("%w: %s of %d (no instance is pinned to them; their input waits)", ErrNoOwner, names, len(r.Partitions))
}

// groupProblem reads the static consumer group's record (pcgroups) and
// says what is wrong with it for a group of partitions partitions: "" when
// nothing is.
func groupProblem(ctx context.Context, js jetstream.JetStream, stream, group string, partitions int) (string, error) {
	rec, err := pcgroups.GetStaticConsumerGroupConfig(ctx, js, stream, group)
	switch {
	// pcgroups does not wrap its "not found" for a missing record.
	case errors.Is(err, jetstream.ErrBucketNotFound) || (err != nil && strings.HasSuffix(err.Error(), "not found")):
		return fmt.Sprintf("consumer group %s on %s not created yet (no instance has started)", group, stream), nil
	case err != nil:
		return "", fmt.Errorf("status: consumer group %s on %s: %w", group, stream, err)
	case int(rec.MaxMembers) != partitions:
		return fmt.Sprintf("consumer group %s on %s has %d partitions, the configuration %d (state.partitions): instances of this configuration refuse to join it",
			group, stream, rec.MaxMembers, partitions), nil
	}
	return "", nil
}

// liveInstances lists the keys of the group's presence bucket, nil when
// the bucket does not exist.
func liveInstances(ctx context.Context, js jetstream.JetStream, cfg config.Config) ([]string, error) {
	bucket, _, _ := cfg.ScaleOutPresence()
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("status: presence bucket %s: %w", bucket, err)
	}
	names, err := kv.Keys(ctx)
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
	m, err := out.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("status: last fence on %s: %w", subject, err)
	}
	p.FenceSeq = m.Sequence
	at := m.Time
	p.FenceAt = &at
	if f, err := handover.ParseFence(m.Data); err == nil {
		p.FenceInstance = f.Instance
	} else {
		p.FenceInstance = "?"
	}
	return nil
}

// consumerInfo returns a consumer's info, nil when the stream or the
// consumer does not exist.
func consumerInfo(ctx context.Context, js jetstream.JetStream, stream, name string) (*jetstream.ConsumerInfo, error) {
	c, err := js.Consumer(ctx, stream, name)
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

func readConsumer(ctx context.Context, js jetstream.JetStream, stream, name string) (Consumer, error) {
	ci, err := consumerInfo(ctx, js, stream, name)
	if err != nil {
		return Consumer{}, err
	}
	return consumerOf(stream, name, ci), nil
}
