package stage

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

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
	CompNATS        = "nats"         // the connection to NATS
	CompFetch       = "fetch"        // fetching the input from its consumer (one instance alone)
)

// unhealthyAfter is how many failed attempts in a row mark a component as
// failing. One failure is routine (a leader moving); three are not.
const unhealthyAfter = 3

// Health is the one record of the stage's health: whether it is ready (every
// filter rebuilt, judging messages), whether its NATS connection is up and,
// per component, whether its operation keeps failing. /healthz, /readyz,
// dedupe_ready, dedupe_healthy, dedupe_component_healthy,
// dedupe_nats_connected and dedupe_nats_reconnects_total all read it, so
// they cannot disagree. A component fails after three failed attempts in
// a row, or at once when the server answers that it cannot work (a
// consumer that does not exist, a permission denied), and recovers only
// when its own operation succeeds. The nats component fails once the
// connection has been down for longer than its grace (watchConn) and
// recovers when it reconnects. Health also holds the store for /inspect.
// The zero value is a stage that is starting. It is safe for concurrent
// use.
type Health struct {
	mu    sync.Mutex
	ready bool
	// units are the failure records, by component or component/instance
	// (one per partition for the per-partition paths).
	units map[string]*unit
	conn  connState
	// pullSuffix is the end of the input consumer's pull subject, for
	// telling a refused pull among permission violations (watchPulls).
	pullSuffix   string
	pullConsumer string // the consumer of pullSuffix, in words
	// now tells the time for the connection's grace; nil is time.Now.
	now   func() time.Time
	store *state.Store
	win   window.Window
	// restoring holds, with scale-out, the partitions being restored from
	// the output stream and the records read back so far.
	restoring map[int]int
}

// unit is one component (or one instance of it) as Health tracks it.
type unit struct {
	inARow int    // failed attempts since the last success
	last   string // the last failure
}

// connState is the NATS connection as Health tracks it.
type connState struct {
	watched    bool          // watchConn was called
	down       bool          // disconnected or closed
	closed     bool          // closed for good: it never reconnects
	since      time.Time     // when it went down
	last       string        // why, "" when the client gave no error
	grace      time.Duration // how long it may be down before the nats component fails
	reconnects uint64        // reconnects since watchConn
}

// DefaultNATSGrace is how long the NATS connection may be down before the
// nats component fails, with the client's default reconnect wait (2s):
// the client tries again at once and once more after the wait, and the
// grace ends before its third try. watchConn scales it with the
// connection's own reconnect wait.
const DefaultNATSGrace = nats.DefaultReconnectWait * 3 / 2

// natsGrace is the grace of a connection whose client waits wait between
// two rounds of reconnect attempts (DefaultNATSGrace for the default).
func natsGrace(wait time.Duration) time.Duration {
	return max(wait*3/2, time.Second)
}

// watchConn makes Health follow nc: the nats component fails once nc has
// been disconnected for longer than its grace (natsGrace of its reconnect
// wait: after two reconnect attempts, before a third) or at once when nc is
// closed, and recovers when nc reconnects; reconnects are counted. It adds
// its handlers to those nc has, which still run first. A pull refused for
// lack of permission on the subject watchPulls names fails CompFetch at
// once.
func (st *Health) watchConn(nc *nats.Conn) {
	st.mu.Lock()
	st.conn.watched, st.conn.grace = true, natsGrace(nc.Opts.ReconnectWait)
	st.unit(CompNATS)
	st.mu.Unlock()
	prevDisc, prevRecon, prevClosed, prevErr := nc.DisconnectErrHandler(), nc.ReconnectHandler(), nc.ClosedHandler(), nc.ErrorHandler()
	nc.SetDisconnectErrHandler(func(c *nats.Conn, err error) {
		if prevDisc != nil {
			prevDisc(c, err)
		}
		st.connDown(err, false)
	})
	nc.SetReconnectHandler(func(c *nats.Conn) {
		if prevRecon != nil {
			prevRecon(c)
		}
		st.connUp()
	})
	nc.SetClosedHandler(func(c *nats.Conn) {
		if prevClosed != nil {
			prevClosed(c)
		}
		st.connDown(nats.ErrConnectionClosed, true)
	})
	nc.SetErrorHandler(func(c *nats.Conn, sub *nats.Subscription, err error) {
		if prevErr != nil {
			prevErr(c, sub, err)
		}
		if errors.Is(err, nats.ErrPermissionViolation) {
			st.pullRefused(err)
		}
	})
	if !nc.IsConnected() {
		st.connDown(nc.LastError(), nc.IsClosed())
	}
}

// watchPulls makes a permission violation on a subject that ends in
// suffix (the input consumer's pull subject, after the JetStream API
// prefix) fail CompFetch at once, saying it of consumer (its name and
// stream, in words).
func (st *Health) watchPulls(suffix, consumer string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.pullSuffix, st.pullConsumer = suffix, consumer
	st.unit(CompFetch)
}

// pullRefused fails CompFetch at once when err, a permission violation,
// names the pull subject watchPulls set.
func (st *Health) pullRefused(err error) {
	st.mu.Lock()
	suffix, consumer := st.pullSuffix, st.pullConsumer
	st.mu.Unlock()
	if suffix != "" && strings.Contains(err.Error(), suffix+`"`) {
		st.failedNow(CompFetch, fmt.Errorf("%s: pull refused: %w", consumer, err))
	}
}

// connDown records that the connection went down (closed: for good).
func (st *Health) connDown(err error, closed bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.conn.down {
		st.conn.down, st.conn.since = true, st.clockNow()
	}
	st.conn.closed = st.conn.closed || closed
	if err != nil {
		st.conn.last = err.Error()
	}
}

// connUp records a reconnect.
func (st *Health) connUp() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.conn.down, st.conn.closed, st.conn.last = false, false, ""
	st.conn.reconnects++
}

// clockNow is the time for the connection's grace. st.mu is held or not:
// it reads only st.now, set before use.
func (st *Health) clockNow() time.Time {
	if st.now != nil {
		return st.now()
	}
	return time.Now()
}

// natsProblem returns why the nats component fails, "" while it does not:
// down for longer than the grace, or closed. st.mu is held.
func (st *Health) natsProblem() string {
	c := st.conn
	if !c.watched || !c.down {
		return ""
	}
	down := st.clockNow().Sub(c.since)
	if !c.closed && down < c.grace {
		return ""
	}
	why := c.last
	if why == "" {
		why = "no error given"
	}
	if c.closed {
		return fmt.Sprintf("connection closed %s ago (%s); it does not reconnect", down.Round(100*time.Millisecond), why)
	}
	return fmt.Sprintf("disconnected for %s (%s), reconnecting", down.Round(100*time.Millisecond), why)
}

// NATSConnected reports whether the NATS connection is up now, without
// the grace that the nats component allows it; true when no connection is
// watched.
func (st *Health) NATSConnected() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return !st.conn.down
}

// NATSReconnects returns how often the NATS connection has reconnected.
func (st *Health) NATSReconnects() uint64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.conn.reconnects
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

// failedNow records a failure of component that no retry changes (the
// server answered that it cannot work): it fails at once.
func (st *Health) failedNow(component string, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	u := st.unit(component)
	u.inARow = max(u.inARow+1, unhealthyAfter)
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

func (st *Health) setStore(s *state.Store, w window.Window) {
	st.mu.Lock()
	st.store, st.win = s, w
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
	if p := st.natsProblem(); p != "" {
		parts = append(parts, CompNATS+": "+p)
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
	if st.conn.watched {
		out[CompNATS] = st.natsProblem() == ""
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
