package sink

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// env is one empty store behind a sink kind, for the conformance tests.
type env struct {
	// newSink returns a new, independent sink on the store, as another
	// instance of the stage would have.
	newSink func(t *testing.T) Sink
	// snapshot returns what a reader of the store sees: the value per ID.
	// It may be called from any goroutine.
	snapshot func(ctx context.Context) (map[string]int64, error)
	// poll, if set, reads just ids while writers are running (a snapshot
	// may not be consistent then); nil means snapshot.
	poll func(ctx context.Context, ids []string) (map[string]int64, error)
	// log is true when the store appends every value (the stream): a
	// smaller value is then Applied, and only an identical re-flush is
	// Stale.
	log bool
}

// model predicts Results and stored values for a sequence of writes by one
// writer.
type model struct {
	log       bool
	max       map[string]int64
	published map[string]bool // ID + ":" + value, for logs
}

func newModel(log bool) *model {
	return &model{log: log, max: map[string]int64{}, published: map[string]bool{}}
}

// apply records batch and returns the Result a correct sink gives for it.
func (m *model) apply(batch []Total) Result {
	var res Result
	uniq := map[string]int64{}
	var order []string
	for _, t := range batch {
		id := t.ID()
		cur, ok := uniq[id]
		if !ok {
			order = append(order, id)
			uniq[id] = t.Value
			continue
		}
		res.Stale++
		uniq[id] = max(cur, t.Value)
	}
	for _, id := range order {
		v := uniq[id]
		cur, seen := m.max[id]
		if m.log {
			key := fmt.Sprintf("%s:%d", id, v)
			if m.published[key] {
				res.Stale++
			} else {
				res.Applied++
				m.published[key] = true
			}
		} else if seen && cur >= v {
			res.Stale++
		} else {
			res.Applied++
		}
		if !seen || v > cur {
			m.max[id] = v
		}
	}
	return res
}

var (
	bucket0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	bucket1 = bucket0.Add(time.Hour)
)

// tot is shorthand for a Total.
func tot(group string, bucket time.Time, value int64) Total {
	return Total{Group: group, Bucket: bucket, Value: value}
}

// mustSnapshot returns e's snapshot or fails the test.
func mustSnapshot(t *testing.T, e env) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	snap, err := e.snapshot(ctx)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return snap
}

// checkedWrite writes batch with s, requires no error and Applied+Stale ==
// len(batch), and returns the Result.
func checkedWrite(t testing.TB, s Sink, batch []Total) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.Write(ctx, batch)
	if err != nil {
		t.Fatalf("%s: Write(%v): %v", s.Name(), batch, err)
	}
	if res.Applied+res.Stale != len(batch) {
		t.Fatalf("%s: Write(%v) = %+v: Applied+Stale != %d", s.Name(), batch, res, len(batch))
	}
	return res
}

// runConformance runs the behaviour every Sink must have against stores
// made by newEnv, one store per subtest.
func runConformance(t *testing.T, name string, newEnv func(t *testing.T) env) {
	t.Run("sequence", func(t *testing.T) {
		e := newEnv(t)
		s := e.newSink(t)
		if got := s.Name(); got != name {
			t.Fatalf("Name() = %q, want %q", got, name)
		}
		odd := "tenant.a/x y" // needs the encoded group token
		steps := [][]Total{
			{tot("g1", bucket0, 10), tot(odd, bucket0, 5)},
			{tot("g1", bucket0, 7)},                                            // replay from an older point
			{tot("g1", bucket0, 12), tot("g1", bucket1, 3)},                    // moves on
			{tot("g1", bucket0, 12), tot("g1", bucket1, 3)},                    // identical re-flush
			{tot(odd, bucket0, 4), tot(odd, bucket0, 9), tot(odd, bucket0, 6)}, // one batch, three values
			{tot("g1", bucket0, 11), tot("g1", bucket1, 2)},                    // late flush
			{tot("g1", bucket0, 0), tot(odd, bucket0, 9)},                      // zero, and equal
			{tot("g1", bucket0, 13), tot(odd, bucket0, 8), tot("g1", bucket1, 30)},
			{},
		}
		// Then a seeded random walk that goes up and down, with replays of
		// earlier batches.
		rng := rand.New(rand.NewPCG(1, 2))
		var history [][]Total
		for range 30 {
			var b []Total
			if len(history) > 0 && rng.IntN(4) == 0 {
				b = history[rng.IntN(len(history))]
			} else {
				for range 1 + rng.IntN(3) {
					g := []string{"g1", "g2", odd}[rng.IntN(3)]
					b = append(b, tot(g, []time.Time{bucket0, bucket1}[rng.IntN(2)], rng.Int64N(60)))
				}
				history = append(history, b)
			}
			steps = append(steps, b)
		}
		m := newModel(e.log)
		prev := map[string]int64{}
		for i, b := range steps {
			want := m.apply(b)
			got := checkedWrite(t, s, b)
			if got != want {
				t.Fatalf("step %d: Write(%v) = %+v, want %+v", i, b, got, want)
			}
			snap := mustSnapshot(t, e)
			if !maps.Equal(snap, m.max) {
				t.Fatalf("step %d: after Write(%v) the store holds %v, want %v", i, b, snap, m.max)
			}
			for id, v := range prev {
				if snap[id] < v {
					t.Fatalf("step %d: %s moved down from %d to %d", i, id, v, snap[id])
				}
			}
			prev = snap
		}
	})

	t.Run("rewrite", func(t *testing.T) {
		e := newEnv(t)
		s := e.newSink(t)
		batch := []Total{tot("r1", bucket0, 100), tot("r2", bucket0, 200), tot("r1", bucket1, 1)}
		if got, want := checkedWrite(t, s, batch), (Result{Applied: 3}); got != want {
			t.Fatalf("first Write = %+v, want %+v", got, want)
		}
		for i := range 2 {
			if got, want := checkedWrite(t, s, batch), (Result{Stale: 3}); got != want {
				t.Fatalf("re-write %d = %+v, want %+v", i, got, want)
			}
		}
		// Another instance re-flushing the same totals is stale too.
		if got, want := checkedWrite(t, e.newSink(t), batch), (Result{Stale: 3}); got != want {
			t.Fatalf("re-write from a second sink = %+v, want %+v", got, want)
		}
		want := map[string]int64{batch[0].ID(): 100, batch[1].ID(): 200, batch[2].ID(): 1}
		if snap := mustSnapshot(t, e); !maps.Equal(snap, want) {
			t.Fatalf("store holds %v, want %v", snap, want)
		}
	})

	t.Run("race", func(t *testing.T) {
		e := newEnv(t)
		const writers, writes = 2, 200
		groups := []string{"race-a", "race-b", "race c"}
		var ids []string
		for _, g := range groups {
			ids = append(ids, tot(g, bucket0, 0).ID())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
		defer cancel()

		// A reader polls the store throughout and fails if any value
		// moves down.
		stop := make(chan struct{})
		var readerDone sync.WaitGroup
		readerDone.Go(func() {
			prev := map[string]int64{}
			natstest.Until(2*time.Minute, 2*time.Millisecond, func() bool {
				select {
				case <-stop:
					return true
				default:
				}
				snap, err := pollIDs(ctx, e, ids)
				if err != nil {
					t.Errorf("reader: %v", err)
					return true
				}
				for id, v := range prev {
					if snap[id] < v {
						t.Errorf("reader: %s moved down from %d to %d", id, v, snap[id])
					}
				}
				prev = snap
				return false
			})
		})

		var wg sync.WaitGroup
		begin := make(chan struct{}) // both writers start together
		maxes := make([]map[string]int64, writers)
		results := make([]Result, writers)
		batches := make([][][]Total, writers)
		for w := range writers {
			s := e.newSink(t)
			wg.Go(func() {
				<-begin
				rng := rand.New(rand.NewPCG(uint64(w), 7))
				m := map[string]int64{}
				for i := range writes {
					// Values trend up with both writers in step, and dip
					// below earlier ones: replays and late flushes.
					var b []Total
					for range 1 + rng.IntN(3) {
						tt := tot(groups[rng.IntN(len(groups))], bucket0, int64(i)*2+rng.Int64N(40))
						b = append(b, tt)
						m[tt.ID()] = max(m[tt.ID()], tt.Value)
					}
					batches[w] = append(batches[w], b)
					res, err := s.Write(ctx, b)
					if err != nil {
						t.Errorf("writer %d write %d: %v", w, i, err)
						return
					}
					if res.Applied+res.Stale != len(b) {
						t.Errorf("writer %d write %d: Write(%v) = %+v: Applied+Stale != %d", w, i, b, res, len(b))
						return
					}
					results[w] = results[w].Add(res)
				}
				maxes[w] = m
			})
		}
		close(begin)
		wg.Wait()
		close(stop)
		readerDone.Wait()
		if t.Failed() {
			return
		}
		want := map[string]int64{}
		for _, m := range maxes {
			for id, v := range m {
				want[id] = max(want[id], v)
			}
		}
		if snap := mustSnapshot(t, e); !maps.Equal(snap, want) {
			t.Fatalf("after the race the store holds %v, want the largest values %v", snap, want)
		}
		if e.log {
			// Every distinct (id, value) reached the log once: the one
			// writer that published it first got Applied, the duplicate
			// window turned the other's into Stale.
			pairs := map[string]bool{}
			for _, bs := range batches {
				for _, b := range bs {
					for _, tt := range Latest(b) {
						pairs[fmt.Sprintf("%s:%d", tt.ID(), tt.Value)] = true
					}
				}
			}
			if applied := results[0].Applied + results[1].Applied; applied != len(pairs) {
				t.Fatalf("writers applied %d totals in all, want %d distinct (id, value) pairs", applied, len(pairs))
			}
		}
		t.Logf("%s: writer results %+v", name, results)
	})

	t.Run("invalid", func(t *testing.T) {
		e := newEnv(t)
		s := e.newSink(t)
		checkedWrite(t, s, []Total{tot("v", bucket0, 5)})
		before := mustSnapshot(t, e)
		bad := []Total{tot("v", bucket0, 50), tot("", bucket0, 1)}
		res, err := s.Write(context.Background(), bad)
		if !errors.Is(err, ErrBadTotal) {
			t.Fatalf("Write(%v) error = %v, want ErrBadTotal", bad, err)
		}
		if res != (Result{}) {
			t.Fatalf("Write(%v) = %+v, want zero Result", bad, res)
		}
		if after := mustSnapshot(t, e); !maps.Equal(after, before) {
			t.Fatalf("a batch with a bad total changed the store from %v to %v", before, after)
		}
	})

	t.Run("close", func(t *testing.T) {
		e := newEnv(t)
		s := e.newSink(t)
		if got := checkedWrite(t, s, nil); got != (Result{}) {
			t.Fatalf("Write(nil) = %+v, want zero", got)
		}
		for i := range 2 {
			if err := s.Close(); err != nil {
				t.Fatalf("Close #%d: %v", i+1, err)
			}
		}
		if _, err := s.Write(context.Background(), []Total{tot("c", bucket0, 1)}); !errors.Is(err, ErrClosed) {
			t.Fatalf("Write after Close error = %v, want ErrClosed", err)
		}
		if snap := mustSnapshot(t, e); len(snap) != 0 {
			t.Fatalf("Write after Close stored %v", snap)
		}
	})
}

// pollIDs reads ids from e while writers may be running.
func pollIDs(ctx context.Context, e env, ids []string) (map[string]int64, error) {
	if e.poll != nil {
		return e.poll(ctx, ids)
	}
	snap, err := e.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, id := range ids {
		if v, ok := snap[id]; ok {
			out[id] = v
		}
	}
	return out, nil
}
