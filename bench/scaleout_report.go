package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/dedupe-stage/dedupe-stage/config"
)

// scaleOutRatios computes, per cap, the ratios the targets are stated in:
// with rounds above 1, each round's (of the rows run in that round) and
// then, per cap, the median of each ratio over the rounds.
func scaleOutRatios(rows []*ScaleOutRow, caps []float64, rounds int) []ScaleOutRatio {
	if rounds <= 1 {
		return roundRatios(rows, caps, 0)
	}
	var out, all []ScaleOutRatio
	for round := 1; round <= rounds; round++ {
		all = append(all, roundRatios(rows, caps, round)...)
	}
	out = append(out, all...)
	for _, c := range caps {
		var of []ScaleOutRatio
		for _, r := range all {
			if r.CPUCap == c {
				of = append(of, r)
			}
		}
		if len(of) == 0 {
			continue
		}
		med := func(f func(ScaleOutRatio) float64) float64 {
			var vs []float64
			for _, r := range of {
				if v := f(r); v > 0 {
					vs = append(vs, v)
				}
			}
			return median(vs)
		}
		out = append(out, ScaleOutRatio{CPUCap: c, MedianOf: len(of),
			HeaderVsOff:     med(func(r ScaleOutRatio) float64 { return r.HeaderVsOff }),
			SubjectVsOff:    med(func(r ScaleOutRatio) float64 { return r.SubjectVsOff }),
			Header2v1:       med(func(r ScaleOutRatio) float64 { return r.Header2v1 }),
			Header3v1:       med(func(r ScaleOutRatio) float64 { return r.Header3v1 }),
			Subject2v1:      med(func(r ScaleOutRatio) float64 { return r.Subject2v1 }),
			Subject3v1:      med(func(r ScaleOutRatio) float64 { return r.Subject3v1 }),
			CPUHeaderVsOff:  med(func(r ScaleOutRatio) float64 { return r.CPUHeaderVsOff }),
			CPUSubjectVsOff: med(func(r ScaleOutRatio) float64 { return r.CPUSubjectVsOff })})
	}
	return out
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

// roundRatios computes, per cap, the ratios of the rows of round.
func roundRatios(rows []*ScaleOutRow, caps []float64, round int) []ScaleOutRatio {
	var out []ScaleOutRatio
	for _, c := range caps {
		find := func(mode string, n int) *ScaleOutRow {
			for _, r := range rows {
				if r.Mode == mode && !r.Refresh && r.Instances == n && r.CPUCap == c && r.Round == round {
					return r
				}
			}
			return nil
		}
		div := func(a, b *ScaleOutRow, f func(*ScaleOutRow) float64) float64 {
			if a == nil || b == nil || f(b) == 0 {
				return 0
			}
			return f(a) / f(b)
		}
		eps := func(r *ScaleOutRow) float64 { return r.EventsPerSec }
		cpu := func(r *ScaleOutRow) float64 { return r.StageCPUMicrosPerEvent }
		off, h1, s1 := find(soOff, 1), find(soHeader, 1), find(soSubject, 1)
		r := ScaleOutRatio{CPUCap: c, Round: round,
			HeaderVsOff: div(h1, off, eps), SubjectVsOff: div(s1, off, eps),
			Header2v1: div(find(soHeader, 2), h1, eps), Header3v1: div(find(soHeader, 3), h1, eps),
			Subject2v1: div(find(soSubject, 2), s1, eps), Subject3v1: div(find(soSubject, 3), s1, eps),
			CPUHeaderVsOff: div(h1, off, cpu), CPUSubjectVsOff: div(s1, off, cpu)}
		if r != (ScaleOutRatio{CPUCap: c, Round: round}) {
			out = append(out, r)
		}
	}
	return out
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
		i := slices.IndexFunc(rows, func(r *ScaleOutRow) bool {
			return !r.Refresh && r.Mode == rf.Mode && r.Instances == rf.Instances && r.CPUCap == rf.CPUCap && r.Round == rf.Round
		})
		if i < 0 || rows[i].EventsPerSec <= 0 {
			continue
		}
		base := rows[i]
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
	type rowKey struct {
		mode      string
		instances int
		cpuCap    float64
	}
	var order []rowKey
	of := map[rowKey][]ScaleOutRefresh{}
	for _, c := range out {
		k := rowKey{c.Mode, c.Instances, c.CPUCap}
		if _, seen := of[k]; !seen {
			order = append(order, k)
		}
		of[k] = append(of[k], c)
	}
	for _, k := range order {
		cs := of[k]
		med := func(f func(ScaleOutRefresh) float64) float64 {
			vs := make([]float64, len(cs))
			for i, c := range cs {
				vs[i] = f(c)
			}
			return median(vs)
		}
		out = append(out, ScaleOutRefresh{Mode: k.mode, Instances: k.instances, CPUCap: k.cpuCap, MedianOf: len(cs),
			EventsVsWithout:    med(func(c ScaleOutRefresh) float64 { return c.EventsVsWithout }),
			StageCPUPerRepeat:  med(func(c ScaleOutRefresh) float64 { return c.StageCPUPerRepeat }),
			ServerCPUPerRepeat: med(func(c ScaleOutRefresh) float64 { return c.ServerCPUPerRepeat }),
			KeyStatePerRepeat:  med(func(c ScaleOutRefresh) float64 { return c.KeyStatePerRepeat })})
	}
	return out
}

// soDefaultAges is the scale-out mode's --ages default: the stage runs on
// the wall clock, so only the ages of the main phase (no copies near or
// past W).
const soDefaultAges = "burst=0.2,immediate=0.4,seconds=0.4"

// scaleOutFlags checks the scale-out flags and applies the mode's
// defaults to the flags not given (set): no fsync per message, 30%
// repeats, main-phase ages only.
func scaleOutFlags(f *flags, set map[string]bool) error {
	switch {
	case set["configs"]:
		return errors.New("--scaleout runs its own rows: leave --configs out")
	case f.natsURL != "":
		return errors.New("--scaleout starts its own cluster: leave --nats-url out")
	case f.scale != "":
		return errors.New("--scaleout and --scale: run them separately")
	case set["key"]:
		return errors.New("--scaleout runs each row with the key where the row says: leave --key out")
	case f.rounds > 20:
		return fmt.Errorf("--rounds %d: want 1..20 with --scaleout", f.rounds)
	}
	if !set["sync-always"] {
		f.syncAlways = false
	}
	if !set["repeat-ratio"] {
		f.repeatRatio = 0.3
	}
	if !set["ages"] {
		f.ages = soDefaultAges
	}
	mix, err := ParseMix(f.ages)
	if err != nil {
		return err
	}
	if mix[ClassNear] > 0 || mix[ClassPast] > 0 {
		return fmt.Errorf("--ages %q: the scale-out mode runs the stage on the wall clock, so it has no near or past copies", f.ages)
	}
	if err := scaleOutLists(f); err != nil {
		return err
	}
	switch {
	case len(f.soModes) == 0:
		return errors.New("--scaleout-rows is empty")
	case len(f.cpuCaps) == 0:
		return errors.New("--cpu-cap is empty (0 for uncapped)")
	case len(f.soInstances) == 0 && slices.ContainsFunc(f.soModes, func(m string) bool { return m != soOff && m != soOff+soRefresh }):
		return errors.New("--scaleout-instances is empty")
	case f.badRatio < 0 || f.badRatio >= 0.5:
		return fmt.Errorf("--bad-ratio %v: want 0 <= r < 0.5", f.badRatio)
	case f.replicas < 1 || f.replicas > 3:
		return fmt.Errorf("--replicas %d: want 1..3 (the cluster has 3 nodes)", f.replicas)
	case f.soAckWait < config.MinScaleOutAckWait:
		return fmt.Errorf("--scaleout-ack-wait %v: want at least %v", f.soAckWait, config.MinScaleOutAckWait)
	}
	return nil
}

// scaleOutLists parses the lists that name the scale-out rows (modes,
// instance counts, CPU caps) into f, each value once.
func scaleOutLists(f *flags) error {
	for m := range strings.SplitSeq(f.soRows, ",") {
		if m = strings.TrimSpace(m); m == "" {
			continue
		}
		switch mode, _ := strings.CutSuffix(m, soRefresh); mode {
		case soOff, soHeader, soSubject:
			if !slices.Contains(f.soModes, m) {
				f.soModes = append(f.soModes, m)
			}
		default:
			return fmt.Errorf("--scaleout-rows: unknown %q (want off, header, subject, each optionally followed by %s)", m, soRefresh)
		}
	}
	for s := range strings.SplitSeq(f.soInst, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > f.partitions {
			return fmt.Errorf("--scaleout-instances: %q, want 1..%d (a group cannot use more instances than --partitions)", s, f.partitions)
		}
		if !slices.Contains(f.soInstances, n) {
			f.soInstances = append(f.soInstances, n)
		}
	}
	for s := range strings.SplitSeq(f.soCaps, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		c, err := strconv.ParseFloat(s, 64)
		if err != nil || c < 0 || c > 64 || (c > 0 && c*cgroupPeriod < 1000) {
			return fmt.Errorf("--cpu-cap: %q, want 0 (uncapped) or 0.01..64 cores", s)
		}
		if !slices.Contains(f.cpuCaps, c) {
			f.cpuCaps = append(f.cpuCaps, c)
		}
	}
	return nil
}

// scaleOutCorrect reports whether every row ran matched the ground truth.
func scaleOutCorrect(so *ScaleOutRun) bool {
	if so == nil {
		return true
	}
	for _, r := range so.Rows {
		if !r.Correct.OK {
			return false
		}
	}
	return true
}

// printScaleOut writes the scale-out table and the ratios.
func printScaleOut(w io.Writer, so *ScaleOutRun) {
	wl := so.Workload
	fmt.Fprintf(w, "scale-out workload: %s events (%s keyed, %s keys, %s repeats, %s without a usable key), ages %s, payload %d B, %d partitions, seed %d; backlog published with the group's consumers paused, then the drain timed\n",
		itoa(int64(wl.Events)), itoa(int64(wl.Keyed)), itoa(int64(wl.Keys)), itoa(int64(wl.Repeats)), itoa(int64(wl.Bad)), wl.Mix, wl.PayloadBytes, wl.Partitions, wl.Seed)
	if so.CgroupError != "" {
		fmt.Fprintf(w, "CPU caps NOT applied (every instance ran uncapped): %s\n", so.CgroupError)
	}
	if so.Kept {
		fmt.Fprintf(w, "logs and configurations: %s/rows\n", so.Dir)
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
	ratio := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", v)
	}
	for _, r := range so.Ratios {
		capS := roundName(r.CPUCap, r.Round, r.MedianOf)
		fmt.Fprintf(w, "ratios (%s): on/off 1 instance: header %s (target >= 0.5), subject %s (>= 0.8); header 2/1 %s, 3/1 %s; subject 2/1 %s, 3/1 %s (capped targets >= 1.7, >= 2.5); CPU µs/event on/off: header %s, subject %s (<= 2)\n",
			capS, ratio(r.HeaderVsOff), ratio(r.SubjectVsOff), ratio(r.Header2v1), ratio(r.Header3v1), ratio(r.Subject2v1), ratio(r.Subject3v1),
			ratio(r.CPUHeaderVsOff), ratio(r.CPUSubjectVsOff))
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
