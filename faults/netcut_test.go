package faults

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/netfault"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// cutPing is nats.ping_interval in the link tests: with the default
// max_pings_out of 2, a link that stops answering is dropped and
// reconnected after at most 3 x cutPing (config.NATS.StaleAfter).
const cutPing = 250 * time.Millisecond

// stopBound is how long a stop may take on a link that is down or stops
// answering: the stage finds the link dead within 3 x cutPing and abandons
// the batches in flight (they come back after ack_wait); a publish that
// was waiting for room among the publishes in flight waits out its stall
// (forward.DefaultStallWait) first. The rest is slack for a loaded
// machine. docs/failures.md states the bound.
const stopBound = 3*cutPing + forward.DefaultStallWait + 3*time.Second

// clock logs the faults of a test with the time since it began.
type clock struct {
	t     *testing.T
	start time.Time
}

func newClock(t *testing.T) clock { return clock{t, time.Now()} }

// logf logs msg prefixed with the time since the test began.
func (c clock) logf(format string, args ...any) {
	c.t.Helper()
	c.t.Logf("%7s: %s", time.Since(c.start).Round(time.Millisecond), fmt.Sprintf(format, args...))
}

// signals is one reading of what the stage reports about its health.
type signals struct {
	healthz, readyz int
	healthzBody     string
	healthy         float64
	connected       float64 // dedupe_nats_connected; -1 when the stage has no such gauge
}

func (s signals) String() string {
	return fmt.Sprintf("/healthz %d %q, /readyz %d, dedupe_healthy %v, dedupe_nats_connected %v",
		s.healthz, strings.TrimSpace(s.healthzBody), s.readyz, s.healthy, s.connected)
}

// outage reports whether every signal says the NATS connection is down.
func (s signals) outage() bool {
	return s.healthz == http.StatusServiceUnavailable && strings.Contains(s.healthzBody, "nats") &&
		s.readyz == http.StatusServiceUnavailable && s.healthy == 0 && s.connected == 0
}

// healthy reports whether every signal says the stage is well.
func (s signals) fine() bool {
	return s.healthz == http.StatusOK && s.readyz == http.StatusOK && s.healthy == 1 && s.connected != 0
}

// readSignals reads /healthz, /readyz and the health gauges of s.
func (s *stage) readSignals() signals {
	var r signals
	r.healthz, r.healthzBody = s.get("/healthz")
	r.readyz, _ = s.get("/readyz")
	code, body := s.get("/metrics")
	if code != http.StatusOK {
		s.tb.Fatalf("/metrics: %d %s", code, body)
	}
	r.healthy = s.metric("dedupe_healthy")
	r.connected = -1
	if strings.Contains(body, "\ndedupe_nats_connected ") {
		r.connected = s.metric("dedupe_nats_connected")
	}
	return r
}

// watchOutage reads the stage's signals every 100 ms for d, the length of
// a cut, and returns the first reading that showed the outage (ok false:
// none did) and the last reading.
func watchOutage(s *stage, d time.Duration) (first, last signals, ok bool) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		last = s.readSignals()
		if !ok && last.outage() {
			first, ok = last, true
		}
	}
	return first, last, ok
}

// checkOutageSignals checks what s reported during a cut: the outage
// (/healthz 503 naming nats, /readyz 503, dedupe_healthy 0 and
// dedupe_nats_connected 0) in some reading while it lasted.
func checkOutageSignals(t *testing.T, c clock, first, last signals, ok bool) {
	t.Helper()
	if !ok {
		t.Errorf("no reading during the cut showed the outage; the last: %v", last)
		return
	}
	c.logf("the stage reported the outage: %v", first)
}

// waitSignalsFine waits until s reports itself healthy and ready again.
func waitSignalsFine(t *testing.T, s *stage, timeout time.Duration) {
	t.Helper()
	natstest.Poll(t, timeout, 50*time.Millisecond, "the health signals to recover after the cut", func() (bool, error) {
		r := s.readSignals()
		return r.fine(), fmt.Errorf("%v", r)
	})
}

// stopWithin sends SIGTERM to p and fails the test unless it exits cleanly
// within bound; it returns how long the stop took.
func stopWithin(t *testing.T, p *process, bound time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	p.Signal(syscall.SIGTERM)
	if !p.Wait(bound) {
		// SIGQUIT: the Go runtime writes every goroutine's stack to the
		// log, which says what the stop waits for.
		p.Signal(syscall.SIGQUIT)
		p.Wait(5 * time.Second)
		p.Kill()
		t.Fatalf("the stage still ran %v after SIGTERM (bound %v); its goroutines:\n%s", bound, bound, goroutines(p.Log()))
	}
	took := time.Since(start)
	if err := p.Err(); err != nil {
		t.Errorf("the stage stopped with %v after SIGTERM\n%s", err, crashReport(p.Log()))
	}
	return took
}

// TestLinkCutOneInstance cuts the link between one instance and its
// nats-server (a proxy holds the bytes both ways: nothing reset, nothing
// delivered) three times while inputs arrive, each cut 2 x input.ack_wait:
// the first cut ends and the stage carries on; during the second the stage
// gets SIGTERM; the third ends and the stage gets SIGTERM a second later.
// Each stop ends within stopBound, the stage is started again, and at the
// end every key is in the output once and every bad input is dead-lettered
// once. What the stage reports while the link is down is checked by
// checkOutageSignals.
func TestLinkCutOneInstance(t *testing.T) {
	t.Parallel()
	c := newClock(t)
	srv := startNATSUnsynced(t)
	px := netfault.Start(t, strings.TrimPrefix(srv.URL(), "nats://"))
	cfg := defaultStageConfig(t, px.URL())
	cfg.PingInterval = cutPing
	// A cut of 2 x ack_wait outlasts the health signals' grace (1.5 x
	// nats.go's 2 s reconnect wait, stage/health.go natsGrace) once the
	// pings have dropped the link.
	cfg.AckWait = 3 * time.Second
	cut := 2 * cfg.AckWait
	js := publisherJS(t, srv.URL())
	s := newStage(t, cfg)
	w := newWorkload(testSeed(t), "cut", cfg.MaxMessageBytes)
	p := s.startReady()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := w.mix(5000, 0.25, 0.02, 0)
	pubErr := make(chan error, 1)
	go func() {
		_, err := publish(ctx, js, events, "main", 250, 90*time.Second)
		pubErr <- err
	}()

	outputGrows(t, js, 300, "before the first cut")
	c.logf("cut 1: the link held both ways for %v", cut)
	px.Cut()
	first, last, ok := watchOutage(s, cut)
	px.Restore()
	c.logf("cut 1 ends: %v through the proxy", px.Stats().Bytes)
	checkOutageSignals(t, c, first, last, ok)
	waitSignalsFine(t, s, 30*time.Second)
	c.logf("the stage reports itself healthy and ready again")
	if !p.Running() {
		t.Fatalf("the stage exited during cut 1: %v\n%s", p.Err(), crashReport(p.Log()))
	}

	outputGrows(t, js, 300, "before the second cut")
	c.logf("cut 2: the link held for %v, SIGTERM at %v into it", cut, cut/2)
	px.Cut()
	time.Sleep(cut / 2) // on purpose: the signal comes in the middle of the cut
	took := stopWithin(t, p, stopBound)
	c.logf("stopped %v after SIGTERM", took.Round(time.Millisecond))
	time.Sleep(cut/2 - took) // on purpose: the rest of the cut, if any
	px.Restore()
	c.logf("cut 2 ends; starting the stage again")
	p = s.startReady()

	outputGrows(t, js, 300, "before the third cut")
	c.logf("cut 3: the link held for %v, SIGTERM 1s after it ends", cut)
	px.Cut()
	time.Sleep(cut) // on purpose: the cut's length
	px.Restore()
	time.Sleep(time.Second) // on purpose: the signal comes a second after the link returns
	took = stopWithin(t, p, stopBound)
	c.logf("stopped %v after SIGTERM; starting the stage again", took.Round(time.Millisecond))
	p = s.startReady()

	if err := <-pubErr; err != nil {
		t.Fatal(err)
	}
	waitDrained(t, js, 60*time.Second)
	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)
	if !p.Running() {
		t.Errorf("the stage exited: %v", p.Err())
	}
	disconnects := 0
	for _, r := range s.runs {
		disconnects += strings.Count(r.Log(), `"msg":"nats disconnected"`)
	}
	c.logf("%d inputs, %d keys forwarded, %d dead letters, %d runs, %d disconnects logged", len(events), len(w.forward), len(w.dead), len(s.runs), disconnects)
}

// goroutines returns the stacks a SIGQUIT wrote to log of the goroutines
// in this module's code or the NATS client, or the log's tail.
func goroutines(log string) string {
	i := strings.Index(log, "SIGQUIT: quit")
	if i < 0 {
		return proctest.Tail(log, 3000)
	}
	var out []string
	for _, g := range strings.Split(log[i:], "\n\n") {
		if strings.Contains(g, "dedupe-stage/dedupe-stage/") || strings.Contains(g, "nats-io/nats.go") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
