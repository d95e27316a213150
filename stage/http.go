package stage

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

)

// Inspection is the answer of /inspect for one key.
type Inspection struct {
	Key          string     `json:"key"`
	Found        bool       `json:"found"`
	InsideWindow bool       `json:"inside_window"`
	Partition    int        `json:"partition,omitempty"`
	FirstSeen    *time.Time `json:"first_seen,omitempty"`
	LeavesAt     *time.Time `json:"leaves_window_at,omitempty"`
	Age          string     `json:"age,omitempty"`
	Fingerprint  string     `json:"fingerprint,omitempty"`
	Window       string     `json:"window"`
}

// Inspect tells whether key is inside the window, when it was first seen
// and when it leaves the window. key is the full key as stored (with its
// scope prefix when a scope is configured).
func (st *Status) Inspect(key string) (Inspection, error) {
	st.mu.Lock()
	store, win, clock := st.store, st.win, st.clock
	st.mu.Unlock()
	if store == nil {
		return Inspection{}, errors.New("state is not open yet")
	}
	rec, p, found, err := store.Find([]byte(key))
	if err != nil {
		return Inspection{}, fmt.Errorf("inspect %q: %w", key, err)
	}
	in := Inspection{Key: key, Found: found, Window: win.W.String()}
	if found {
		now := clock.Now()
		first, leaves := rec.FirstSeen.UTC(), win.ExpiresAt(rec.FirstSeen).UTC()
		in.Partition, in.FirstSeen, in.LeavesAt = p, &first, &leaves
		in.InsideWindow = win.Inside(rec.FirstSeen, now)
		in.Age = win.Age(rec.FirstSeen, now).Round(time.Millisecond).String()
		in.Fingerprint = fmt.Sprintf("%016x", rec.Fingerprint)
	}
	return in, nil
}

// NewHandler serves the operator endpoints:
//
//	/metrics         Prometheus metrics from g
//	/healthz         200 while nothing keeps failing, else 503 with what fails
//	/readyz          200 once every filter is ready and while healthy, else 503
//	/inspect?key=K   JSON: whether K is inside the window, first seen, leaves at
func NewHandler(g prometheus.Gatherer, st *Status) http.Handler {
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
		if !st.Ready() {
			http.Error(w, "not ready: filters rebuilding or stage stopping", http.StatusServiceUnavailable)
			return
		}
		if err := st.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("/inspect", func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("key")
		if key == "" {
			http.Error(w, "missing ?key=", http.StatusBadRequest)
			return
		}
		in, err := st.Inspect(key)
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
