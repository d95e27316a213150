package main

import (
	"bytes"
	"fmt"
	"html"
	"io"
	"math"
	"text/tabwriter"
)

// printTables writes the results as plain-text tables.
func printTables(w io.Writer, res *Results) {
	m := res.Machine
	fmt.Fprintf(w, "\nsettings: %s\n", res.Settings)
	fmt.Fprintf(w, "machine: %d CPUs (%s), %s, %s, fsync p50 %.0fµs p99 %.0fµs, %s\n", m.NumCPU, m.CPUModel, m.MemTotal, m.Disk, m.FsyncP50us, m.FsyncP99us, m.GoVersion)
	if wi := res.Workload; wi != nil {
		fmt.Fprintf(w, "workload: %s events (%s timed backlog + %s near/past copies judged after it), %s keys, %s repeats (%s; bursts of %d), payload %d B, key %d B from %s, W %s, first copies over %s, seed %d; filter sized for %s keys\n",
			itoa(int64(wi.Events)), itoa(int64(wi.MainEvents)), itoa(int64(wi.LateEvents)), itoa(int64(wi.Keys)), itoa(int64(wi.Repeats)), wi.Mix, wi.BurstSize,
			wi.PayloadBytes, wi.KeyBytes, wi.KeySource, wi.Window, wi.Span, wi.Seed, itoa(int64(wi.FilterExpected)))
		fmt.Fprintf(w, "latency phase: %s events (%s keys) paced at %.0f events/s after each drain\n\n", itoa(int64(wi.LatencyEvents)), itoa(int64(wi.LatencyKeys)), wi.LatencyRatePerSec)
	}
	if res.ScaleOut != nil {
		printScaleOut(w, res.ScaleOut)
	}
	if len(res.Results) > 0 {
		printResults(w, res)
	}
	if len(res.Scale) > 0 {
		printScale(w, res)
	}
	if h := res.Headline; h != nil {
		printHeadline(w, h)
	}
}

// resultFor returns the last of results of configuration k, nil when none is.
func resultFor(results []*Result, k Kind) *Result {
	var found *Result
	for _, r := range results {
		if r.Config == string(k) {
			found = r
		}
	}
	return found
}

// printResults prints the configurations' tables and their notes.
func printResults(w io.Writer, res *Results) {
	var raw float64
	if r := resultFor(res.Results, KindRaw); r != nil {
		raw = r.EventsPerSec
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "config\tevents/s\tvs raw\tdrain s\tCPU µs/event\tother load\tp50 ms\tp99 ms\tp99.9 ms\tRSS MiB\theap MiB\tpeak RSS MiB\texpected\toutput\tlost\tduplicated\tdead-lettered\t")
	for _, r := range res.Results {
		vs := "-"
		if raw > 0 {
			vs = fmt.Sprintf("%.2f", r.EventsPerSec/raw)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f\t%.1f\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t\n", r.Config, r.EventsPerSec, vs, r.DrainSeconds,
			r.CPUMicrosPerEvent, r.DrainCPU.OtherCores, r.Latency.P50ms, r.Latency.P99ms, r.Latency.P999ms, mib(r.MemAfter.RSS), mib(r.MemAfter.Heap), mib(r.MemAfter.PeakRSS),
			r.Correctness.Expected, r.Correctness.Output+r.Correctness.DroppedByOutput*boolInt(isStage(r.Config)), r.Correctness.Lost, r.Correctness.Duplicated, r.Correctness.DeadLettered)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "config\ttracked keys\tdedupe RAM MiB\tRAM B/key\tfilter B/key\tdisk MiB\tdisk B/key\tstore reads/event\tskip ratio\tFP observed\tFP estimated\tstart-up ms empty\tsnapshot\trebuild\t")
	for _, r := range res.Results {
		if Kind(r.Config).isRaw() {
			fmt.Fprintf(tw, "%s\t0\t(%s)\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t\n", r.Config, mib(r.DedupeHeapBytes))
			continue
		}
		if r.Config == string(KindJetStream) {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t\n", r.Config, r.TrackedKeys, mib(r.DedupeHeapBytes), r.RAMPerKey)
			continue
		}
		fb, skip, fp, est, rebuild := "-", "-", "-", "-", "-"
		if Kind(r.Config).filtered() {
			fb = fmt.Sprintf("%.2f", float64(r.FilterBytes)/float64(r.TrackedKeys))
			skip, fp, est = fmt.Sprintf("%.3f", r.SkipRatio), fmt.Sprintf("%.4f", r.FalsePositiveRate), fmt.Sprintf("%.4f", r.EstimatedFPRate)
			rebuild = fmt.Sprintf("%.0f", r.Startup.RebuildMs)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f\t%s\t%s\t%.1f\t%.3f\t%s\t%s\t%s\t%.0f\t%.0f\t%s\t\n", r.Config, r.TrackedKeys, mib(r.DedupeHeapBytes), r.RAMPerKey, fb,
			mib(r.DiskBytes), r.DiskPerKey, r.StoreReadsPerEvent, skip, fp, est, r.Startup.EmptyMs, r.Startup.SnapshotMs, rebuild)
	}
	tw.Flush()
	for _, r := range res.Results {
		if len(r.AllRounds) > 1 {
			fmt.Fprintf(w, "note (%s): events/s of each round %.0f; the table shows round %d (the median)\n", r.Config, r.AllRounds, r.Round)
		}
		if si := r.Stage; si != nil {
			fmt.Fprintf(w, "note (%s): %d batches, mean %.1f messages; publish mean %.2f ms (p99 <= %.2f); commit mean %.2f ms (p99 <= %.2f)\n",
				r.Config, si.Batches, si.MeanBatchSize, si.PublishMeanMs, si.PublishP99Ms, si.CommitMeanMs, si.CommitP99Ms)
		}
		for _, n := range r.Notes {
			fmt.Fprintf(w, "note (%s): %s\n", r.Config, n)
		}
		if isStage(r.Config) {
			fmt.Fprintf(w, "note (%s): %d late copies in %d groups: %d forwarded again past W, %d repeats near the end (stage counted %.0f); drain clock lag max %.4fW over %d keys\n",
				r.Config, r.LateEvents, r.LateGroups, r.ForwardedAgain, r.NearExpected, r.NearWindowEnd, r.ClockLagMaxW, r.ClockLagSample)
		}
	}
	fmt.Fprintln(w)
}

// printScale prints the scale points' table and its notes.
func printScale(w io.Writer, res *Results) {
	var jsPerID float64
	if r := resultFor(res.Results, KindJetStream); r != nil {
		jsPerID = r.RAMPerKey
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	// "While writing" is the store still open right after the fill:
	// Badger's table builders (pooled, up to 8 per partition) are then
	// live. The other memory columns are after a reopen.
	fmt.Fprintln(tw, "scale keys\tfill s\tfill keys/s\twhile writing: heap / anon / peak RSS MiB\tRSS MiB (anon/file)\tRSS B/key (anon/file)\tmarginal B/key (anon/file)\theap B/key\tfilter B/key\tdisk MiB\tdisk B/key\tstart-up snapshot ms\trebuild ms\tJetStream ids heap MiB\t")
	for _, p := range res.Scale {
		js := "-"
		if jsPerID > 0 {
			js = fmt.Sprintf("%s (extrapolated)", mib(int64(jsPerID*float64(p.Keys))))
		}
		label := itoa(int64(p.Keys))
		if p.Extrapolated {
			label += " (extrapolated)"
		}
		marginal := "-"
		if m := p.Marginal; m != nil {
			marginal = fmt.Sprintf("%.2f (%.2f/%.2f)", m.RSSPerKey, m.AnonPerKey, m.FilePerKey)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%s / %s / %s\t%s (%s/%s)\t%.2f (%.2f/%.2f)\t%s\t%.1f\t%.2f\t%s\t%.1f\t%.0f\t%.0f\t%s\t\n", label, p.FillSec, p.FillPerSec,
			mib(p.AfterFill.Heap), mib(p.AfterFill.RSSAnon), mib(p.AfterFill.PeakRSS),
			mib(p.AfterOpen.RSS), mib(p.AfterOpen.RSSAnon), mib(p.AfterOpen.RSSFile), p.RSSPerKey, p.RSSAnonPerKey, p.RSSFilePerKey, marginal,
			p.HeapPerKey, p.FilterPerKey, mib(p.DiskBytes), p.DiskPerKey, p.StartupSnapshotMs, p.StartupRebuildMs, js)
	}
	tw.Flush()
	if p := lastMeasured(res.Scale); p != nil && p.Marginal != nil {
		m := p.Marginal
		fmt.Fprintf(w, "marginal RSS per key between the two largest measured points (%d to %d keys): %.2f B (anon %.2f, file %.2f); fixed part (the line at 0 keys) %s MiB\n",
			m.FromKeys, m.ToKeys, m.RSSPerKey, m.AnonPerKey, m.FilePerKey, mib(m.FixedRSS))
	}
	for _, p := range res.Scale {
		if p.Note != "" {
			fmt.Fprintf(w, "note (scale %d): %s\n", p.Keys, p.Note)
		}
	}
	fmt.Fprintln(w)
}

// printHeadline prints the headline ratios against their targets.
// A ratio whose configurations did not run is left out.
func printHeadline(w io.Writer, h *Headline) {
	if h.StageVsRaw > 0 || h.NoFilterVsRaw > 0 || h.JetStreamVsRaw > 0 {
		fmt.Fprintf(w, "headline: stage-bloom %.2fx raw events/s (target >= 0.90 without fsync); stage-nofilter %.2fx; jetstream %.2fx\n", h.StageVsRaw, h.NoFilterVsRaw, h.JetStreamVsRaw)
	}
	if h.StageVsRawAtomic > 0 || h.StageVsJetStream > 0 {
		fmt.Fprintf(w, "headline: stage-bloom %.2fx raw-atomic events/s (target >= 0.70 with fsync always); %.2fx jetstream (target >= 5)\n", h.StageVsRawAtomic, h.StageVsJetStream)
	}
	if h.RAMRatio > 0 || h.RAMRatioMarginal > 0 {
		fmt.Fprintf(w, "headline: jetstream RAM per key / stage-bloom RAM per key = %.1fx at this key count (target >= 40)", h.RAMRatio)
		if h.RAMRatioMarginal > 0 {
			fmt.Fprintf(w, "; %.1fx against the stage's marginal RSS per key (scale mode)", h.RAMRatioMarginal)
		}
		fmt.Fprintln(w)
	}
	if h.RefreshVsBloom > 0 {
		fmt.Fprintf(w, "headline: stage-refresh %.2fx stage-bloom events/s; %+.1f CPU µs per repeat (window.refresh_on_repeat's cost)\n", h.RefreshVsBloom, h.RefreshCPUPerRepeat)
	}
	fmt.Fprintf(w, "headline: all configurations correct (nothing lost, duplicated or dead-lettered): %v\n", h.AllCorrect)
}

func isStage(config string) bool { return Kind(config).isStage() }

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// bar is one bar of a chart.
type bar struct {
	label, value, color string
	v                   float64
}

var kindColor = map[string]string{
	string(KindRaw):           "#8c8c8c",
	string(KindRawAtomic):     "#5e5e5e",
	string(KindJetStream):     "#e8743b",
	string(KindStageBloom):    "#2b7bba",
	string(KindStageNoFilter): "#8fbde6",
	string(KindStageRefresh):  "#1b4f7a",
}

// renderSVG draws bar charts of throughput and of RAM per tracked key
// across the configurations, and RSS per key at each scale point when the
// scale mode ran.
func renderSVG(res *Results) []byte {
	panels := 0
	if len(res.Results) > 0 {
		panels += 2
	}
	if len(res.Scale) > 0 {
		panels++
	}
	const pw, ph, top = 440, 330, 70
	width := max(1, panels) * pw
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif">`+"\n", width, ph+top+50, width, ph+top+50)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	title := "dedupe-stage benchmark"
	sub := ""
	if wi := res.Workload; wi != nil {
		title = fmt.Sprintf("dedupe-stage vs peers: %s events, %.0f%% repeats, W %s", itoa(int64(wi.Events)), 100*float64(wi.Repeats)/float64(wi.Events), wi.Window)
	}
	m := res.Machine
	sub = fmt.Sprintf("%d CPUs (%s), %s; %s; same workload, one run", m.NumCPU, m.CPUModel, m.GoVersion, res.Settings)
	fmt.Fprintf(&b, `<text x="16" y="28" font-size="18" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	fmt.Fprintf(&b, `<text x="16" y="50" font-size="12" fill="#555">%s</text>`+"\n", html.EscapeString(sub))
	x := 0
	if len(res.Results) > 0 {
		var thr, ram []bar
		var raw float64
		if r := resultFor(res.Results, KindRaw); r != nil {
			raw = r.EventsPerSec
		}
		for _, r := range res.Results {
			v := fmt.Sprintf("%.0f/s", r.EventsPerSec)
			if raw > 0 && r.Config != string(KindRaw) {
				v += fmt.Sprintf(" (%.0f%%)", 100*r.EventsPerSec/raw)
			}
			if !r.Correctness.OK {
				v += " INCORRECT"
			}
			thr = append(thr, bar{label: r.Config, v: r.EventsPerSec, value: v, color: kindColor[r.Config]})
			if Kind(r.Config).isRaw() {
				ram = append(ram, bar{label: r.Config, v: 0, value: "no keys", color: kindColor[r.Config]})
				continue
			}
			ram = append(ram, bar{label: r.Config, v: r.RAMPerKey, value: fmt.Sprintf("%.1f B", r.RAMPerKey), color: kindColor[r.Config]})
		}
		if m := marginalPerKey(res.Scale); m > 0 {
			ram = append(ram, bar{label: "stage, per extra key", v: m, value: fmt.Sprintf("%.1f B", m), color: "#1a4f7a"})
		}
		barChart(&b, x, top, pw, ph, "Throughput, draining a backlog (events/s)", thr)
		x += pw
		barChart(&b, x, top, pw, ph, "Dedupe RAM per tracked key (bytes)", ram)
		x += pw
	}
	if len(res.Scale) > 0 {
		var sc []bar
		for _, p := range res.Scale {
			label := shortCount(p.Keys) + " keys"
			color := "#2b7bba"
			if p.Extrapolated {
				label += "*"
				color = "#c6dbef"
			}
			sc = append(sc, bar{label: label, v: p.RSSPerKey, value: fmt.Sprintf("%.1f B", p.RSSPerKey), color: color})
		}
		barChart(&b, x, top, pw, ph, "Stage state RSS per key, by keys (bytes)", sc)
	}
	for i, line := range []string{
		"Dedupe RAM: stage = Go heap freed by closing the store (Badger memtables and caches + Bloom filters);",
		"jetstream = nats-server heap freed by dropping the output stream's dedupe map. Per extra key: RSS slope of the scale mode. * extrapolated.",
	} {
		fmt.Fprintf(&b, `<text x="16" y="%d" font-size="11" fill="#555">%s</text>`+"\n", ph+top+16+14*i, html.EscapeString(line))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// barChart draws a vertical bar chart in the box (x, y, w, h).
func barChart(b *bytes.Buffer, x, y, w, h int, title string, bars []bar) {
	const left, bottom, topPad = 20, 60, 40
	fmt.Fprintf(b, `<g transform="translate(%d,%d)">`+"\n", x, y)
	fmt.Fprintf(b, `<text x="%d" y="16" font-size="14" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	maxV := 0.0
	for _, br := range bars {
		maxV = math.Max(maxV, br.v)
	}
	if maxV == 0 {
		maxV = 1
	}
	plotH := h - bottom - topPad
	base := topPad + plotH
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", left, base, w-20, base)
	slot := (w - left - 20) / max(1, len(bars))
	bw := slot * 6 / 10
	for i, br := range bars {
		bh := int(float64(plotH) * br.v / maxV)
		bx := left + i*slot + (slot-bw)/2
		if bh > 0 {
			fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"/>`+"\n", bx, base-bh, bw, bh, br.color)
		}
		fmt.Fprintf(b, `<text x="%d" y="%d" font-size="11" text-anchor="middle">%s</text>`+"\n", bx+bw/2, base-bh-6, html.EscapeString(br.value))
		fmt.Fprintf(b, `<text x="%d" y="%d" font-size="11" text-anchor="middle">%s</text>`+"\n", bx+bw/2, base+16, html.EscapeString(br.label))
	}
	b.WriteString("</g>\n")
}

// shortCount formats 1000000 as 1M, 50000000 as 50M, 20000 as 20k.
func shortCount(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1000:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}
