package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// series are the samples of a Prometheus text exposition, keyed by the
// series as printed (name and labels, e.g. `dedupe_batch_messages_bucket{le="8"}`).
type series map[string]float64

// scrape reads http://addr/metrics.
func scrape(ctx context.Context, addr string) (series, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", addr, resp.Status)
	}
	return parseSeries(io.LimitReader(resp.Body, 16<<20))
}

// parseSeries parses the text exposition format into one series per
// sample, histograms and summaries as their _bucket, quantile, _sum and
// _count series.
func parseSeries(r io.Reader) (series, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	out := series{}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			ls := m.GetLabel()
			switch {
			case m.Histogram != nil:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					out[seriesKey(name+"_bucket", ls, "le", formatBound(b.GetUpperBound()))] = float64(b.GetCumulativeCount())
				}
				out[seriesKey(name+"_sum", ls)] = h.GetSampleSum()
				out[seriesKey(name+"_count", ls)] = float64(h.GetSampleCount())
			case m.Summary != nil:
				sm := m.GetSummary()
				for _, q := range sm.GetQuantile() {
					out[seriesKey(name, ls, "quantile", formatBound(q.GetQuantile()))] = q.GetValue()
				}
				out[seriesKey(name+"_sum", ls)] = sm.GetSampleSum()
				out[seriesKey(name+"_count", ls)] = float64(sm.GetSampleCount())
			case m.Counter != nil:
				out[seriesKey(name, ls)] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[seriesKey(name, ls)] = m.GetGauge().GetValue()
			case m.Untyped != nil:
				out[seriesKey(name, ls)] = m.GetUntyped().GetValue()
			}
		}
	}
	return out, nil
}

// labelEscaper escapes a label value as the text format prints it.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// seriesKey prints a series as the text format does: name{k="v",...},
// with extra (a name, a value) as the last label.
func seriesKey(name string, labels []*dto.LabelPair, extra ...string) string {
	var parts []string
	for _, l := range labels {
		parts = append(parts, l.GetName()+`="`+labelEscaper.Replace(l.GetValue())+`"`)
	}
	if len(extra) == 2 {
		parts = append(parts, extra[0]+`="`+extra[1]+`"`)
	}
	if len(parts) == 0 {
		return name
	}
	return name + "{" + strings.Join(parts, ",") + "}"
}

// formatBound prints a bucket's bound or a quantile as the text format does.
func formatBound(f float64) string {
	if math.IsInf(f, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// minus returns s - before, series by series (a series missing before
// counts from 0).
func (s series) minus(before series) series {
	out := series{}
	for k, v := range s {
		out[k] = v - before[k]
	}
	return out
}

// add adds o into s.
func (s series) add(o series) {
	for k, v := range o {
		s[k] += v
	}
}

// sum returns the sum of every series of metric name whose labels contain
// each of labels (`key="value"`).
func (s series) sum(name string, labels ...string) float64 {
	total := 0.0
	for k, v := range s {
		if k != name && !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(k, l)
		}
		if ok {
			total += v
		}
	}
	return total
}

// histogram returns the count and sum of histogram name and the upper
// bound of the bucket holding quantile q, over every series of it.
func (s series) histogram(name string, q float64) (count, sum, quantile float64) {
	count, sum = s.sum(name+"_count"), s.sum(name+"_sum")
	buckets := map[float64]float64{}
	prefix := name + "_bucket{"
	for k, v := range s {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		i := strings.Index(k, `le="`)
		if i < 0 {
			continue
		}
		le := k[i+4:]
		le = le[:strings.IndexByte(le, '"')]
		b := math.Inf(1)
		if le != "+Inf" {
			var err error
			if b, err = strconv.ParseFloat(le, 64); err != nil {
				continue
			}
		}
		buckets[b] += v
	}
	bounds := make([]float64, 0, len(buckets))
	for b := range buckets {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	for _, b := range bounds {
		if count > 0 && buckets[b] >= q*count {
			return count, sum, b
		}
	}
	return count, sum, 0
}
