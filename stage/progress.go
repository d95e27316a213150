package stage

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/state"
)

// newFilterProgressMetric registers dedupe_filter_rebuild_keys_scanned on
// reg and returns the state.Options.OnFilterProgress that sets it: the
// records each partition's filter build has read at start, rising every
// progress interval while a rebuild or a snapshot's top-up runs, and final
// once the build is done. The state logs the same progress with the rate
// and the estimated time left.
func newFilterProgressMetric(reg prometheus.Registerer) func(state.FilterProgress) {
	scanned := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "dedupe_filter_rebuild_keys_scanned",
		Help: "Records read by the partition's filter build at start (a rebuild from the store or the top-up of a snapshot): rising while it runs, final once the filters are ready.",
	}, []string{"partition"})
	reg.MustRegister(scanned)
	return func(fp state.FilterProgress) {
		scanned.WithLabelValues(strconv.Itoa(fp.Partition)).Set(float64(fp.Scanned))
	}
}
