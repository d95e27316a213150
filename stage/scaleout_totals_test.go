package stage_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/sink"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// publishClicksOn publishes clicks on orders.<key>, the scale-out env's
// key token, with their JSON payloads.
func (e *env) publishClicksOn(cs []click) {
	e.t.Helper()
	msgs := make([]*nats.Msg, len(cs))
	for i, c := range cs {
		msgs[i] = &nats.Msg{Subject: "orders." + c.key, Data: c.event().payload}
	}
	natstest.PublishAll(e.t, e.js, msgs)
}

// waitTotals waits until the KV sink holds exactly want.
func (e *env) waitTotals(what string, want map[string]int64, timeout time.Duration) {
	e.t.Helper()
	same := func(got map[string]int64) bool {
		if len(got) != len(want) {
			return false
		}
		for id, v := range want {
			if got[id] != v {
				return false
			}
		}
		return true
	}
	var got map[string]int64
	if !natstest.Until(timeout, 100*time.Millisecond, func() bool {
		got = e.kvTotals()
		return same(got)
	}) {
		assertTotals(e.t, what, got, want)
	}
}

// clickSums returns the ground truth of cs: the sum of amounts of each
// (campaign, minute), counting each key once, and how many keys there
// are.
func clickSums(cs []click) (sum map[string]int64, keys int) {
	seen := map[string]bool{}
	sum = map[string]int64{}
	for _, c := range cs {
		if seen[c.key] {
			continue
		}
		seen[c.key] = true
		sum[sink.Total{Group: c.campaign, Bucket: state.BucketOf(time.Unix(c.ts, 0), time.Minute)}.ID()] += c.amount
	}
	return sum, len(seen)
}

// TestScaleOutTotalsAcrossHandOvers sums totals per (campaign, minute)
// with scale-out: the group is a JSON field, so the route step partitions
// by it. Instance a counts a third of the events; it stops and instance b,
// with an empty data dir, takes every partition, restores the keys and
// the open totals from the output stream, and counts the second third
// (with copies of the first); b stops and a takes the partitions back
// from its own cursor, restoring only what b wrote, and counts the rest.
// After each part the KV sink holds exactly the ground truth: a new owner
// that did not resume the open totals would flush smaller ones, which the
// sink would not take, and one that counted a restored event again would
// flush larger ones.
func TestScaleOutTotalsAcrossHandOvers(t *testing.T) {
	e := newScaleOutEnv(t)
	e.withTotals()
	e.cfg.Totals.Sinks.Stream.Stream = "" // the KV sink is enough here
	e.cfg.Totals.Time = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "ts"}
	e.cfg.Totals.Value = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "amount"}
	if routed, why := e.cfg.ScaleOutPartitioning().Routed(); !routed {
		t.Fatalf("a JSON group is not routed: %s", why)
	}
	ea, eb := e.as("a"), e.as("b")
	evs, _, _ := clickWorkload(21, 4500, 0.3, time.Now())
	third := len(evs) / 3
	truthOf := func(cs []click) map[string]int64 {
		sum, _ := clickSums(cs)
		return sum
	}

	a := ea.start()
	e.publishClicksOn(evs[:third])
	e.scaleOutDrained(60 * time.Second)
	e.waitTotals("instance a alone", truthOf(evs[:third]), 30*time.Second)

	b := eb.start()
	a.stop(t)
	e.publishClicksOn(evs[third : 2*third])
	e.scaleOutDrained(90 * time.Second)
	e.waitTotals("instance b, restored from scratch", truthOf(evs[:2*third]), 30*time.Second)
	if got := counter(t, b.reg, "dedupe_partition_takeovers_total", nil); got < 4 {
		t.Errorf("instance b took over %v times, want at least 4", got)
	}

	a = ea.start()
	b.stop(t)
	e.publishClicksOn(evs[2*third:])
	e.scaleOutDrained(90 * time.Second)
	e.waitTotals("instance a again, from its cursor", truthOf(evs), 30*time.Second)
	restored := counter(t, a.reg, "dedupe_restore_records_total", nil)
	_, upToB := clickSums(evs[:2*third])
	_, upToA := clickSums(evs[:third])
	if forwardedByB := float64(upToB - upToA); restored != forwardedByB {
		t.Errorf("instance a restored %v records when it regained its partitions, want the %v that b forwarded", restored, forwardedByB)
	}
	if n := counter(t, a.reg, "dedupe_totals_late_events_total", nil); n != 0 {
		t.Errorf("%v late events, want 0", n)
	}

	// An event time further ahead than scale_out.max_event_time_ahead
	// (1h) would escape a new owner's restore: dead-lettered, not counted.
	future := click{key: "future", campaign: "camp-0", ts: time.Now().Add(2 * time.Hour).Unix(), amount: 5}
	e.publishClicksOn([]click{future})
	natstest.WaitFor(t, 30*time.Second, "the future event dead-lettered", func() bool {
		for _, m := range e.deadLetters() {
			if m.Header.Get("Dedupe-Reason") == string(deadletter.ReasonFutureTime) {
				return true
			}
		}
		return false
	})
	e.waitTotals("after the future event", truthOf(evs), 5*time.Second)

	// Every record carries what it added, as the restores read it.
	for _, m := range natstest.ReadAll(t, e.js, e.cfg.Output.Stream) {
		if m.Header.Get(changelog.HeaderFirstSeen) == "" {
			continue // a fence
		}
		r, err := changelog.DecodeHeader(m.Header)
		if err != nil || r.Group == "" {
			t.Fatalf("output record %s: %+v, %v; want a contribution to a total", m.Subject, r, err)
		}
	}
}
