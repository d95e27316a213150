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
// its owner, backlog, fence and snapshot age, ages against r.At.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if r.Single != nil {
		fmt.Fprintf(tw, "single instance, consumer %s\n", describe(*r.Single))
		return tw.Flush()
	}
	live := "none"
	if len(r.Instances) > 0 {
		live = strings.Join(r.Instances, " ")
	}
	fmt.Fprintf(tw, "group %s: %d partitions, %d without an owner; live instances: %s\n", r.Group, len(r.Partitions), len(r.Ownerless), live)
	if r.GroupProblem != "" {
		fmt.Fprintf(tw, "%s\n", r.GroupProblem)
	}
	if r.Route != nil {
		fmt.Fprintf(tw, "route step consumer %s\n", describe(*r.Route))
	}
	fmt.Fprintln(tw, "PARTITION\tOWNER\tPINNED\tPENDING\tACK PENDING\tFENCE SEQ\tFENCE AGE\tSNAPSHOT AGE\tLAST HAND-OVER")
	for _, p := range r.Partitions {
		owner, pinned := "-", "-"
		switch {
		case p.PinID == "":
			owner = "NONE"
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
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Partition, owner, pinned, pending, ack, seq, fenceAge, snap, last)
	}
	return tw.Flush()
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
