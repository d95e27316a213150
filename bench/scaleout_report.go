package main

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// ScaleOutRatio holds, for one CPU cap and round, the ratios the targets
// are stated in, by name: "header 1/off" and "subject 1/off" (events/s of
// one instance with scale_out on over off; targets >= 0.5 and >= 0.8),
// "header 2/1" ... "subject 3/1" (targets when capped: >= 1.7 and
// >= 2.5), "cpu header 1/off" and "cpu subject 1/off" (stage CPU µs per
// event; target <= 2). Round is 0 for a single round, or for the medians
// of every round's ratios (MedianOf rounds).
type ScaleOutRatio struct {
	CPUCap   float64            `json:"cpu_cap_cores"`
	Round    int                `json:"round,omitempty"`
	MedianOf int                `json:"median_of_rounds,omitempty"`
	Ratios   map[string]float64 `json:"ratios"`
}

// ratioNames are the ratios of a ScaleOutRatio, in the order printed: a
// name, its numerator row (mode, instances) and denominator row, and
// whether it is of CPU per event (else of events/s).
var ratioNames = []struct {
	name     string
	num, den soRow
	cpu      bool
}{
	{"header 1/off", soRow{mode: soHeader, instances: 1}, soRow{mode: soOff, instances: 1}, false},
	{"subject 1/off", soRow{mode: soSubject, instances: 1}, soRow{mode: soOff, instances: 1}, false},
	{"header 2/1", soRow{mode: soHeader, instances: 2}, soRow{mode: soHeader, instances: 1}, false},
	{"header 3/1", soRow{mode: soHeader, instances: 3}, soRow{mode: soHeader, instances: 1}, false},
	{"subject 2/1", soRow{mode: soSubject, instances: 2}, soRow{mode: soSubject, instances: 1}, false},
	{"subject 3/1", soRow{mode: soSubject, instances: 3}, soRow{mode: soSubject, instances: 1}, false},
	{"cpu header 1/off", soRow{mode: soHeader, instances: 1}, soRow{mode: soOff, instances: 1}, true},
	{"cpu subject 1/off", soRow{mode: soSubject, instances: 1}, soRow{mode: soOff, instances: 1}, true},
}

// scaleOutRatios computes, per cap, the ratios of each round's rows (rows
// without refresh) and, with rounds above 1, the median of each over the
// rounds.
func scaleOutRatios(rows []*ScaleOutRow, caps []float64, rounds int) []ScaleOutRatio {
	var out []ScaleOutRatio
	for _, c := range caps {
		all := map[string][]float64{}
		first, last := 0, 0 // a single round is round 0
		if rounds > 1 {
			first, last = 1, rounds
		}
		for round := first; round <= last; round++ {
			r := ScaleOutRatio{CPUCap: c, Round: round, Ratios: map[string]float64{}}
			for _, rn := range ratioNames {
				num, den := findRow(rows, rn.num, c, round), findRow(rows, rn.den, c, round)
				if num == nil || den == nil {
					continue
				}
				a, b := num.EventsPerSec, den.EventsPerSec
				if rn.cpu {
					a, b = num.StageCPUMicrosPerEvent, den.StageCPUMicrosPerEvent
				}
				if b > 0 {
					r.Ratios[rn.name] = a / b
					all[rn.name] = append(all[rn.name], a/b)
				}
			}
			if len(r.Ratios) > 0 {
				out = append(out, r)
			}
		}
		if rounds > 1 && len(all) > 0 {
			m := ScaleOutRatio{CPUCap: c, MedianOf: rounds, Ratios: map[string]float64{}}
			for name, vs := range all {
				m.Ratios[name] = median(vs)
			}
			out = append(out, m)
		}
	}
	return out
}

// findRow returns the row without refresh of want's mode and instances,
// at cap c in round, or nil.
func findRow(rows []*ScaleOutRow, want soRow, c float64, round int) *ScaleOutRow {
	for _, r := range rows {
		if r.Mode == want.mode && !r.Refresh && r.Instances == want.instances && r.CPUCap == c && r.Round == round {
			return r
		}
	}
	return nil
}

// median is the median of vs (the mean of the middle two for an even
// count), 0 for none.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	vs = slices.Clone(vs)
	slices.Sort(vs)
	if n := len(vs); n%2 == 0 {
		return (vs[n/2-1] + vs[n/2]) / 2
	}
	return vs[len(vs)/2]
}

// ScaleOutRefresh is window.refresh_on_repeat's cost in one row: the row
// with refresh against the same row without, in the same round (Round 0
// and MedianOf: the medians over the rounds): events/s with over without,
// the CPU µs the instances and the servers spent beyond the row without
// per repeat of the backlog, and the key-state records per repeat.
type ScaleOutRefresh struct {
	Mode               string  `json:"mode"`
	Instances          int     `json:"instances"`
	CPUCap             float64 `json:"cpu_cap_cores"`
	Round              int     `json:"round,omitempty"`
	MedianOf           int     `json:"median_of_rounds,omitempty"`
	EventsVsWithout    float64 `json:"events_per_sec_vs_without"`
	StageCPUPerRepeat  float64 `json:"stage_cpu_us_per_repeat"`
	ServerCPUPerRepeat float64 `json:"server_cpu_us_per_repeat"`
	KeyStatePerRepeat  float64 `json:"key_state_records_per_repeat"`
}

// refreshCosts computes window.refresh_on_repeat's cost: for each refresh
// row, against the same row without refresh in the same round (repeats:
// the backlog's); with rounds above 1, then, per row, the median of each
// figure over the rounds where both ran.
func refreshCosts(rows []*ScaleOutRow, repeats, rounds int) []ScaleOutRefresh {
	var out []ScaleOutRefresh
	for _, rf := range rows {
		if !rf.Refresh {
			continue
		}
		base := findRow(rows, soRow{mode: rf.Mode, instances: rf.Instances}, rf.CPUCap, rf.Round)
		if base == nil || base.EventsPerSec <= 0 {
			continue
		}
		c := ScaleOutRefresh{Mode: rf.Mode, Instances: rf.Instances, CPUCap: rf.CPUCap, Round: rf.Round,
			EventsVsWithout: rf.EventsPerSec / base.EventsPerSec}
		if repeats > 0 {
			// Per event of the drain, times the drained events: the CPU
			// beyond the row without, over the repeats.
			perRepeat := float64(rf.Drained) / float64(repeats)
			c.StageCPUPerRepeat = (rf.StageCPUMicrosPerEvent - base.StageCPUMicrosPerEvent) * perRepeat
			c.ServerCPUPerRepeat = (rf.ServerCPUMicrosPerEvent - base.ServerCPUMicrosPerEvent) * perRepeat
			c.KeyStatePerRepeat = float64(rf.Correct.KeyState) / float64(repeats)
		}
		out = append(out, c)
	}
	if rounds <= 1 {
		return out
	}
	// Sorted by round, then in the order of the rows of the first round
	// each row ran in (rounds rotate the order).
	slices.SortStableFunc(out, func(a, b ScaleOutRefresh) int { return a.Round - b.Round })
	perRound := slices.Clip(out)
	for i, c := range perRound {
		same := func(o ScaleOutRefresh) bool {
			return o.Mode == c.Mode && o.Instances == c.Instances && o.CPUCap == c.CPUCap
		}
		if slices.IndexFunc(perRound[:i], same) >= 0 {
			continue // not the row's first round
		}
		var cs []ScaleOutRefresh
		for _, o := range perRound {
			if same(o) {
				cs = append(cs, o)
			}
		}
		med := func(f func(ScaleOutRefresh) float64) float64 {
			vs := make([]float64, len(cs))
			for i, c := range cs {
				vs[i] = f(c)
			}
			return median(vs)
		}
		out = append(out, ScaleOutRefresh{Mode: c.Mode, Instances: c.Instances, CPUCap: c.CPUCap, MedianOf: len(cs),
			EventsVsWithout:    med(func(c ScaleOutRefresh) float64 { return c.EventsVsWithout }),
			StageCPUPerRepeat:  med(func(c ScaleOutRefresh) float64 { return c.StageCPUPerRepeat }),
			ServerCPUPerRepeat: med(func(c ScaleOutRefresh) float64 { return c.ServerCPUPerRepeat }),
			KeyStatePerRepeat:  med(func(c ScaleOutRefresh) float64 { return c.KeyStatePerRepeat })})
	}
	return out
}

// printScaleOut writes the scale-out table and the ratios.
func printScaleOut(w io.Writer, so *ScaleOutRun) {
	wl := so.Workload
	fmt.Fprintf(w, "scale-out workload: %s events (%s keyed, %s keys, %s repeats, %s without a usable key), ages %s, payload %d B, %d partitions, seed %d; backlog published with the group's consumers paused, then the drain timed\n",
		itoa(wl.Events), itoa(wl.Keyed), itoa(wl.Keys), itoa(wl.Repeats), itoa(wl.Bad), wl.Mix, wl.PayloadBytes, wl.Partitions, wl.Seed)
	if so.CgroupError != "" {
		fmt.Fprintf(w, "CPU caps NOT applied (every instance ran uncapped): %s\n", so.CgroupError)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "row\tinst\tcap\tforwards as\tevents/s\tdrain s\tstage CPU µs/ev\tmax inst cores\tserver CPU µs/ev\tother cores\tbatch\tnew/batch\tpublish ms (p99)\tcommit ms (p99)\trouted/s\tcopies/msg\tmoves\toutput\tfences\tkey-state\tlost\tdup\tDLQ/bad\t")
	for _, r := range so.Rows {
		capS := "-"
		if r.CPUCap > 0 {
			capS = fmt.Sprintf("%g", r.CPUCap)
			if !r.Capped {
				capS += " (not applied)"
			}
		}
		most := 0.0
		for _, pi := range r.PerInst {
			most = max(most, pi.Cores)
		}
		s, c := r.Stage, r.Correct
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.0f\t%.1f\t%.1f\t%.2f\t%.1f\t%.2f\t%.1f\t%.1f\t%.1f (%.0f)\t%.1f (%.0f)\t%.0f\t%.1f\t%.0f\t%d\t%d\t%d\t%d\t%d\t%d/%d\t\n",
			rowMode(r.Mode, r.Refresh), r.Instances, capS, r.Publish, r.EventsPerSec, r.DrainSeconds, r.StageCPUMicrosPerEvent, most, r.ServerCPUMicrosPerEvent, r.OtherCores,
			s.MeanBatchSize, s.NewPerBatch, s.PublishMeanMs, s.PublishP99Ms, s.CommitMeanMs, s.CommitP99Ms, s.RoutedPerSec, s.CopiesPerRouted, s.Takeovers,
			c.Output, c.Fences, c.KeyState, c.Lost, c.Duplicated, c.DeadLettered, c.DeadLetterWant)
	}
	tw.Flush()
	for _, r := range so.Rows {
		for _, n := range r.Notes {
			fmt.Fprintf(w, "note (%s): %s\n", r.Row, n)
		}
	}
	for _, r := range so.Ratios {
		fmt.Fprintf(w, "ratios (%s):", roundName(r.CPUCap, r.Round, r.MedianOf))
		for _, rn := range ratioNames {
			if v, ok := r.Ratios[rn.name]; ok {
				fmt.Fprintf(w, " %s %.2f;", rn.name, v)
			}
		}
		fmt.Fprintln(w, " (targets: header 1/off >= 0.5, subject 1/off >= 0.8; capped 2/1 >= 1.7, 3/1 >= 2.5; cpu 1/off <= 2)")
	}
	for _, r := range so.Refresh {
		fmt.Fprintf(w, "refresh_on_repeat (%s): %s x%d with over without: events/s %.2f; %+.1f stage CPU µs and %+.1f server CPU µs per repeat; %.2f key-state records per repeat\n",
			roundName(r.CPUCap, r.Round, r.MedianOf), r.Mode, r.Instances, r.EventsVsWithout, r.StageCPUPerRepeat, r.ServerCPUPerRepeat, r.KeyStatePerRepeat)
	}
	fmt.Fprintln(w)
}

// roundName names the cap and the round (or the medians) of a ratio.
func roundName(cpuCap float64, round, medianOf int) string {
	s := "uncapped"
	if cpuCap > 0 {
		s = fmt.Sprintf("cap %g core", cpuCap)
	}
	switch {
	case round > 0:
		s += fmt.Sprintf(", round %d", round)
	case medianOf > 0:
		s += fmt.Sprintf(", MEDIANS of %d rounds", medianOf)
	}
	return s
}
