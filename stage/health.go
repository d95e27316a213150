package stage

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// Components whose health the stage reports: the values of the component
// label of dedupe_component_healthy and the names /healthz lists.
const (
	CompPublish     = "publish"      // forwards to the output stream
	CompDeadLetter  = "dead_letter"  // dead letters to the dead-letter subject
	CompLookup      = "lookup"       // key lookups in the state store
	CompCommit      = "commit"       // claims committed to the state store
	CompTotalsFlush = "totals_flush" // totals written to the sinks
)

// unhealthyAfter is how many failed attempts in a row mark a component as
// failing. One failure is routine (a leader moving); three are not.
const unhealthyAfter = 3

// Health is the one record of the stage's health: whether it is ready (every
// filter rebuilt, judging messages) and, per component, whether its
// operation keeps failing. /healthz, /readyz, dedupe_ready, dedupe_healthy
// and dedupe_component_healthy all read it, so they cannot disagree. A
// component fails after three failed attempts in a row and recovers only
// when its own operation succeeds. Health also holds the store for
// /inspect. The zero value is a stage that is starting. It is safe for
// concurrent use.
type Health struct {
	mu    sync.Mutex
	ready bool
	// units are the failure records, by component or component/instance
	// (one per partition for the per-partition paths).
	units map[string]*unit
	store *state.Store
	win   window.Window
	clock window.Clock
	// restoring holds, with scale-out, the partitions being restored from
	// the output stream and the records read back so far.
	restoring map[int]int
}

// unit is one component (or one instance of it) as Health tracks it.
type unit struct {
	inARow int    // failed attempts since the last success
	last   string // the last failure
}

// Failed records a failed attempt of component, which may name an instance
// after a slash ("publish/3"). It implements retry.Reporter.
func (st *Health) Failed(component string, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	u := st.unit(component)
	u.inARow++
	u.last = fmt.Sprint(err)
}

// Succeeded records a successful attempt of component: it recovers. Other
// components are untouched. It implements retry.Reporter.
func (st *Health) Succeeded(component string, _ bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if u, ok := st.units[component]; ok {
		u.inARow, u.last = 0, ""
	}
}

// declare makes the components known before they report, so that their
// gauges exist from the start.
func (st *Health) declare(components ...string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, c := range components {
		st.unit(c)
	}
}

// unit returns the record of name, creating it. st.mu is held.
func (st *Health) unit(name string) *unit {
	if st.units == nil {
		st.units = make(map[string]*unit)
	}
	u, ok := st.units[name]
	if !ok {
		u = &unit{}
		st.units[name] = u
	}
	return u
}

func (st *Health) setReady(r bool) {
	st.mu.Lock()
	st.ready = r
	st.mu.Unlock()
}

func (st *Health) setStore(s *state.Store, w window.Window, c window.Clock) {
	st.mu.Lock()
	st.store, st.win, st.clock = s, w, c
	st.mu.Unlock()
}

// setRestoring records that partition p is being restored (records read
// back so far) or, with on false, that its restore ended.
func (st *Health) setRestoring(p, records int, on bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !on {
		delete(st.restoring, p)
		return
	}
	if st.restoring == nil {
		st.restoring = make(map[int]int)
	}
	st.restoring[p] = records
}

// Restoring returns, with scale-out, each partition this instance is
// restoring from the output stream and how many records it has read back.
// The instance judges the other partitions meanwhile; the restored ones'
// messages wait.
func (st *Health) Restoring() map[int]int {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make(map[int]int, len(st.restoring))
	for p, n := range st.restoring {
		out[p] = n
	}
	return out
}

// Ready reports whether the stage is judging messages.
func (st *Health) Ready() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.ready
}

// Healthy returns nil, or an error listing every component (with its
// unit) that keeps failing and its last error.
func (st *Health) Healthy() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	var parts []string
	for name, u := range st.units {
		if u.inARow >= unhealthyAfter {
			parts = append(parts, name+": "+u.last)
		}
	}
	if len(parts) == 0 {
		return nil
	}
	sort.Strings(parts)
	return errors.New("failing, retrying: " + strings.Join(parts, "; "))
}

// Components returns every known component (instances folded into their
// component) and whether it is healthy.
func (st *Health) Components() map[string]bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make(map[string]bool, len(st.units))
	for name, u := range st.units {
		c, _, _ := strings.Cut(name, "/")
		ok, seen := out[c]
		if !seen {
			ok = true
		}
		out[c] = ok && u.inARow < unhealthyAfter
	}
	return out
}

// unitReporter is a retry.Reporter for one unit of the components, such as
// one partition: it reports "component/unit" to the Health.
type unitReporter struct {
	st   *Health
	name string
}

// Failed implements retry.Reporter.
func (r unitReporter) Failed(component string, err error) { r.st.Failed(component+"/"+r.name, err) }

// Succeeded implements retry.Reporter.
func (r unitReporter) Succeeded(component string, retried bool) {
	r.st.Succeeded(component+"/"+r.name, retried)
}
