package stage_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
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

// judgedBy waits until r has judged n messages since it started (every
// outcome), then until the group's consumers have nothing pending: a
// consumer's pending count can lag a message just stored, so the drained
// wait alone may pass before the message is delivered.
func (e *env) judgedBy(r *running, n float64) {
	e.t.Helper()
	natstest.WaitFor(e.t, 30*time.Second, fmt.Sprintf("%v messages judged", n), func() bool {
		return counter(e.t, r.reg, "dedupe_messages_total", nil) >= n
	})
	e.scaleOutDrained(30 * time.Second)
}

// forwardIDs returns the Nats-Msg-Id of every forward in the output stream
// (not its control records), in stream order.
func (e *env) forwardIDs() []string {
	e.t.Helper()
	var ids []string
	control := strings.TrimSuffix(changelog.ControlSubjects(e.cfg.Output.SubjectPrefix), ">")
	for _, m := range natstest.ReadAll(e.t, e.js, e.cfg.Output.Stream) {
		if !strings.HasPrefix(m.Subject, control) {
			ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
		}
	}
	return ids
}

// outputSeqIs fails the test unless r, running, answers inspect of key
// with the output sequence of the forward whose Nats-Msg-Id is id.
func (e *env) outputSeqIs(r *running, key, id string) {
	e.t.Helper()
	var want uint64
	for _, m := range natstest.ReadAll(e.t, e.js, e.cfg.Output.Stream) {
		if m.Header.Get(jetstream.MsgIDHeader) == id {
			want = m.Seq
		}
	}
	in, err := r.st.Inspect(context.Background(), key)
	if err != nil || want == 0 || in.OutputSeq == nil || *in.OutputSeq != want {
		e.t.Errorf("inspect %s = %+v, %v; want output_seq %d, the sequence of forward %s", key, in, err, want, id)
	}
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
	ea.judgedBy(a, 1)
	ea.publishOrder("o1", version("3"))
	ea.judgedBy(a, 2)
	a.kill(t, ea.nc)

	b := eb.start()
	eb.publishOrder("o1", version("2"))
	eb.judgedBy(b, 1)
	eb.publishOrder("o1", version("4"))
	eb.judgedBy(b, 2)
	got := strings.Join(eb.forwardIDs(), " ")
	if want := "o1:v1 o1:v3 o1:v4"; got != want {
		t.Errorf("output ids %q, want %q", got, want)
	}
	if n := counter(t, b.reg, "dedupe_messages_total", map[string]string{"outcome": "stale"}); n != 1 {
		t.Errorf("b judged %v copies stale, want 1 (version 2)", n)
	}
}

// TestScaleOutVersionOnTheLocalPath: with a header key the route step
// hands the owner of a partition its inputs to judge where they are (the
// local path), and those copies keep their version: versions 1, 3, 2 and
// 4 of a key give the forwards v1, v3 and v4, and 2 is stale.
func TestScaleOutVersionOnTheLocalPath(t *testing.T) {
	e := newEnv(t)
	e.cfg.Input.AckWait = config.Duration(2 * time.Second)
	e.cfg.ScaleOut.Enabled = true
	e.cfg.ScaleOut.Replicas = 1
	e.cfg.Key.Version = keys.FieldSpec{Source: keys.SourceHeader, Header: "Order-Version"}
	a := e.as("a").start()
	publish := func(v string) {
		natstest.PublishAll(t, e.js, []*nats.Msg{{Subject: "events.orders",
			Header: nats.Header{"Event-Id": {"o1"}, "Order-Version": {v}}, Data: []byte(`{"v":` + v + `}`)}})
	}
	publish("1")
	e.judgedBy(a, 1)
	local := counter(t, a.reg, "dedupe_route_messages_total", map[string]string{"outcome": "local"})
	for i, v := range []string{"3", "2", "4"} {
		publish(v)
		e.judgedBy(a, float64(2+i))
	}
	if got := counter(t, a.reg, "dedupe_route_messages_total", map[string]string{"outcome": "local"}) - local; got != 3 {
		t.Fatalf("%v copies judged on the local path, want the 3 after the first", got)
	}
	if got, want := strings.Join(e.forwardIDs(), " "), "o1:v1 o1:v3 o1:v4"; got != want {
		t.Errorf("output ids %q, want %q", got, want)
	}
	if n := counter(t, a.reg, "dedupe_messages_total", map[string]string{"outcome": "stale"}); n != 1 {
		t.Errorf("%v copies judged stale, want 1 (version 2)", n)
	}
}

// slidingGroup is policyGroup with a window of w that repeats slide.
func slidingGroup(t *testing.T, w time.Duration) (ea, eb *env) {
	return policyGroup(t, func(e *env) {
		e.cfg.Window.Paths = []config.Path{{Name: "retry", Max: config.Duration(w)}}
		e.cfg.Window.Margin = 0
		e.cfg.Window.RefreshOnRepeat = true
	})
}

// TestScaleOutRefreshAcrossHandOver: repeats keep a key's window alive
// past its first-seen time + W on owner a, a is killed, and b, which
// restores the partition from the changelog, still judges a copy a
// repeat after first-seen + W: the refreshes reached the changelog as
// key-state records. Without them b would forward the copy again.
func TestScaleOutRefreshAcrossHandOver(t *testing.T) {
	const w = 8 * time.Second
	ea, eb := slidingGroup(t, w)
	a := ea.start()
	// Each copy's publish is timed: the input stored it in between. The
	// stage judges on the input's clock, so what the test asks depends on
	// when the copies were stored, not on when b judged the last one.
	type sent struct{ before, after time.Time }
	publish := func(e *env) sent {
		s := sent{before: time.Now()}
		e.publishOrder("s1", nil)
		s.after = time.Now()
		return s
	}
	first := publish(ea)
	ea.judgedBy(a, 1)
	var last sent
	for i, at := range []time.Duration{w / 3, 2 * w / 3, w - w/8} {
		time.Sleep(time.Until(first.before.Add(at)))
		last = publish(ea)
		ea.judgedBy(a, float64(2+i))
	}
	if got := counter(t, a.reg, "dedupe_messages_total", map[string]string{"outcome": "repeat"}); got != 3 {
		t.Fatalf("a judged %v repeats, want 3", got)
	}
	a.kill(t, ea.nc)

	b := eb.start()
	time.Sleep(time.Until(first.after.Add(w + time.Second))) // past first-seen + W, inside the window the last repeat moved
	copied := publish(eb)
	eb.judgedBy(b, 1)
	if d := copied.after.Sub(last.before); d >= w {
		t.Fatalf("the copy was published up to %v after the last repeat, past the window it moved: the test published too slowly to tell", d)
	}
	if ids := eb.forwardIDs(); len(ids) != 1 {
		t.Errorf("output ids %q, want s1 once", ids)
	}
	if got := counter(t, b.reg, "dedupe_messages_total", map[string]string{"outcome": "repeat"}); got != 1 {
		t.Errorf("b judged %v repeats, want 1: the copy after first-seen + W", got)
		for _, m := range natstest.ReadAll(t, eb.js, eb.cfg.DeadLetter.Stream) {
			t.Logf("dead letter: %s %s", m.Header.Get("Dedupe-Reason"), m.Header.Get("Dedupe-Detail"))
		}
		for _, m := range natstest.ReadAll(t, eb.js, eb.cfg.Output.Stream) {
			t.Logf("output %d %s %v", m.Seq, m.Subject, m.Header)
		}
	}
	if got := counter(t, b.reg, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != 0 {
		t.Errorf("b judged %v copies new, want none (the output's duplicate window hides a second forward)", got)
	}
	if n := len(eb.keyStateRecords(partitionOf("s1", 4))); n != 4 {
		t.Errorf("%d key-state records in the changelog, want 4 refreshes (a's 3, b's 1)", n)
	}
	eb.outputSeqIs(b, "s1", "s1") // restored with the refreshes, which carry it
}

// keyStateRecords returns partition p's key-state records in the output
// stream.
func (e *env) keyStateRecords(p int) []natstest.Message {
	e.t.Helper()
	var out []natstest.Message
	for _, m := range natstest.ReadAll(e.t, e.js, e.cfg.Output.Stream) {
		if m.Subject == changelog.KeyStateSubject(e.cfg.Output.SubjectPrefix, p) {
			out = append(out, m)
		}
	}
	return out
}

// TestScaleOutForgetAcrossHandOver: an operator forgets a key on its
// partition's owner a (an instance that does not own it answers so and
// changes nothing), a is killed before the key's next copy, and b, which
// restores the partition from the changelog, forwards that copy exactly
// once, with the id a would have given it; a later copy is a repeat.
func TestScaleOutForgetAcrossHandOver(t *testing.T) {
	ea, eb := policyGroup(t, nil)
	a := ea.start()
	ea.publishOrder("f1", nil)
	ea.judgedBy(a, 1)
	if !slices.Contains(a.st.Status().Owned, partitionOf("f1", 4)) {
		t.Fatalf("a owns partitions %v, not f1's", a.st.Status().Owned)
	}
	b := eb.start()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r, err := b.st.Forget(ctx, "f1"); err != nil || r.Owner || r.Held {
		t.Fatalf("forget on b, which owns nothing = %+v, %v; want not the owner, nothing held", r, err)
	}
	r, err := a.st.Forget(ctx, "f1")
	if err != nil || !r.Owner || !r.Held {
		t.Fatalf("forget on the owner a = %+v, %v; want held and forgotten", r, err)
	}
	a.kill(t, ea.nc)

	eb.publishOrder("f1", nil)
	eb.judgedBy(b, 1)
	eb.publishOrder("f1", nil)
	eb.judgedBy(b, 2)
	got := strings.Join(eb.forwardIDs(), " ")
	if want := "f1 " + changelog.ForwardID("f1", r.Applied); got != want {
		t.Errorf("output ids %q, want %q: the copy after the forget once, with the forget's id", got, want)
	}
	if n := counter(t, b.reg, "dedupe_messages_total", map[string]string{"outcome": "new"}); n != 1 {
		t.Errorf("b judged %v copies new, want 1", n)
	}
	if n := counter(t, b.reg, "dedupe_messages_total", map[string]string{"outcome": "repeat"}); n != 1 {
		t.Errorf("b judged %v copies repeats, want 1 (the copy after the forwarded one)", n)
	}
}

// TestScaleOutForgetOnAPartitionTakenBeforeTraffic: b joins a's group
// with no traffic after a judged keys of every partition; the partitions
// a releases to b are taken before any message (pretake). A forget on b
// of a key in one of them is b's as the partition's owner: held,
// forgotten and covered, not "not the owner" until the partition's first
// batch.
func TestScaleOutForgetOnAPartitionTakenBeforeTraffic(t *testing.T) {
	ea, eb := policyGroup(t, nil)
	a := ea.start()
	byPartition := map[int]string{}
	for i := 0; len(byPartition) < 4; i++ {
		k := fmt.Sprintf("t%d", i)
		if _, ok := byPartition[partitionOf(k, 4)]; !ok {
			byPartition[partitionOf(k, 4)] = k
			ea.publishOrder(k, nil)
		}
	}
	ea.judgedBy(a, 4)
	b := eb.start()
	natstest.Poll(t, 60*time.Second, 200*time.Millisecond, "b to own 2 partitions", func() (bool, error) {
		owned := [2]int{len(a.st.Status().Owned), len(b.st.Status().Owned)}
		return owned == [2]int{2, 2}, fmt.Errorf("a owns %v, b owns %v", a.st.Status().Owned, b.st.Status().Owned)
	})
	if n := counter(t, b.reg, "dedupe_messages_total", nil); n != 0 {
		t.Fatalf("b judged %v messages; want none, its partitions taken before traffic", n)
	}
	p := b.st.Status().Owned[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := b.st.Forget(ctx, byPartition[p])
	if err != nil || !r.Owner || !r.Held || !slices.Contains(r.Coverage.Owned, p) {
		t.Fatalf("forget %s on b, which took its partition %d before traffic = %+v, %v; want held and forgotten by the owner", byPartition[p], p, r, err)
	}
	if in, err := b.st.Inspect(ctx, byPartition[p]); err != nil || in.InsideWindow || in.Forgotten == nil {
		t.Errorf("inspect %s on b after the forget = %+v, %v; want forgotten", byPartition[p], in, err)
	}
}

// TestScaleOutForgetByAZombieRefused: an owner whose partition's fence
// another instance took (a zombie) cannot forget: its tombstone, which
// expects its old fence, is refused, it answers as a non-owner, and the
// key stays held in its store.
func TestScaleOutForgetByAZombieRefused(t *testing.T) {
	ea, _ := policyGroup(t, nil)
	a := ea.start()
	ea.publishOrder("z1", nil)
	ea.judgedBy(a, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := partitionOf("z1", 4)
	if _, err := changelog.Take(ctx, ea.js, ea.cfg.Output.Stream, changelog.FenceSubject(ea.cfg.Output.SubjectPrefix, p), "other"); err != nil {
		t.Fatal(err)
	}
	r, err := a.st.Forget(ctx, "z1")
	if err != nil || r.Owner || r.Held {
		t.Fatalf("forget by the zombie = %+v, %v; want not the owner, nothing forgotten", r, err)
	}
	if n := len(ea.keyStateRecords(p)); n != 0 {
		t.Errorf("%d key-state records in the changelog, want none", n)
	}
	if in, err := a.st.Inspect(context.Background(), "z1"); err != nil || !in.InsideWindow || in.Forgotten != nil {
		t.Errorf("inspect z1 on the zombie = %+v, %v; want held, not forgotten", in, err)
	}
}

// TestScaleOutVersionThroughSnapshot: a partition snapshot carries a key's
// version, so an owner that loads it (with nothing after it to replay)
// judges an older version stale.
func TestScaleOutVersionThroughSnapshot(t *testing.T) {
	ea, eb := policyGroup(t, func(e *env) {
		e.cfg.Key.Version = keys.FieldSpec{Source: keys.SourceHeader, Header: "Order-Version"}
		e.cfg.ScaleOut.SnapshotInterval = config.Duration(time.Hour) // written by the test
		e.cfg.ScaleOut.Standbys = 0                                  // b, a warm standby, would take it from its local store
	})
	a := ea.start()
	ea.publishOrder("o1", nats.Header{"Order-Version": {"3"}})
	ea.judgedBy(a, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Alone in the group, a takes every partition before traffic, or
	// some of them by now: o1's at least.
	if n, err := a.st.WriteSnapshots(ctx); err != nil || n < 1 {
		t.Fatalf("write snapshots: %d, %v; want o1's partition among them", n, err)
	}
	a.kill(t, ea.nc)
	b := eb.start()
	eb.publishOrder("o1", nats.Header{"Order-Version": {"2"}})
	eb.judgedBy(b, 1)
	if got := strings.Join(eb.forwardIDs(), " "); got != "o1:v3" {
		t.Errorf("output ids %q, want o1:v3 alone", got)
	}
	if n := counter(t, b.reg, "dedupe_restore_path_total", map[string]string{"path": "snapshot"}); n != 1 {
		t.Errorf("%v takeovers restored from a snapshot, want 1", n)
	}
	eb.outputSeqIs(b, "o1", "o1:v3")
}
