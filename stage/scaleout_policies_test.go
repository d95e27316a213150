package stage_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/handover"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// policyGroup is a scale-out env whose instance a runs on a connection of
// its own (so that it can be killed) and b stands by to take over.
func policyGroup(t *testing.T, edit func(e *env)) (ea, eb *env) {
	t.Helper()
	e := newScaleOutEnv(t)
	if edit != nil {
		edit(e)
	}
	ea, eb = e.as("a"), e.as("b")
	ea.nc, ea.js = natstest.Connect(t, e.srv.ClientURL())
	return ea, eb
}

// publishOrder publishes one message on orders.<key> with headers h.
func (e *env) publishOrder(key string, h nats.Header) {
	e.t.Helper()
	natstest.PublishAll(e.t, e.js, []*nats.Msg{{Subject: "orders." + key, Header: h, Data: []byte(`{"k":"` + key + `"}`)}})
}

// forwardIDs returns the Nats-Msg-Id of every forward in the output stream
// (not its control records), in stream order.
func (e *env) forwardIDs() []string {
	e.t.Helper()
	var ids []string
	control := strings.TrimSuffix(handover.ControlSubjects(e.cfg.Output.SubjectPrefix), ">")
	for _, m := range natstest.ReadAll(e.t, e.js, e.cfg.Output.Stream) {
		if !strings.HasPrefix(m.Subject, control) {
			ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
		}
	}
	return ids
}

// TestScaleOutVersionAcrossHandOver: versions 1 and 3 of a key go through
// owner a, a is killed, and versions 2 and 4 reach b, which restores the
// partition from the changelog: b judges 2 stale (the changelog carries
// version 3) and forwards 4. Without the version in the changelog, b
// would forward 2 as well.
func TestScaleOutVersionAcrossHandOver(t *testing.T) {
	ea, eb := policyGroup(t, func(e *env) {
		e.cfg.Key.Version = keys.FieldSpec{Source: keys.SourceHeader, Header: "Order-Version"}
	})
	version := func(v string) nats.Header { return nats.Header{"Order-Version": {v}} }
	a := ea.start()
	ea.publishOrder("o1", version("1"))
	ea.scaleOutDrained(30 * time.Second)
	ea.publishOrder("o1", version("3"))
	ea.scaleOutDrained(30 * time.Second)
	a.kill(t, ea.nc)

	b := eb.start()
	eb.publishOrder("o1", version("2"))
	eb.scaleOutDrained(30 * time.Second)
	eb.publishOrder("o1", version("4"))
	eb.scaleOutDrained(30 * time.Second)
	got := strings.Join(eb.forwardIDs(), " ")
	if want := "o1:v1 o1:v3 o1:v4"; got != want {
		t.Errorf("output ids %q, want %q", got, want)
	}
	if n := counter(t, b.reg, "dedupe_messages_total", map[string]string{"outcome": "stale"}); n != 1 {
		t.Errorf("b judged %v copies stale, want 1 (version 2)", n)
	}
}
