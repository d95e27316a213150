package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// verifyStage fills res.Correctness for a stage configuration from the
// output's counts oc and the total it holds.
func (r *runner) verifyStage(s *sut, oc outputCounts, total int, res *Result) {
	c := &res.Correctness
	// The ground truth: each key forwarded Forwards times. The output
	// stream's own duplicate window (output.duplicate_window, on the
	// wall clock) drops a second forward of a key that arrives within
	// it; the stage counts those (dedupe_republish_duplicates_total).
	latForwards := slicesRepeat(1, r.lat.Keys)
	c.Expected = r.lat.Keys
	for _, f := range s.forwards {
		c.Expected += int(f)
	}
	c.DroppedByOutput = int(counterSum(s.reg, "dedupe_republish_duplicates_total", nil))
	var lostZero, deficit, extra int
	tally := func(got []uint16, want []uint8) {
		for i, g := range got {
			w := int(want[i])
			switch {
			case g == 0:
				lostZero += w
			case int(g) < w:
				deficit += w - int(g)
			case int(g) > w:
				extra += int(g) - w
			}
		}
	}
	tally(oc.thr, s.forwards)
	tally(oc.lat, latForwards)
	// A dropped forward can only make up for a key the stream holds
	// fewer times than the ground truth says; beyond that it is a
	// duplicate the output's window hid.
	c.Lost = lostZero + max(0, deficit-c.DroppedByOutput)
	c.Duplicated = extra + max(0, c.DroppedByOutput-deficit)
	newCount := int(counterSum(s.reg, "dedupe_messages_total", map[string]string{"outcome": "new"}))
	if newCount != total+c.DroppedByOutput {
		res.Notes = append(res.Notes, fmt.Sprintf("stage counted %d new, output holds %d and dropped %d", newCount, total, c.DroppedByOutput))
	}
}

// outputCounts are the output stream's messages per key of each workload.
type outputCounts struct {
	thr, lat []uint16
	foreign  int // messages whose key is of neither workload
	lats     []time.Duration
}

// verify reads the output and the dead-letter streams and fills
// res.Correctness and res.Latency.
func (r *runner) verify(ctx context.Context, kind Kind, js jetstream.JetStream, n streamNames, res *Result, s *sut) error {
	kf, err := keys.NewKeyFunc(r.keyConfig())
	if err != nil {
		return err
	}
	oc := outputCounts{thr: make([]uint16, r.thr.Keys), lat: make([]uint16, r.lat.Keys)}
	total, err := natstest.Read(ctx, js, n.output, func(m jetstream.Msg) {
		k, err := kf.Key(m.Subject(), m.Headers(), m.Data())
		if err != nil {
			oc.foreign++
			return
		}
		prefix, i, ok := ParseKey(string(k))
		switch {
		case ok && prefix == r.thr.Prefix && i < r.thr.Keys:
			oc.thr[i]++
		case ok && prefix == r.lat.Prefix && i < r.lat.Keys:
			oc.lat[i]++
			if sent, err := strconv.ParseInt(m.Headers().Get(headerSent), 10, 64); err == nil {
				if md, err := m.Metadata(); err == nil {
					oc.lats = append(oc.lats, md.Timestamp.Sub(time.Unix(0, sent)))
				}
			}
		default:
			oc.foreign++
		}
	})
	if err != nil {
		return err
	}
	c := &res.Correctness
	c.Output = total
	if kind.isStage() {
		if si, err := js.Stream(ctx, n.dlq); err == nil {
			c.DeadLettered = int(si.CachedInfo().State.Msgs)
		}
	}

	switch kind {
	case KindRaw, KindRawAtomic:
		// Every input event is forwarded once. Raw has no dedupe: a
		// message JetStream redelivers (AckWait passed before its batch
		// was acked) is forwarded again. That is the baseline's nature,
		// not a fault of the harness, so it is counted apart.
		c.Expected = r.thr.Events() + r.lat.Events()
		c.DroppedByOutput = int(s.loopStats.Duplicates.Load())
		c.Lost, c.Redelivered = exact(oc.thr, func(i int) int { return int(r.thr.Copies[i]) })
		l, d := exact(oc.lat, func(i int) int { return int(r.lat.Copies[i]) })
		c.Lost, c.Redelivered = c.Lost+l, c.Redelivered+d
		if c.Redelivered > 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("%d events were redelivered (AckWait passed) and forwarded twice: raw has no dedupe; not counted as duplicated", c.Redelivered))
		}
	case KindJetStream:
		// Every key once: the output stream's window (W, on the server's
		// wall clock) covers the whole run, so copies past the logical W
		// are inside it and dropped too.
		c.Expected = r.thr.Keys + r.lat.Keys
		c.DroppedByOutput = int(s.loopStats.Duplicates.Load())
		one := func(int) int { return 1 }
		c.Lost, c.Duplicated = exact(oc.thr, one)
		l, d := exact(oc.lat, one)
		c.Lost, c.Duplicated = c.Lost+l, c.Duplicated+d
		res.Notes = append(res.Notes, "JetStream's window runs on the server's wall clock, so the copies placed past W in logical time are inside it and dropped: expected = one message per key")
	default:
		r.verifyStage(s, oc, total, res)
	}
	if oc.foreign > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d output messages carry no workload key", oc.foreign))
		c.Duplicated += oc.foreign
	}
	c.OK = c.Lost == 0 && c.Duplicated == 0 && c.DeadLettered == 0

	res.Latency.Forwarded = len(oc.lats)
	p := percentiles(oc.lats, 0.5, 0.99, 0.999, 1)
	res.Latency.P50ms, res.Latency.P99ms, res.Latency.P999ms, res.Latency.MaxMs = ms(p[0]), ms(p[1]), ms(p[2]), ms(p[3])
	return nil
}

// exact compares per-key counts with want(i) and returns the shortfall and
// the excess.
func exact(got []uint16, want func(int) int) (lost, dup int) {
	for i, g := range got {
		w := want(i)
		if int(g) < w {
			lost += w - int(g)
		} else {
			dup += int(g) - w
		}
	}
	return lost, dup
}
