package stage_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// TestAmbiguousJSONKeysAreDeadLettered sends JSON payloads whose key two
// parsers would read differently (a member named twice on the key's path)
// or that carry data after the JSON value: each is dead-lettered
// bad_payload with a detail that says why, and a good event after them is
// forwarded.
func TestAmbiguousJSONKeysAreDeadLettered(t *testing.T) {
	e := newEnv(t)
	e.cfg.Key = keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "meta.id"}, MaxLength: 256}
	e.start()
	bad := map[string]string{
		`{"meta":{"id":"a","id":"b"}}`:            "duplicate member \"id\"",
		`{"meta":{"id":"a"},"meta":{"id":"b"}}`:   "duplicate member \"meta\"",
		`{"meta":{"id":"a"}} {"meta":{"id":"b"}}`: "data after the top-level value",
	}
	var evs []event
	for payload := range bad {
		evs = append(evs, event{payload: []byte(payload)})
	}
	evs = append(evs, event{payload: []byte(`{"meta":{"id":"good-1"},"x":[1,{"id":1,"id":2}]}`)})
	e.publish(evs)
	e.drained(30 * time.Second)

	dl := natstest.ReadAll(t, e.js, e.cfg.DeadLetter.Stream)
	if len(dl) != len(bad) {
		t.Fatalf("%d dead letters, want %d", len(dl), len(bad))
	}
	for _, m := range dl {
		want, ok := bad[string(m.Data)]
		if reason := m.Header.Get(deadletter.HeaderReason); !ok || reason != keys.ReasonBadPayload {
			t.Errorf("dead letter %s with reason %q, want one of the bad payloads with %s", m.Data, reason, keys.ReasonBadPayload)
			continue
		}
		if detail := m.Header.Get(deadletter.HeaderDetail); !strings.Contains(detail, want) {
			t.Errorf("dead letter %s: detail %q does not say %q", m.Data, detail, want)
		}
	}
	if out := e.outputByKey(); len(out) != 1 || len(out["good-1"]) != 1 {
		t.Errorf("output %v, want good-1 once (a duplicate off the key's path changes nothing)", out)
	}
}
