package stage

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dedupe-stage/dedupe-stage/state"
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
	// Forgotten is when an operator forgot the key (Stage.Forget): its
	// next copy is forwarded, and InsideWindow is false.
	Forgotten *time.Time `json:"forgotten_at,omitempty"`
	// Version is the key's recorded version, with key.version set.
	Version *uint64 `json:"version,omitempty"`
	// OutputSeq is the output stream sequence of the key's forward; absent
	// when its record predates it.
	OutputSeq *uint64 `json:"output_seq,omitempty"`
	Window    string  `json:"window"`
}

// Inspect tells whether key is inside the window, when it was first seen
// and when it leaves the window. key is the full key as stored (with its
// scope prefix when a scope is configured).
func (st *Health) Inspect(key string) (Inspection, error) {
	st.mu.Lock()
	store, win, clock := st.store, st.win, st.clock
	st.mu.Unlock()
	if len(key) > state.MaxKeySize {
		return Inspection{}, fmt.Errorf("%w: %d bytes, the longest key is %d", ErrBadInspectKey, len(key), state.MaxKeySize)
	}
	if store == nil {
		return Inspection{}, errors.New("state is not open yet")
	}
	rec, p, found, err := store.Find([]byte(key))
	if err != nil {
		if errors.Is(err, state.ErrBadKey) {
			return Inspection{}, fmt.Errorf("%w: %w", ErrBadInspectKey, err)
		}
		return Inspection{}, fmt.Errorf("inspect %q: %w", key, err)
	}
	in := Inspection{Key: key, Found: found, Window: win.W.String()}
	if found {
		now := clock.Now()
		first, leaves := rec.FirstSeen.UTC(), win.ExpiresAt(rec.WindowStart()).UTC()
		in.Partition, in.FirstSeen, in.LeavesAt = p, &first, &leaves
		in.InsideWindow = rec.Forgotten.IsZero() && win.Inside(rec.WindowStart(), now)
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
		in.Age = win.Age(rec.FirstSeen, now).Round(time.Millisecond).String()
		in.Fingerprint = fmt.Sprintf("%016x", rec.Fingerprint)
	}
	return in, nil
}

// ErrBadInspectKey is returned by Health.Inspect for a key the store
// cannot hold (empty, or longer than state.MaxKeySize).
var ErrBadInspectKey = errors.New("stage: bad key to inspect")

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
		if !st.Ready() {
			http.Error(w, "not ready: filters rebuilding or stage stopping", http.StatusServiceUnavailable)
			return
		}
		if err := st.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
		r := st.Restoring()
		ps := make([]int, 0, len(r))
		for p := range r {
			ps = append(ps, p)
		}
		slices.Sort(ps)
		for _, p := range ps {
			fmt.Fprintf(w, "partition %d restoring from the output stream: %d records read back\n", p, r[p])
		}
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
		if errors.Is(err, ErrBadInspectKey) {
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
