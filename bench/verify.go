package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// verifyStage fills res.Correctness for a stage configuration from the
// output's counts per key of the backlog (thr) and of the latency phase
// (lat), and the total it holds.
func (r *runner) verifyStage(s *sut, thr, lat []uint16, total int, res *Result) {
	c := &res.Correctness
	// The ground truth: each key forwarded Forwards times. The output
	// stream's own duplicate window (output.duplicate_window, on the
	// wall clock) drops a second forward of a key that arrives within
	// it; the stage counts those (dedupe_republish_duplicates_total).
	latForwards := slices.Repeat([]uint8{1}, r.lat.Keys)
	c.Expected = r.lat.Keys
	for _, f := range s.forwards {
		c.Expected += int(f)
	}
	c.DroppedByOutput = int(gathered(s.reg).Sum("dedupe_republish_duplicates_total", nil))
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
	tally(thr, s.forwards)
	tally(lat, latForwards)
	// A dropped forward can only make up for a key the stream holds
	// fewer times than the ground truth says; beyond that it is a
	// duplicate the output's window hid.
	c.Lost = lostZero + max(0, deficit-c.DroppedByOutput)
	c.Duplicated = extra + max(0, c.DroppedByOutput-deficit)
	newCount := int(gathered(s.reg).Sum("dedupe_messages_total", map[string]string{"outcome": "new"}))
	if newCount != total+c.DroppedByOutput {
		res.Notes = append(res.Notes, fmt.Sprintf("stage counted %d new, output holds %d and dropped %d", newCount, total, c.DroppedByOutput))
	}
}

// verify reads the output and the dead-letter streams and fills
// res.Correctness and res.Latency.
func (r *runner) verify(ctx context.Context, kind Kind, js jetstream.JetStream, n streamNames, res *Result, s *sut) error {
	kf, err := keys.NewKeyFunc(r.keyConfig())
	if err != nil {
		return err
	}
	// The stage's output also holds its partitions' key-state records (a
	// repeat's moved window, with window.refresh_on_repeat): counted apart.
	control := ""
	if kind.isStage() {
		control = n.outPrefix
	}
	var lats []time.Duration
	t, err := readTally(ctx, js, n.output, byKey(kf), map[string]int{r.thr.Prefix: r.thr.Keys, r.lat.Prefix: r.lat.Keys}, control, func(prefix string, _ int, m jetstream.Msg) {
		if sent, err := strconv.ParseInt(m.Headers().Get(headerSent), 10, 64); err == nil && prefix == r.lat.Prefix {
			if md, err := m.Metadata(); err == nil {
				lats = append(lats, md.Timestamp.Sub(time.Unix(0, sent)))
			}
		}
	})
	if err != nil {
		return err
	}
	thr, lat := t.counts[r.thr.Prefix], t.counts[r.lat.Prefix]
	total := t.total - t.fences - t.keyState
	if t.fences+t.keyState > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("the output also holds %d key-state records and %d fence messages, not counted as forwards", t.keyState, t.fences))
	}
	c := &res.Correctness
	c.Output = total
	if kind.isStage() {
		if si, err := js.Stream(ctx, n.dlq); err == nil {
			c.DeadLettered = int(si.CachedInfo().State.Msgs)
		}
	}

	switch {
	case kind.isRaw():
		// Every input event is forwarded once. Raw has no dedupe: a
		// message JetStream redelivers (AckWait passed before its batch
		// was acked) is forwarded again. That is the baseline's nature,
		// not a fault of the harness, so it is counted apart.
		c.Expected = r.thr.Events() + r.lat.Events()
		c.DroppedByOutput = int(s.loopStats.Duplicates.Load())
		c.Lost, c.Redelivered = t.exact(map[string]func(int) int{
			r.thr.Prefix: func(i int) int { return int(r.thr.Copies[i]) }, r.lat.Prefix: func(i int) int { return int(r.lat.Copies[i]) }})
		if c.Redelivered > 0 {
			res.Notes = append(res.Notes, fmt.Sprintf("%d events were redelivered (AckWait passed) and forwarded twice: raw has no dedupe; not counted as duplicated", c.Redelivered))
		}
	case kind == KindJetStream:
		// Every key once: the output stream's window (W, on the server's
		// wall clock) covers the whole run, so copies past the logical W
		// are inside it and dropped too.
		c.Expected = r.thr.Keys + r.lat.Keys
		c.DroppedByOutput = int(s.loopStats.Duplicates.Load())
		c.Lost, c.Duplicated = t.exact(map[string]func(int) int{r.thr.Prefix: once, r.lat.Prefix: once})
		res.Notes = append(res.Notes, "JetStream's window runs on the server's wall clock, so the copies placed past W in logical time are inside it and dropped: expected = one message per key")
	default:
		r.verifyStage(s, thr, lat, total, res)
	}
	if t.foreign > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d output messages carry no workload key", t.foreign))
		c.Duplicated += t.foreign
	}
	c.OK = c.Lost == 0 && c.Duplicated == 0 && c.DeadLettered == 0

	res.Latency.Forwarded = len(lats)
	p := percentiles(lats, 0.5, 0.99, 0.999, 1)
	res.Latency.P50ms, res.Latency.P99ms, res.Latency.P999ms, res.Latency.MaxMs = ms(p[0]), ms(p[1]), ms(p[2]), ms(p[3])
	return nil
}

// exact compares the counts of the keys of each prefix of want with
// want[prefix](i), and returns the shortfall and the excess, summed.
func (t *tally) exact(want map[string]func(i int) int) (lost, dup int) {
	for prefix, w := range want {
		for i, g := range t.counts[prefix] {
			if n := w(i); int(g) < n {
				lost += n - int(g)
			} else {
				dup += int(g) - n
			}
		}
	}
	return lost, dup
}

// once is the ground truth of a key forwarded once.
func once(int) int { return 1 }

// tally is what a stream holds, counted per key of each workload.
type tally struct {
	// counts holds, per key prefix asked for, the messages of each key.
	counts map[string][]uint16
	// Fences and KeyState are the group's control messages
	// (changelog.ControlSubjects): fences, and key-state records (with a
	// changelog.HeaderOp), counted apart; foreign is messages with no key
	// of the workloads.
	total, fences, keyState, foreign int
}

// readTally reads stream (again from the start while a read fails, for a
// minute) and counts its messages by key: keyOf names a message's key by
// its workload's prefix and index, sizes names the prefixes counted and
// their key counts, control is the subject prefix of the stream's group
// control messages (changelog.ControlSubjects; "" for none), and each, when not nil, sees every counted message.
func readTally(ctx context.Context, js jetstream.JetStream, stream string, keyOf func(jetstream.Msg) (string, int, bool), sizes map[string]int, control string, each func(prefix string, i int, m jetstream.Msg)) (*tally, error) {
	if control != "" {
		control = strings.TrimSuffix(changelog.ControlSubjects(control), ">")
	}
	ctx, cancel := context.WithTimeout(ctx, readBound(ctx, js, stream))
	defer cancel()
	var t *tally
	n, err := natstest.ReadAgain(ctx, js, stream, func(err error) {
		if err != nil {
			fmt.Fprintf(logOut, "warning: reading %s again: %v\n", stream, err)
		}
		t = &tally{counts: map[string][]uint16{}}
		for p, n := range sizes {
			t.counts[p] = make([]uint16, n)
		}
	}, func(m jetstream.Msg) {
		if control != "" && strings.HasPrefix(m.Subject(), control) {
			if m.Headers().Get(changelog.HeaderOp) != "" {
				t.keyState++
			} else {
				t.fences++
			}
			return
		}
		prefix, i, ok := keyOf(m)
		if c := t.counts[prefix]; !ok || i >= len(c) {
			t.foreign++
			return
		}
		t.counts[prefix][i]++
		if each != nil {
			each(prefix, i, m)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", stream, err)
	}
	t.total = n
	return t, nil
}

// readTallyRate is the slowest read of a stream readTally allows for,
// in messages a second: over loopback it reads 60k or more.
const readTallyRate = 20_000

// readBound bounds readTally's read of stream: a minute, and a second
// more per readTallyRate messages the stream holds (a 10M-message output
// took longer than a minute).
func readBound(ctx context.Context, js jetstream.JetStream, stream string) time.Duration {
	bound := time.Minute
	if st, err := js.Stream(ctx, stream); err == nil {
		bound += time.Duration(st.CachedInfo().State.Msgs/readTallyRate) * time.Second
	}
	return bound
}

// tallyOutput reads the output stream of group n by the payload's keys
// (readTally), keeping its control messages apart.
func (e *procEnv) tallyOutput(ctx context.Context, n streamNames, sizes map[string]int) (*tally, error) {
	return readTally(ctx, e.js, n.output, byKey(payloadKeys()), sizes, n.outPrefix, nil)
}

// byKey names a message by the workload key kf reads from it.
func byKey(kf *keys.KeyFunc) func(jetstream.Msg) (string, int, bool) {
	return func(m jetstream.Msg) (string, int, bool) {
		k, err := kf.Key(m.Subject(), m.Headers(), m.Data())
		if err != nil {
			return "", 0, false
		}
		return ParseKey(string(k))
	}
}

// payloadKeys reads a message's key from the payload's "id", as every
// workload carries it.
func payloadKeys() *keys.KeyFunc {
	kf, err := keys.NewKeyFunc(keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "id"}})
	if err != nil {
		panic(err) // a constant configuration
	}
	return kf
}
