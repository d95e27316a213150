package stage

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Inspect tells whether key is inside the window, when it was first seen
// and when it leaves the window. key is the full key as stored (with its
// scope prefix when a scope is configured).
func (st *Health) Inspect(key string) (admin.Inspection, error) {
	st.mu.Lock()
	store, win := st.store, st.win
	st.mu.Unlock()
	if len(key) > state.MaxKeySize {
		return admin.Inspection{}, fmt.Errorf("%w: %d bytes, the longest key is %d", admin.ErrBadInspectKey, len(key), state.MaxKeySize)
	}
	if store == nil {
		return admin.Inspection{}, errors.New("state is not open yet")
	}
	rec, p, found, err := store.Find([]byte(key))
	if err != nil {
		if errors.Is(err, state.ErrBadKey) {
			return admin.Inspection{}, fmt.Errorf("%w: %w", admin.ErrBadInspectKey, err)
		}
		return admin.Inspection{}, fmt.Errorf("inspect %q: %w", key, err)
	}
	in := admin.Inspection{Key: key, Found: found, Window: win.W.String()}
	if found {
		asOf := store.Partition(p).Newest()
		first, leaves := rec.FirstSeen.UTC(), win.ExpiresAt(rec.WindowStart()).UTC()
		in.Partition, in.FirstSeen, in.LeavesAt = p, &first, &leaves
		in.InsideWindow = rec.Forgotten.IsZero() && (asOf.IsZero() || win.Inside(rec.WindowStart(), asOf))
		if rec.HasVersion {
			v := rec.Version
			in.Version = &v
		}
		if !rec.Forgotten.IsZero() {
			f := rec.Forgotten.UTC()
			in.Forgotten = &f
		}
		if rec.OutputSeq != 0 {
			seq := rec.OutputSeq
			in.OutputSeq = &seq
		}
		if !asOf.IsZero() {
			a := asOf.UTC()
			in.AsOf = &a
			in.Age = win.Age(rec.FirstSeen, asOf).Round(time.Millisecond).String()
		}
		in.Fingerprint = fmt.Sprintf("%016x", rec.Fingerprint)
	}
	return in, nil
}

// NewHandler serves the operator endpoints:
//
//	/metrics         Prometheus metrics from g
//	/healthz         200 while nothing keeps failing, else 503 with what fails
//	/readyz          200 once every filter is ready and while healthy, else 503;
//	                 with scale-out, lists the partitions being restored
//	/inspect?key=K   JSON: whether K is inside the window, first seen, leaves at
//
// It is NewHealthHandler and NewInspectHandler on one mux.
func NewHandler(g prometheus.Gatherer, st *Health) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", NewHealthHandler(g, st))
	mux.Handle("/inspect", NewInspectHandler(st))
	return mux
}

// NewHealthHandler serves /metrics, /healthz and /readyz (see NewHandler),
// without /inspect.
func NewHealthHandler(g prometheus.Gatherer, st *Health) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := st.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		restoring := restoringLines(st.Restoring())
		if !st.Ready() {
			msg := "not ready: filters rebuilding or stage stopping"
			if restoring != "" {
				msg = "not ready: restoring from the output stream before judging\n" + strings.TrimSuffix(restoring, "\n")
			}
			http.Error(w, msg, http.StatusServiceUnavailable)
			return
		}
		if err := st.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "ready\n"+restoring)
	})
	return mux
}

// NewInspectHandler serves /inspect?key=K (see NewHandler): 400 for a
// missing key or one the store cannot hold, 503 while the state is not
// open or cannot be read.
func NewInspectHandler(st *Health) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/inspect", func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("key")
		if key == "" {
			http.Error(w, "missing ?key=", http.StatusBadRequest)
			return
		}
		in, err := st.Inspect(key)
		if errors.Is(err, admin.ErrBadInspectKey) {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(in)
	})
	return mux
}

// restoringLines says, a line per partition in order, how far each
// partition being restored from the output stream is.
func restoringLines(r map[int]int) string {
	ps := make([]int, 0, len(r))
	for p := range r {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "partition %d restoring from the output stream: %d records read back\n", p, r[p])
	}
	return b.String()
}
