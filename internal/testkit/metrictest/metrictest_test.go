package metrictest

import (
	"bytes"
	"math"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
)

// TestSumValueAndTextAgree reads the same registry gathered and as the
// text /metrics serves, by label and over every series.
func TestSumValueAndTextAgree(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "c"}, []string{"outcome", "p"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "g"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Help: "h"})
	reg.MustRegister(c, g, h)
	c.WithLabelValues("new", "0").Add(2)
	c.WithLabelValues("new", "1").Add(3)
	c.WithLabelValues("repeat", "0").Add(7)
	h.Observe(1)
	h.Observe(2)

	var buf bytes.Buffer
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"c_total", nil, 12},
		{"c_total", map[string]string{"outcome": "new"}, 5},
		{"c_total", map[string]string{"outcome": "new", "p": "1"}, 3},
		{"c_total", map[string]string{"outcome": "gone"}, 0},
		{"c_total", map[string]string{"other": "x"}, 0},
		{"g", nil, 0},
		{"h", nil, 2},
		{"absent", nil, 0},
	} {
		if got := Sum(t, reg, tt.name, tt.labels); got != tt.want {
			t.Errorf("Sum(%s%v) = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
		if got := Text(t, buf.String(), tt.name, tt.labels); got != tt.want {
			t.Errorf("Text(%s%v) = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
	}
	if _, ok := Lookup(t, reg, "c_total", map[string]string{"outcome": "gone"}); ok {
		t.Errorf("Lookup finds a series c_total{outcome=gone} that is not there")
	}
	if got := Value(t, reg, "g", nil); got != 0 {
		t.Errorf("Value(g) = %v, want 0", got)
	}
	if got := Histogram(t, reg, "h").GetSampleSum(); got != 3 {
		t.Errorf("Histogram(h) sums to %v, want 3", got)
	}
}

// TestFamiliesOverTwoScrapes reads a histogram's count, sum and p99 bucket
// and a counter by an escaped label from the difference of two scrapes of
// the text a real registry serves, as the bench reads the instances'
// /metrics over a drain.
func TestFamiliesOverTwoScrapes(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dedupe_publish_seconds", Buckets: prometheus.ExponentialBuckets(0.001, 2, 10)})
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total"}, []string{"path"})
	reg.MustRegister(h, c)
	scrape := func() Families {
		rec := httptest.NewRecorder()
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		fs, err := Parse(rec.Body)
		if err != nil {
			t.Fatal(err)
		}
		return fs
	}
	for range 50 {
		h.Observe(0.5) // before: not part of the difference
	}
	c.WithLabelValues(`a"b`).Add(2)
	before := scrape()
	for i := range 100 {
		h.Observe(0.003)
		if i == 0 {
			h.Observe(0.1)
		}
	}
	c.WithLabelValues(`a"b`).Add(5)
	c.WithLabelValues("new").Add(1)
	d := scrape().Minus(before)
	if count, sum, p99 := d.Histogram("dedupe_publish_seconds", 0.99); count != 101 || math.Abs(sum-(100*0.003+0.1)) > 1e-9 || p99 != 0.004 {
		t.Errorf("count %v, sum %v, p99 bucket %v; want 101, 0.4, 0.004", count, sum, p99)
	}
	if got := d.Sum("c_total", map[string]string{"path": `a"b`}); got != 5 {
		t.Errorf(`c_total{path="a\"b"} over the two scrapes %v, want 5`, got)
	}
	if got := d.Sum("c_total", nil); got != 6 {
		t.Errorf("c_total over the two scrapes %v, want 6", got)
	}
}
