package metrictest

import (
	"bytes"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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
