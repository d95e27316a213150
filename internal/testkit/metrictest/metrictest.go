// Package metrictest reads metric values for tests: the sum of a metric's
// series from a prometheus.Gatherer (a registry of the test's own process),
// or from the Prometheus text format a process serves on /metrics. It is
// the one metric reader of the project's tests; a test with a lone
// collector at hand may use client_golang's testutil.ToFloat64 instead, and
// one that counts series testutil.GatherAndCount.
//
//	if got := metrictest.Sum(t, reg, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != 10 {
//		t.Errorf("%v keys forwarded, want 10", got)
//	}
//
// It is for tests only.
package metrictest

import (
	"strings"
	"testing"

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
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		tb.Fatalf("parse /metrics: %v", err)
	}
	mfs := make([]*dto.MetricFamily, 0, len(families))
	for _, mf := range families {
		mfs = append(mfs, mf)
	}
	v, _ := sum(mfs, name, labels)
	return v
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
