package history

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// FormatDuration writes d as a W is written in the configuration, without
// zero units: 3h10m, 52m3s, 1.5s, 40ms.
func FormatDuration(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Microsecond).String()
	}
	d = d.Round(time.Millisecond)
	if d >= time.Minute {
		d = d.Round(time.Second)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Count writes n with thousands separators: 1,234,567.
func Count(n uint64) string {
	s := strconv.FormatUint(n, 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// Percent writes a share as a percentage with two significant digits
// below 1 %: 0.05 %, 12.3 %.
func Percent(share float64) string {
	p := share * 100
	switch {
	case p == 0:
		return "0 %"
	case p < 1:
		return strconv.FormatFloat(p, 'g', 2, 64) + " %"
	}
	return strconv.FormatFloat(p, 'f', 1, 64) + " %"
}

// bytesText writes n in binary units with one decimal: 1.5 GiB.
func bytesText(n uint64) string {
	v, unit := float64(n), "B"
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	if unit == "B" {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

// barWidth is the longest bar of the terminal histogram.
const barWidth = 40

// WriteText writes the report for a reader.
func WriteText(w io.Writer, r Report) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("stream %s, sequences %d to %d, %s to %s\n", r.Stream, r.FirstSeq, r.LastSeq,
		r.First.UTC().Format(time.RFC3339), r.Last.UTC().Format(time.RFC3339))
	p("messages %s, distinct keys %s, repeats %s", Count(r.Messages), Count(r.Keys), Count(r.Repeats))
	if r.NewVersions > 0 {
		p(", newer versions %s", Count(r.NewVersions))
	}
	p("\nnew keys %.3g/s of the input's clock, %.1f bytes each on average\n", r.KeysPerSecond, r.KeyBytes)
	var dead uint64
	for _, d := range r.DeadLetters {
		dead += d.Count
	}
	p("\ndead letters run would make: %s\n", Count(dead))
	for _, d := range r.DeadLetters {
		e := d.Example
		p("  %-22s %12s  e.g. seq %d %s: %s\n", d.Reason, Count(d.Count), e.Seq, e.Subject, e.Detail)
	}
	if r.Repeats == 0 {
		p("\nno repeats\n")
	} else {
		a := r.Ages
		p("\nrepeat ages by the input's clock (percentiles within %.0f %%):\n", a.RelativeError*100+0.5)
		p("  p50 %s  p90 %s  p99 %s  p99.9 %s  max %s\n", FormatDuration(a.P50), FormatDuration(a.P90),
			FormatDuration(a.P99), FormatDuration(a.P999), FormatDuration(a.Max))
		var most uint64
		for _, b := range a.Histogram {
			most = max(most, b.Count)
		}
		for _, b := range a.Histogram {
			to := "    "
			if b.To < 1<<62 {
				to = FormatDuration(b.To)
			}
			n := int(b.Count * barWidth / max(most, 1))
			if n == 0 && b.Count > 0 {
				n = 1
			}
			p("  %6s - %-6s %12s  %s\n", FormatDuration(b.From), to, Count(b.Count), strings.Repeat("#", n))
		}
		p("\nslowest repeats:\n")
		for _, s := range r.Slowest {
			p("  %-10s key %q  seq %d (first seq %d) %s\n", FormatDuration(s.Age), s.Key, s.Seq, s.FirstSeq, s.Subject)
		}
	}
	p("\n%-22s %10s %14s %8s %14s %10s %10s %10s\n", "window", "W", "forwarded again", "share", "expected keys", "filter", "memory", "disk")
	for _, win := range r.Windows {
		sz := win.Sizing
		p("%-22s %10s %14s %8s %14s %10s %10s %10s", win.Name, FormatDuration(win.W), Count(win.ForwardedAgain),
			Percent(win.Share), Count(sz.ExpectedKeys), bytesText(sz.FilterBytes), bytesText(sz.MemoryBytes), bytesText(sz.DiskBytes))
		if sz.Error != "" {
			p("  (%s)", sz.Error)
		}
		p("\n")
	}
	p("\n%s\n", r.Recommendation)
}
