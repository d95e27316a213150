package stage

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestHistogramQuantile: the p99 the status answer carries is the one
// histogram_quantile gives on the same buckets: interpolated inside the
// bucket that holds it, from 0 in the first, and the highest finite bound
// past it.
func TestHistogramQuantile(t *testing.T) {
	for _, c := range []struct {
		name    string
		samples []float64
		q, want float64
	}{
		// 100 ages in (30, 60]: the rank 99 is 99% of the way through it.
		{"one bucket", repeatN(45, 100), 0.99, 30 + 30*0.99},
		// 1 of 4 under 1s: the quarter-quantile is the first bucket's top.
		{"first bucket from 0", []float64{0.5, 40, 40, 40}, 0.25, 1},
		// 99 in (1, 2], 1 in (5, 10]: the rank 99 ends the (1, 2] bucket.
		{"bucket edge", append(repeatN(1.5, 99), 7), 0.99, 2},
		// Past the last bound (30 days): that bound.
		{"past the last bound", repeatN(90*86400, 10), 0.99, 30 * 86400},
	} {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Buckets: RepeatAgeBuckets})
		for _, s := range c.samples {
			h.Observe(s)
		}
		var m dto.Metric
		if err := h.Write(&m); err != nil {
			t.Fatal(err)
		}
		if got := histogramQuantile(c.q, m.GetHistogram()); got < c.want-1e-9 || got > c.want+1e-9 {
			t.Errorf("%s: quantile %v = %v, want %v", c.name, c.q, got, c.want)
		}
	}
}

func repeatN(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}
