package stage_test

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// TestReadBackWithTotals is TestReadBackAfterACrashBetweenPublishAndCommit
// with totals on: some clicks' forwards, with the contribution headers a
// forward carries, are in the output after the store's watermark and not
// in the store, as a kill between publish and commit leaves them. The
// start reads them back with their contributions; then every click comes
// in, those keys again as the redelivered copies. Every key is forwarded
// once and each (campaign, minute) total equals the ground truth: no
// contribution lost, none counted twice.
func TestReadBackWithTotals(t *testing.T) {
	e := newEnv(t)
	e.withTotals()
	e.cfg.Totals.Time = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "ts"}
	e.cfg.Totals.Value = keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "amount"}
	evs, _, truth := clickWorkload(17, 2000, 0.2, time.Now())
	unique := map[string][]byte{}
	for _, c := range evs {
		unique[c.key] = c.event().payload
	}
	r := e.start()
	r.stop(t)

	// Every 10th key's forward, as the stage publishes it.
	var before []*nats.Msg
	seen := map[string]bool{}
	for _, c := range evs {
		if seen[c.key] {
			continue
		}
		if seen[c.key] = true; len(seen)%10 != 0 {
			continue
		}
		m := &nats.Msg{Subject: e.cfg.Output.Subject("events.orders"), Header: nats.Header{}, Data: c.event().payload}
		m.Header.Set(jetstream.MsgIDHeader, c.key)
		m.Header.Set("Event-Id", c.key)
		m.Header.Set("Trace", "t-"+c.key)
		changelog.AnnotateTotal(m.Header, c.campaign, state.BucketOf(time.Unix(c.ts, 0), time.Minute), c.amount)
		before = append(before, m)
	}
	natstest.PublishAll(t, e.js, before)

	r = e.start()
	if got := counter(t, r.reg, "dedupe_start_restored_records_total", nil); got != float64(len(before)) {
		t.Errorf("dedupe_start_restored_records_total = %v, want %d (the forwards after the watermark)", got, len(before))
	}
	e.publishClicks(evs)
	e.drained(60 * time.Second)
	r.stop(t) // flushes the totals once more
	e.assertExactlyOnce(unique)
	if got := counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != float64(len(unique)-len(before)) {
		t.Errorf("%v keys judged new, want %d", got, len(unique)-len(before))
	}
	assertTotals(t, "KV sink", e.kvTotals(), truth)

	// The stage's own forwards carry their contribution as those above.
	for _, m := range natstest.ReadAll(t, e.js, e.cfg.Output.Stream) {
		var c struct {
			Campaign string `json:"campaign"`
			TS       int64  `json:"ts"`
			Amount   int64  `json:"amount"`
		}
		if err := json.Unmarshal(m.Data, &c); err != nil {
			t.Fatalf("output %d: %v", m.Seq, err)
		}
		h := m.Header
		if g, b, v := h.Get(changelog.HeaderGroup), h.Get(changelog.HeaderBucket), h.Get(changelog.HeaderValue); g != c.Campaign ||
			b != strconv.FormatInt(state.BucketOf(time.Unix(c.TS, 0), time.Minute).Unix(), 10) || v != strconv.FormatInt(c.Amount, 10) {
			t.Fatalf("output %d (%s): contribution headers %q %q %q, want the click's campaign, minute and amount", m.Seq, m.Data, g, b, v)
		}
	}
}
