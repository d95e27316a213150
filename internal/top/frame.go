// Package top is the live view of `dedupe-stage top`: it turns the status
// answers of a stage's instances (admin.StatusReply), taken one refresh
// apart, into a Frame of rows per instance and per partition, sorts them
// (Sort), renders them as text with lipgloss (Render), and runs the
// refreshing terminal view with bubbletea (Model).
//
// Every count comes from the instances: they read their own metrics'
// counters (admin.Traffic). This package computes only what needs two
// answers or several instances: a rate (the difference of two answers'
// counts over the difference of their times), the sums over instances,
// and the shares of those sums. The 99th percentile of repeat ages is the
// instance's own.
package top

import (
	"slices"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
)

// Sample is the answers to one status request.
type Sample struct {
	// At is when it was asked, on the asker's clock.
	At time.Time
	// Replies are the instances' answers.
	Replies []admin.StatusReply
	// Err is why no instance answered; nil when some did.
	Err error
}

// Frame is what one refresh shows: a row per instance and per partition.
type Frame struct {
	// At is when the newest sample was asked.
	At time.Time
	// Err is the newest sample's error.
	Err error
	// Window is W, as the instances report it (the first one that says).
	Window time.Duration
	// Instances are the instances that answered this sample or the one
	// before.
	Instances []InstanceRow
	// Partitions are the partitions, 0 to the largest count an instance
	// reports.
	Partitions []PartitionRow
}

// InstanceRow is one instance as its last answer tells it.
type InstanceRow struct {
	Instance string
	// Answered is false for an instance that answered the sample before
	// and not this one: its other fields are from that answer.
	Answered bool
	Ready    bool
	Problem  string
	// Owned are the partitions it owns.
	Owned []int
	// NATS is its connection; nil from an instance that does not say.
	NATS *admin.NATSState
	// Rate is messages judged per second between the two samples; -1 when
	// unknown (one answer only, its counts went back, or it does not say).
	Rate float64
	// Judged counts every message judged since it started, with those
	// dead-lettered before a partition; Repeats the repeats among them.
	Judged, Repeats uint64
	// DeadLetters counts dead letters by reason; DeadTotal all of them.
	DeadLetters map[string]uint64
	DeadTotal   uint64
	// P99 is the instance's 99th percentile of repeat ages; nil before a
	// repeat. Window is its W.
	P99    *time.Duration
	Window time.Duration
	// NearWindowEnd counts repeats caught near the end of W.
	NearWindowEnd uint64
	// Backlog is the backlog of the partitions it owns; nil before its
	// first poll.
	Backlog *admin.Backlog
	// Restoring maps the partitions it restores to the records read back.
	Restoring map[int]int
}

// RepeatShare is the share of the messages judged that were repeats; ok
// false before any message.
func (r InstanceRow) RepeatShare() (share float64, ok bool) { return share2(r.Repeats, r.Judged) }

// P99OfWindow is P99 as a share of W; ok false without either.
func (r InstanceRow) P99OfWindow() (share float64, ok bool) {
	if r.P99 == nil || r.Window <= 0 {
		return 0, false
	}
	return float64(*r.P99) / float64(r.Window), true
}

// PartitionRow is one partition, summed over the instances that judged
// it.
type PartitionRow struct {
	Partition int
	// Owners are the instances that say they own it: one, or none while
	// it has no owner; two only for the moment of a hand-over.
	Owners []string
	// Rate is messages judged per second between the two samples, summed
	// over the instances that answered both; -1 when none did.
	Rate float64
	// The messages judged since each instance started, by outcome, summed
	// over the instances.
	Judged, New, Repeats, Stale, DeadLetters, Dropped uint64
	// Backlog is its member consumer's backlog as its owner last polled
	// it; nil for a single instance (whose backlog is the instance's) or
	// without an owner.
	Backlog *admin.Backlog
	// Restoring is the records read back while it is restored; nil when
	// it is not.
	Restoring *int
}

// RepeatShare is the share of the partition's messages judged that were
// repeats; ok false before any message.
func (r PartitionRow) RepeatShare() (share float64, ok bool) { return share2(r.Repeats, r.Judged) }

func share2(part, whole uint64) (float64, bool) {
	if whole == 0 {
		return 0, false
	}
	return float64(part) / float64(whole), true
}

// instanceJudged is every message an instance has judged: its
// partitions' and those dead-lettered before a partition.
func instanceJudged(t *admin.Traffic) (judged, repeats uint64) {
	judged = t.UnpartitionedDeadLetters
	for _, p := range t.Partitions {
		judged += p.Judged()
		repeats += p.Repeat
	}
	return judged, repeats
}

// rate is (cur-prev) per second between the times of two answers' counts;
// -1 when it cannot be told.
func rate(cur, prev uint64, curAt, prevAt time.Time) float64 {
	dt := curAt.Sub(prevAt).Seconds()
	if dt <= 0 || cur < prev {
		return -1
	}
	return float64(cur-prev) / dt
}

// Build makes the frame of cur, with rates against prev (a zero Sample
// for none).
func Build(prev, cur Sample) Frame {
	f := Frame{At: cur.At, Err: cur.Err}
	before := map[string]admin.StatusReply{}
	for _, r := range prev.Replies {
		before[r.Instance] = r
	}
	now := map[string]bool{}
	parts := 0
	for _, r := range cur.Replies {
		now[r.Instance] = true
		parts = max(parts, r.Partitions)
	}
	for _, r := range cur.Replies {
		p, ok := before[r.Instance]
		f.Instances = append(f.Instances, instanceRow(r, p, ok, true))
	}
	for _, r := range prev.Replies {
		if !now[r.Instance] {
			f.Instances = append(f.Instances, instanceRow(r, admin.StatusReply{}, false, false))
		}
	}
	for _, in := range f.Instances {
		if in.Window > 0 {
			f.Window = in.Window
			break
		}
	}
	for p := range parts {
		f.Partitions = append(f.Partitions, partitionRow(p, cur.Replies, before))
	}
	Sort{}.Apply(&f)
	return f
}

// instanceRow is the row of r, with its rate against prev when had.
func instanceRow(r, prev admin.StatusReply, had, answered bool) InstanceRow {
	row := InstanceRow{Instance: r.Instance, Answered: answered, Ready: r.Ready, Problem: r.Problem,
		Owned: r.Owned, Restoring: r.Restoring, Rate: -1}
	row.Window, _ = time.ParseDuration(r.Window)
	t := r.Traffic
	if t == nil {
		return row
	}
	nats := t.NATS
	row.NATS = &nats
	row.Judged, row.Repeats = instanceJudged(t)
	row.DeadLetters, row.Backlog, row.NearWindowEnd = t.DeadLetters, t.Backlog, t.NearWindowEnd
	for _, n := range t.DeadLetters {
		row.DeadTotal += n
	}
	if t.RepeatAgeP99 != nil {
		d := time.Duration(*t.RepeatAgeP99 * float64(time.Second))
		row.P99 = &d
	}
	if had && answered && prev.Traffic != nil {
		judged, _ := instanceJudged(prev.Traffic)
		row.Rate = rate(row.Judged, judged, t.At, prev.Traffic.At)
	}
	return row
}

// partitionRow sums partition p over the answers cur, with its rate
// against the earlier answers of the same instances.
func partitionRow(p int, cur []admin.StatusReply, before map[string]admin.StatusReply) PartitionRow {
	row := PartitionRow{Partition: p, Rate: -1}
	for _, r := range cur {
		if slices.Contains(r.Owned, p) {
			row.Owners = append(row.Owners, r.Instance)
		}
		if n, ok := r.Restoring[p]; ok {
			row.Restoring = &n
		}
		pt, ok := partitionOf(r.Traffic, p)
		if !ok {
			continue
		}
		row.Judged += pt.Judged()
		row.New += pt.New
		row.Repeats += pt.Repeat
		row.Stale += pt.Stale
		row.DeadLetters += pt.DeadLetter
		row.Dropped += pt.Dropped
		if pt.Backlog != nil && slices.Contains(r.Owned, p) {
			b := *pt.Backlog
			row.Backlog = &b
		}
		prev, ok := before[r.Instance]
		if !ok {
			continue
		}
		if old, ok := partitionOf(prev.Traffic, p); ok {
			if rt := rate(pt.Judged(), old.Judged(), r.Traffic.At, prev.Traffic.At); rt >= 0 {
				row.Rate = max(row.Rate, 0) + rt
			}
		}
	}
	slices.Sort(row.Owners)
	return row
}

// partitionOf returns partition p's counts in t.
func partitionOf(t *admin.Traffic, p int) (admin.PartitionTraffic, bool) {
	if t == nil {
		return admin.PartitionTraffic{}, false
	}
	for _, pt := range t.Partitions {
		if pt.Partition == p {
			return pt, true
		}
	}
	return admin.PartitionTraffic{}, false
}
