// Package metrictest reads metric values for tests and the bench: the sum
// of a metric's series from a prometheus.Gatherer (a registry of the
// test's own process), or from the Prometheus text format a process serves
// on /metrics; a histogram's count, sum and the bucket of a quantile; the
// difference of two scrapes. It is the one metric reader of the project's
// tests and bench; a test with a lone collector at hand may use
// client_golang's testutil.ToFloat64 instead, and one that counts series
// testutil.GatherAndCount.
//
//	if got := metrictest.Sum(t, reg, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != 10 {
//		t.Errorf("%v keys forwarded, want 10", got)
//	}
//
// The functions that take a testing.TB fail the test on an error; the
// bench reads a Families (Parse, Scrape, Gathered) and gets the error.
package metrictest

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sum returns the sum over the series of metric name in g whose labels
// include every pair in labels (nil: every series) of a counter's, gauge's
// or untyped metric's value, or a histogram's or summary's sample count.
// It is 0 when g has no such series (a vector before its first one); it
// fails the test when g cannot gather.
func Sum(tb testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	tb.Helper()
	v, _ := sum(gather(tb, g), name, labels)
	return v
}

// Lookup is Sum that also reports whether g has such a series at all.
func Lookup(tb testing.TB, g prometheus.Gatherer, name string, labels map[string]string) (v float64, ok bool) {
	tb.Helper()
	v, n := sum(gather(tb, g), name, labels)
	return v, n > 0
}

// Value is Sum of a metric that must be there: it fails the test when g
// has no series of name with labels, so that a want of 0 cannot pass on a
// metric that is missing.
func Value(tb testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	tb.Helper()
	v, ok := Lookup(tb, g, name, labels)
	if !ok {
		tb.Fatalf("no series %s%v", name, labels)
	}
	return v
}

// Histogram returns the one series of histogram name in g, and fails the
// test unless g has exactly one.
func Histogram(tb testing.TB, g prometheus.Gatherer, name string) *dto.Histogram {
	tb.Helper()
	for _, mf := range gather(tb, g) {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			if h := mf.GetMetric()[0].GetHistogram(); h != nil {
				return h
			}
		}
	}
	tb.Fatalf("no histogram %s with one series", name)
	return nil
}

// Text is Sum over body, a scrape of /metrics in the Prometheus text
// format; it fails the test when body does not parse.
func Text(tb testing.TB, body, name string, labels map[string]string) float64 {
	tb.Helper()
	fs, err := Parse(strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	return fs.Sum(name, labels)
}

// Families are the metric families of one gather or scrape.
type Families []*dto.MetricFamily

// Parse reads the Prometheus text format.
func Parse(r io.Reader) (Families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	fs := make(Families, 0, len(families))
	for _, mf := range families {
		fs = append(fs, mf)
	}
	return fs, nil
}

// Scrape reads http://addr/metrics, within 5 seconds.
func Scrape(ctx context.Context, addr string) (Families, error) {
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
	return Parse(io.LimitReader(resp.Body, 16<<20))
}

// Gathered gathers g.
func Gathered(g prometheus.Gatherer) (Families, error) {
	mfs, err := g.Gather()
	return Families(mfs), err
}

// Sum is the package's Sum over fs: 0 when fs has no such series.
func (fs Families) Sum(name string, labels map[string]string) float64 {
	v, _ := sum(fs, name, labels)
	return v
}

// Histogram returns the sample count and sum of histogram name over every
// series of it, and the upper bound of the bucket holding quantile q (0
// when q is 0 or there is no sample).
func (fs Families) Histogram(name string, q float64) (count, sum, bound float64) {
	buckets := map[float64]float64{}
	for _, m := range fs.metrics(name) {
		h := m.GetHistogram()
		count += float64(h.GetSampleCount())
		sum += h.GetSampleSum()
		for _, b := range h.GetBucket() {
			buckets[b.GetUpperBound()] += float64(b.GetCumulativeCount())
		}
	}
	buckets[math.Inf(1)] = count
	bounds := make([]float64, 0, len(buckets))
	for b := range buckets {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	for _, b := range bounds {
		if q > 0 && count > 0 && buckets[b] >= q*count {
			return count, sum, b
		}
	}
	return count, sum, 0
}

// Minus returns fs less before, series by series, for counters, untyped
// metrics and histograms (a series missing from before counts from 0);
// gauges keep fs's value. fs and before are not changed.
func (fs Families) Minus(before Families) Families {
	old := map[string]*dto.Metric{}
	for _, mf := range before {
		for _, m := range mf.GetMetric() {
			old[mf.GetName()+seriesOf(m)] = m
		}
	}
	out := make(Families, len(fs))
	for i, mf := range fs {
		d := &dto.MetricFamily{Name: mf.Name, Type: mf.Type}
		for _, m := range mf.GetMetric() {
			d.Metric = append(d.Metric, minus(m, old[mf.GetName()+seriesOf(m)]))
		}
		out[i] = d
	}
	return out
}

// minus returns a copy of m less b's counts (b may be nil).
func minus(m, b *dto.Metric) *dto.Metric {
	f := func(v float64) *float64 { return &v }
	u := func(v uint64) *uint64 { return &v }
	out := &dto.Metric{Label: m.Label, Gauge: m.Gauge}
	switch {
	case m.Counter != nil:
		out.Counter = &dto.Counter{Value: f(m.GetCounter().GetValue() - b.GetCounter().GetValue())}
	case m.Untyped != nil:
		out.Untyped = &dto.Untyped{Value: f(m.GetUntyped().GetValue() - b.GetUntyped().GetValue())}
	case m.Histogram != nil:
		h, bh := m.GetHistogram(), b.GetHistogram()
		out.Histogram = &dto.Histogram{SampleCount: u(h.GetSampleCount() - bh.GetSampleCount()), SampleSum: f(h.GetSampleSum() - bh.GetSampleSum())}
		for i, bk := range h.GetBucket() {
			c := bk.GetCumulativeCount()
			if i < len(bh.GetBucket()) && bh.GetBucket()[i].GetUpperBound() == bk.GetUpperBound() {
				c -= bh.GetBucket()[i].GetCumulativeCount()
			}
			out.Histogram.Bucket = append(out.Histogram.Bucket, &dto.Bucket{UpperBound: bk.UpperBound, CumulativeCount: u(c)})
		}
	}
	return out
}

// seriesOf names a series by its labels.
func seriesOf(m *dto.Metric) string {
	var b strings.Builder
	for _, lp := range m.GetLabel() {
		fmt.Fprintf(&b, "{%s=%q}", lp.GetName(), lp.GetValue())
	}
	return b.String()
}

// metrics returns the series of name.
func (fs Families) metrics(name string) []*dto.Metric {
	for _, mf := range fs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

// gather gathers g, failing the test when it cannot.
func gather(tb testing.TB, g prometheus.Gatherer) []*dto.MetricFamily {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatalf("gather: %v", err)
	}
	return mfs
}

// sum adds up the value of every series of name in mfs whose labels
// include labels, and returns how many series it added.
func sum(mfs []*dto.MetricFamily, name string, labels map[string]string) (float64, int) {
	total, n := 0.0, 0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			n++
			switch {
			case m.Counter != nil:
				total += m.GetCounter().GetValue()
			case m.Gauge != nil:
				total += m.GetGauge().GetValue()
			case m.Untyped != nil:
				total += m.GetUntyped().GetValue()
			case m.Histogram != nil:
				total += float64(m.GetHistogram().GetSampleCount())
			case m.Summary != nil:
				total += float64(m.GetSummary().GetSampleCount())
			}
		}
	}
	return total, n
}

// hasLabels reports whether m has every label pair in labels.
func hasLabels(m *dto.Metric, labels map[string]string) bool {
	found := 0
	for _, lp := range m.GetLabel() {
		if v, ok := labels[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			found++
		}
	}
	return found == len(labels)
}
