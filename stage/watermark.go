package stage

import (
	"sync"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
)

// watermark tracks, for one instance alone, the store's watermark: an
// output sequence W such that every forward of this run at or below W is
// committed (docs/state.md, "The watermark"). A partition's batch is in
// flight from its publish until its claims commit; its forwards then get
// sequences above the highest committed one when its publish began (the
// stream numbers in order, and those were acknowledged before), which is
// the partition's floor. W is the lowest floor of a partition in flight,
// else the highest committed sequence. It is safe for concurrent use.
type watermark struct {
	mu        sync.Mutex
	committed uint64   // the highest sequence of a committed forward, or the run's start
	floor     []uint64 // per partition, while inFlight
	inFlight  []bool
}

// newWatermark returns the watermark of partitions partitions whose run
// starts at start: every forward at or below it is in the store.
func newWatermark(partitions int, start uint64) *watermark {
	return &watermark{committed: start, floor: make([]uint64, partitions), inFlight: make([]bool, partitions)}
}

// publishing marks partition p's batch in flight before its publish. A
// partition still in flight (a batch left uncommitted) keeps its floor.
func (m *watermark) publishing(p int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.inFlight[p] {
		m.inFlight[p], m.floor[p] = true, m.committed
	}
}

// next returns W as it stands once partition p's claims of a batch whose
// publish results are res commit, to store with them.
func (m *watermark) next(p int, res []forward.Result) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := max(m.committed, forward.StoredUpTo(res))
	for q, in := range m.inFlight {
		if in && q != p {
			w = min(w, m.floor[q])
		}
	}
	return w
}

// commit records that partition p's claims of a batch whose publish
// results are res are committed: p is no longer in flight.
func (m *watermark) commit(p int, res []forward.Result) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inFlight[p] = false
	m.committed = max(m.committed, forward.StoredUpTo(res))
}

// settled returns W when no partition is in flight: every forward of
// the run is committed. ok is false while one is.
func (m *watermark) settled() (w uint64, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, in := range m.inFlight {
		if in {
			return 0, false
		}
	}
	return m.committed, true
}
