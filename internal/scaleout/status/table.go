package status

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteJSON writes r as one indented JSON document, for scripts.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	return nil
}

// WriteTable writes r as a table for people: a line per partition with
// its state, owner, backlog, fence and snapshot age, ages against r.At.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if r.Single != nil {
		fmt.Fprintf(tw, "single instance, consumer %s; %s\n", describe(*r.Single), singleState(r.State, r.Waiting))
		return tw.Flush()
	}
	live := "none"
	if len(r.Instances) > 0 {
		live = strings.Join(r.Instances, " ")
	}
	count := map[string]int{}
	for _, p := range r.Partitions {
		count[p.State]++
	}
	fmt.Fprintf(tw, "group %s: %d partitions: %d owned, %d idle, %d waiting, %d stalled; live instances: %s\n", r.Group, len(r.Partitions),
		count[StateOwned], count[StateIdle], count[StateWaiting], count[StateStalled], live)
	if r.GroupProblem != "" {
		fmt.Fprintf(tw, "%s\n", r.GroupProblem)
	}
	if r.Route != nil {
		line := describe(*r.Route)
		switch r.RouteState {
		case StateIdle:
			line += "; no live instance runs it, nothing waits"
		case StateWaiting, StateStalled:
			line += "; no live instance runs it: " + state(r.RouteState, r.RouteWaiting)
		}
		fmt.Fprintf(tw, "route step consumer %s\n", line)
	}
	fmt.Fprintln(tw, "PARTITION\tSTATE\tOWNER\tPINNED\tPENDING\tACK PENDING\tFENCE SEQ\tFENCE AGE\tSNAPSHOT AGE\tLAST HAND-OVER")
	for _, p := range r.Partitions {
		owner, pinned := "-", "-"
		switch {
		case p.PinID == "" && p.LastOwner != "":
			owner = "none (last " + p.LastOwner + ")"
		case p.PinID == "":
			owner = "none"
		case p.Owner == "":
			owner = "? (no fence yet)"
		case !p.OwnerConfirmed:
			owner = p.Owner + "? (fence before pin)"
		default:
			owner = p.Owner
		}
		if p.PinnedAt != nil {
			pinned = age(r.At, *p.PinnedAt) + " ago"
		}
		pending, ack := "-", "-"
		if p.Consumer.Exists {
			pending, ack = fmt.Sprint(p.Consumer.Pending), fmt.Sprint(p.Consumer.AckPending)
		}
		seq, fenceAge := "-", "-"
		if p.FenceAt != nil {
			seq, fenceAge = fmt.Sprint(p.FenceSeq), age(r.At, *p.FenceAt)
		}
		snap := "-"
		if p.SnapshotAge != nil {
			snap = time.Duration(*p.SnapshotAge).Round(time.Second).String()
		}
		last := "-"
		if h := p.LastHandOver; h != nil {
			last = fmt.Sprintf("%s %s ago: %d records (%s) in %s", h.Instance, age(r.At, h.At), h.Records, h.Path,
				time.Duration(h.RestoreSeconds*float64(time.Second)).Round(time.Millisecond))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Partition, state(p.State, p.Waiting), owner, pinned, pending, ack, seq, fenceAge, snap, last)
	}
	return tw.Flush()
}

// state says a partition's or the route step's state in a few words:
// "owned", "idle", "waiting 2s (within hand-over time 1m10s)" or
// "STALLED: waiting 5m, hand-over time 1m10s".
func state(s string, w *Waiting) string {
	switch s {
	case StateWaiting:
		return fmt.Sprintf("waiting %s (within hand-over time %s)", round(w.For), round(w.HandOverTime))
	case StateStalled:
		return "STALLED: " + w.describe()
	}
	return s
}

// singleState says a single instance's state in a few words.
func singleState(s string, w *Waiting) string {
	switch s {
	case StateOwned:
		return "running (pulling from its consumer)"
	case StateIdle:
		return "not pulling now, nothing waits"
	case StateWaiting:
		return fmt.Sprintf("not pulling now: input waiting %s with no consumer activity (within hand-over time %s)", round(w.For), round(w.HandOverTime))
	case StateStalled:
		return "NOT RUNNING: input " + w.describe() + ", with no consumer activity"
	}
	return s
}

// describe says a consumer's backlog in one line.
func describe(c Consumer) string {
	if !c.Exists {
		return fmt.Sprintf("%s on %s: does not exist", c.Name, c.Stream)
	}
	return fmt.Sprintf("%s on %s: %d pending, %d ack pending", c.Name, c.Stream, c.Pending, c.AckPending)
}

// age is how long before now t was, to the second.
func age(now, t time.Time) string {
	return max(now.Sub(t), 0).Round(time.Second).String()
}
