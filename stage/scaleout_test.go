package stage_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/synadia-io/orbit.go/pcgroups"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/route"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/stage"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// newScaleOutEnv is an env whose stage runs as instance name of a
// scale-out group on a single server (R1 streams): the key is the second
// token of orders.<key>, 4 partitions.
func newScaleOutEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	e.cfg.Input.Subjects = []string{"orders.*"}
	e.cfg.Key = keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceSubject, SubjectToken: 2}, MaxLength: 256}
	e.cfg.Input.AckWait = config.Duration(2 * time.Second)
	e.cfg.ScaleOut.Enabled = true
	e.cfg.ScaleOut.Replicas = 1
	return e
}

// as returns a copy of e running as instance name on its own data dir.
func (e *env) as(name string) *env {
	c := *e
	c.cfg.ScaleOut.Instance = name
	c.cfg.State.DataDir = e.t.TempDir()
	return &c
}

// publishKeys publishes one message per key on orders.<key> with the
// key's payload.
func (e *env) publishKeys(ks []string, payload map[string][]byte) {
	e.t.Helper()
	msgs := make([]*nats.Msg, len(ks))
	for i, k := range ks {
		msgs[i] = &nats.Msg{Subject: "orders." + k, Data: payload[k]}
	}
	natstest.PublishAll(e.t, e.js, msgs)
}

// keysOf returns the keys of evs, in order.
func keysOf(evs []event) []string {
	ks := make([]string, len(evs))
	for i, ev := range evs {
		ks[i] = ev.key
	}
	return ks
}

// scaleOutDrained waits until every member consumer of the group (on the
// input, or on the routed stream) has nothing pending or unacked.
func (e *env) scaleOutDrained(timeout time.Duration) {
	e.t.Helper()
	stream := e.cfg.Input.Stream
	if routed, _ := e.cfg.ScaleOutPartitioning().Routed(); routed {
		stream = e.cfg.ScaleOut.RoutedStream
	}
	for p := range e.cfg.State.Partitions {
		name := layout.MemberConsumer(e.cfg.ScaleOut.Group, p)
		natstest.WaitFor(e.t, timeout, "member consumer "+name+" to ack everything", func() bool {
			c, err := e.js.Consumer(context.Background(), stream, name)
			if err != nil {
				return false
			}
			ci, err := c.Info(context.Background())
			return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
		})
	}
}

// scaleOutOutput reads the output's records (not its fences) by key and
// checks each is on its partition's subject with a record's headers.
func (e *env) scaleOutOutput() map[string]int {
	e.t.Helper()
	out := map[string]int{}
	for _, m := range natstest.ReadAll(e.t, e.js, e.cfg.Output.Stream) {
		if strings.HasPrefix(m.Subject, strings.TrimSuffix(changelog.ControlSubjects(e.cfg.Output.SubjectPrefix), ">")) {
			continue
		}
		r, err := changelog.DecodeHeader(m.Header)
		if err != nil {
			e.t.Errorf("output message on %s: %v", m.Subject, err)
			continue
		}
		key := r.Key
		if !strings.HasSuffix(m.Subject, ".orders."+string(key)) {
			e.t.Errorf("key %s on subject %s", key, m.Subject)
		}
		if m.Header.Get("Nats-Pin-Id") != "" {
			e.t.Errorf("key %s: the output carries the input's Nats-Pin-Id", key)
		}
		out[string(key)]++
	}
	return out
}

func (e *env) checkOnce(out map[string]int, unique map[string][]byte) {
	e.t.Helper()
	for k := range unique {
		if out[k] != 1 {
			e.t.Errorf("key %s: %d output messages, want 1", k, out[k])
		}
	}
	for k := range out {
		if _, ok := unique[k]; !ok {
			e.t.Errorf("output holds key %q that was never published", k)
		}
	}
}

// TestScaleOutHandOverRestoresFromScratch runs instance a of a group, which
// the server pins every partition to, then stops it cleanly while instance
// b, with an empty data dir, stands by: b takes every partition (it is
// unpinned at a's stop), restores each from the output stream, and
// recognises a copy of every key a forwarded, while it forwards the new
// keys once.
func TestScaleOutHandOverRestoresFromScratch(t *testing.T) {
	e := newScaleOutEnv(t)
	ea, eb := e.as("a"), e.as("b")
	evs, unique := workload(11, 3000, 0.2)
	ks := keysOf(evs)
	a := ea.start()
	e.publishKeys(ks, unique)
	e.scaleOutDrained(60 * time.Second)
	e.checkOnce(e.scaleOutOutput(), unique)
	if got := gauge(t, a.reg, "dedupe_partitions_owned"); got != 4 {
		t.Fatalf("instance a owns %v partitions, want all 4 (it is the only one)", got)
	}

	b := eb.start()
	a.stop(t)
	// Copies of every key, and as many new keys.
	fresh, freshPayload := workload(12, len(unique), 0)
	copies := make([]string, 0, 2*len(unique))
	for k := range unique {
		copies = append(copies, k)
	}
	for _, ev := range fresh {
		copies = append(copies, ev.key)
		unique[ev.key] = freshPayload[ev.key]
	}
	e.publishKeys(copies, unique)
	e.scaleOutDrained(90 * time.Second)
	e.checkOnce(e.scaleOutOutput(), unique)
	if got := gauge(t, b.reg, "dedupe_partitions_owned"); got != 4 {
		t.Errorf("instance b owns %v partitions after a stopped, want 4", got)
	}
	if got := counter(t, b.reg, "dedupe_partition_takeovers_total", nil); got != 4 {
		t.Errorf("instance b took over %v times, want 4", got)
	}
	firstRound := len(unique) - len(fresh)
	if got := counter(t, b.reg, "dedupe_restore_records_total", nil); got != float64(firstRound) {
		t.Errorf("instance b restored %v records, want the %d keys a forwarded", got, firstRound)
	}
	if got := counter(t, b.reg, "dedupe_messages_total", map[string]string{"outcome": "repeat"}); got < float64(firstRound) {
		t.Errorf("instance b recognised %v repeats, want at least the %d copies of a's keys", got, firstRound)
	}
}

// TestScaleOutFenceRefusesAndOwnerRetakes moves a partition's fence under
// a running owner, as a new owner does when it takes the partition: the
// owner's next batch is refused whole (counted), left unacked, and since
// the server still pins the owner it takes the fence back, restores what
// was written meanwhile (a record written by "another owner" here), and
// goes on. Nothing is forwarded twice, and the other owner's record is
// recognised as a repeat.
func TestScaleOutFenceRefusesAndOwnerRetakes(t *testing.T) {
	e := newScaleOutEnv(t).as("a")
	a := e.start()
	payload := map[string][]byte{}
	var first []string
	for i := range 200 {
		k := fmt.Sprintf("k-%d", i)
		payload[k] = []byte(`{"n":1}`)
		first = append(first, k)
	}
	e.publishKeys(first, payload)
	e.scaleOutDrained(60 * time.Second)

	// Another owner takes every partition's fence and forwards a key.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other := "taken-by-other"
	payload[other] = []byte(`{"n":2}`)
	for p := range 4 {
		f, err := changelog.Take(ctx, e.js, e.cfg.Output.Stream, changelog.FenceSubject(e.cfg.Output.SubjectPrefix, p), "other")
		if err != nil {
			t.Fatal(err)
		}
		if p == partitionOf(other, 4) {
			m := &nats.Msg{Subject: changelog.PartitionSubject(e.cfg.Output.SubjectPrefix, p, "orders."+other), Header: nats.Header{}, Data: payload[other]}
			m.Header.Set(jetstream.MsgIDHeader, other)
			changelog.Annotate(m.Header, time.Now(), fingerprintOf(payload[other]))
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, fmt.Sprint(f))
			m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, changelog.FenceSubject(e.cfg.Output.SubjectPrefix, p))
			if _, err := e.js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	var second []string
	for i := range 200 {
		k := fmt.Sprintf("k2-%d", i)
		payload[k] = []byte(`{"n":3}`)
		second = append(second, k)
	}
	second = append(second, other)
	e.publishKeys(second, payload)
	e.scaleOutDrained(60 * time.Second)
	e.checkOnce(e.scaleOutOutput(), payload)
	if got := counter(t, a.reg, "dedupe_fence_refusals_total", nil); got < 1 {
		t.Errorf("dedupe_fence_refusals_total = %v, want >= 1: no batch was refused by a moved fence", got)
	}
	if got := counter(t, a.reg, "dedupe_partition_takeovers_total", nil); got < 5 {
		t.Errorf("dedupe_partition_takeovers_total = %v, want >= 5 (4 at start, then again after a refusal)", got)
	}
	if got := gauge(t, a.reg, "dedupe_partitions_owned"); got != 4 {
		t.Errorf("instance owns %v partitions at the end, want 4", got)
	}
}

// partitionOf is the scale-out partition of a key: the server's.
func partitionOf(key string, n int) int { return state.PartitionFNV([]byte(key), n) }

// fingerprintOf is the payload fingerprint the stage records.
func fingerprintOf(data []byte) uint64 { return xxhash.Sum64(data) }

// routedOutput reads the output's records (not its fences) of a group
// whose key is the Event-Id header (env.publish) by key, and checks each
// is on its partition's subject under the input's and carries the input's
// headers.
func (e *env) routedOutput() map[string]int {
	t := e.t
	t.Helper()
	out := map[string]int{}
	for _, m := range natstest.ReadAll(t, e.js, e.cfg.Output.Stream) {
		if strings.HasPrefix(m.Subject, strings.TrimSuffix(changelog.ControlSubjects(e.cfg.Output.SubjectPrefix), ">")) {
			continue
		}
		r, err := changelog.DecodeHeader(m.Header)
		if err != nil {
			t.Errorf("output message on %s: %v", m.Subject, err)
			continue
		}
		key := r.Key
		if want := changelog.PartitionSubject(e.cfg.Output.SubjectPrefix, partitionOf(string(key), 4), "events.orders"); m.Subject != want {
			t.Errorf("key %s on subject %s, want %s", key, m.Subject, want)
		}
		if m.Header.Get("Trace") != "t-"+string(key) {
			t.Errorf("key %s: the input's headers were not carried: %v", key, m.Header)
		}
		for k := range m.Header {
			if route.IsCopyHeader(k) {
				t.Errorf("key %s: the output carries the route step's %s: %v", key, k, m.Header)
			}
		}
		out[string(key)]++
	}
	return out
}

// TestScaleOutRoutesHeaderKeys runs two instances of a group whose key is
// a header, so the route step partitions the input: a workload with
// repeats (adjacent and far apart) reaches the output once per key, on its
// partition's subject under the input's subject; inputs without a key are
// dead-lettered once, by the route step; and after the instance that owned
// the partitions stops, the other recognises copies of every key.
func TestScaleOutRoutesHeaderKeys(t *testing.T) {
	e := newEnv(t)
	e.cfg.Input.AckWait = config.Duration(2 * time.Second)
	e.cfg.ScaleOut.Enabled = true
	e.cfg.ScaleOut.Replicas = 1
	if routed, why := e.cfg.ScaleOutPartitioning().Routed(); !routed {
		t.Fatalf("header key: not routed (%s)", why)
	}
	ea, eb := e.as("a"), e.as("b")
	a := ea.start()
	b := eb.start()
	// Bundles start once each instance's presence watch has seen the
	// other's key say it reads them.
	for _, r := range []*running{a, b} {
		natstest.WaitFor(t, 30*time.Second, "the route step to write bundles", func() bool {
			return gauge(t, r.reg, "dedupe_route_bundles_on") == 1
		})
	}
	evs, unique := workload(21, 2000, 0.25)
	evs = append(evs, event{key: "", payload: []byte("no key 1")}, event{key: "", payload: []byte("no key 2")})
	e.publish(evs)
	natstest.WaitDrained(t, e.js, e.cfg.Input.Stream, "dedupe-route", 30*time.Second)
	e.scaleOutDrained(60 * time.Second)

	e.checkOnce(e.routedOutput(), unique)
	// With bundles on (the default), copies of one partition from one
	// route batch went as one routed message: the routed messages carried
	// more inputs than there were messages.
	msgs, inputs := 0.0, 0.0
	for _, r := range []*running{a, b} {
		if h := metrictest.Histogram(t, r.reg, "dedupe_route_copies_per_message"); h != nil {
			msgs, inputs = msgs+float64(h.GetSampleCount()), inputs+h.GetSampleSum()
		}
	}
	t.Logf("route_bundle_max %d: %v routed messages carried %v inputs", e.cfg.ScaleOut.RouteBundleMax, msgs, inputs)
	if msgs == 0 || inputs <= msgs {
		t.Errorf("%v routed messages carried %v inputs, want bundles (more inputs than messages)", msgs, inputs)
	}
	// Every instance reports the shared route consumer's backlog: nothing
	// once the input is routed.
	for _, r := range []*running{a, b} {
		natstest.Poll(t, 30*time.Second, 200*time.Millisecond, "the route consumer's backlog gauge at 0", func() (bool, error) {
			v, ok := metrictest.Lookup(t, r.reg, "dedupe_route_consumer_pending_messages", map[string]string{"kind": "pending"})
			return ok && v == 0, fmt.Errorf("gauge %v (reported: %v)", v, ok)
		})
	}
	dl := e.deadLetters()
	if len(dl) != 2 {
		t.Errorf("%d dead letters, want the 2 inputs without a key", len(dl))
	}
	for _, m := range dl {
		if r := m.Header.Get(deadletter.HeaderReason); r != "no_key" {
			t.Errorf("dead letter with reason %q, want no_key", r)
		}
	}
	// A partition balance released is owned again only when its next
	// message arrives, so between batches the two may own fewer than 4.
	// An instance whose partition another took (its pretake's fence
	// overwritten, its pin moved) counts it until its next balance pass
	// (every input.ack_wait, here 2 s) asks the server: then at most 4.
	natstest.Poll(t, 10*time.Second, 100*time.Millisecond, "the instances to own at most 4 partitions between them", func() (bool, error) {
		owned := gauge(t, a.reg, "dedupe_partitions_owned") + gauge(t, b.reg, "dedupe_partitions_owned")
		return owned <= 4, fmt.Errorf("they own %v", owned)
	})

	// The first instance stops; copies of every key go to the other.
	a.stop(t)
	var copies []event
	for k, p := range unique {
		copies = append(copies, event{key: k, payload: p})
	}
	e.publish(copies)
	natstest.WaitDrained(t, e.js, e.cfg.Input.Stream, "dedupe-route", 30*time.Second)
	e.scaleOutDrained(60 * time.Second)
	e.checkOnce(e.routedOutput(), unique)
	if got := gauge(t, b.reg, "dedupe_partitions_owned"); got != 4 {
		t.Errorf("instance b owns %v partitions after a stopped, want 4", got)
	}
}

// TestScaleOutBundlesWaitForEveryInstance: while the presence bucket
// holds a live instance of a version before bundles (its key's value is
// the time alone), the route step routes every copy alone, which that
// instance reads; once it is gone, the route step writes bundles. Every
// key reaches the output once either way.
func TestScaleOutBundlesWaitForEveryInstance(t *testing.T) {
	e := newEnv(t)
	e.cfg.Input.AckWait = config.Duration(2 * time.Second)
	e.cfg.ScaleOut.Enabled = true
	e.cfg.ScaleOut.Replicas = 1
	ctx := context.Background()
	bucket, every, ttl := layout.Presence(e.cfg.ScaleOut.Group, e.cfg.Input.AckWait.D())
	kv, err := e.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	// The older instance keeps its key alive, as it would, until it stops.
	older, stopOlder := context.WithCancel(ctx)
	put := func() {
		if _, err := kv.Put(ctx, "older", []byte(time.Now().UTC().Format(time.RFC3339Nano))); err != nil {
			t.Errorf("put the older instance's key: %v", err)
		}
	}
	put()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(every / 2)
		defer tk.Stop()
		for {
			select {
			case <-older.Done():
				return
			case <-tk.C:
				put()
			}
		}
	}()
	defer func() { stopOlder(); <-done }()
	a := e.as("a").start()
	evs, unique := workload(22, 1000, 0.25)
	e.publish(evs)
	natstest.WaitDrained(t, e.js, e.cfg.Input.Stream, "dedupe-route", 30*time.Second)
	h := metrictest.Histogram(t, a.reg, "dedupe_route_copies_per_message")
	t.Logf("with the older instance live: %d routed messages carried %v inputs", h.GetSampleCount(), h.GetSampleSum())
	if h.GetSampleCount() == 0 || h.GetSampleSum() != float64(h.GetSampleCount()) {
		t.Errorf("%d routed messages carried %v inputs, want every copy alone while an instance that cannot read bundles is live",
			h.GetSampleCount(), h.GetSampleSum())
	}
	if on := gauge(t, a.reg, "dedupe_route_bundles_on"); on != 0 {
		t.Errorf("dedupe_route_bundles_on = %v with the older instance live, want 0", on)
	}

	// The older instance stops: its key goes, and bundles start.
	stopOlder()
	<-done
	if err := kv.Delete(ctx, "older"); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 30*time.Second, "the route step to write bundles", func() bool {
		return gauge(t, a.reg, "dedupe_route_bundles_on") == 1
	})
	// A second instance of this version: the copies between the two go
	// in bundles. Copies of every key are all judged repeats.
	b := e.as("b").start()
	natstest.WaitFor(t, 30*time.Second, "instance b to say it reads bundles", func() bool {
		return gauge(t, b.reg, "dedupe_route_bundles_on") == 1
	})
	var copies []event
	for k, p := range unique {
		copies = append(copies, event{key: k, payload: p})
	}
	e.publish(copies)
	natstest.WaitDrained(t, e.js, e.cfg.Input.Stream, "dedupe-route", 30*time.Second)
	msgs, inputs := -float64(h.GetSampleCount()), -h.GetSampleSum()
	for _, r := range []*running{a, b} {
		h := metrictest.Histogram(t, r.reg, "dedupe_route_copies_per_message")
		msgs, inputs = msgs+float64(h.GetSampleCount()), inputs+h.GetSampleSum()
	}
	t.Logf("with every instance reading bundles: %v routed messages carried %v inputs", msgs, inputs)
	if inputs <= msgs {
		t.Errorf("%v routed messages carried %v inputs, want bundles once every live instance reads them", msgs, inputs)
	}
	e.scaleOutDrained(60 * time.Second)
	e.checkOnce(e.routedOutput(), unique)
}

// TestScaleOutJudgesOwnedPartitionsLocally runs one instance of a group
// whose key is a header. Once it owns every partition, the route step
// hands it each input to judge where it is: nothing more is copied into
// the routed stream, and new keys and copies of the first round's keys
// reach the output once, as through the routed stream.
func TestScaleOutJudgesOwnedPartitionsLocally(t *testing.T) {
	e := newEnv(t)
	e.cfg.Input.AckWait = config.Duration(2 * time.Second)
	e.cfg.ScaleOut.Enabled = true
	e.cfg.ScaleOut.Replicas = 1
	a := e.as("a").start()
	evs, unique := workload(31, 400, 0)
	e.publish(evs)
	natstest.WaitDrained(t, e.js, e.cfg.Input.Stream, "dedupe-route", 30*time.Second)
	e.scaleOutDrained(60 * time.Second)
	natstest.WaitFor(t, 30*time.Second, "instance a to own every partition", func() bool {
		return gauge(t, a.reg, "dedupe_partitions_owned") == 4
	})
	routedLast := func() uint64 {
		st, err := e.js.Stream(context.Background(), e.cfg.ScaleOut.RoutedStream)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().State.LastSeq
	}
	before := routedLast()
	local := counter(t, a.reg, "dedupe_route_messages_total", map[string]string{"outcome": "local"})

	more, moreUnique := workload(32, 600, 0.3)
	for k, p := range unique { // copies of the first round's keys
		more = append(more, event{key: k, payload: p})
	}
	e.publish(more)
	natstest.WaitDrained(t, e.js, e.cfg.Input.Stream, "dedupe-route", 30*time.Second)
	e.scaleOutDrained(60 * time.Second)
	if got := routedLast(); got != before {
		t.Errorf("the routed stream's last sequence went from %d to %d: copies were routed for partitions the instance owns", before, got)
	}
	if got := counter(t, a.reg, "dedupe_route_messages_total", map[string]string{"outcome": "local"}) - local; got < float64(len(more)) {
		t.Errorf("%v inputs judged locally, want all %d", got, len(more))
	}
	maps.Copy(unique, moreUnique)
	e.checkOnce(e.routedOutput(), unique)
}

// TestScaleOutBalances starts instance a alone, which the server pins
// every partition to, then instance b: a releases the partitions beyond
// its fair share (2 of 4 with two instances) and b takes them, while the
// input flows; every key still reaches the output once, and copies of
// every key, sent after the move, are recognised.
func TestScaleOutBalances(t *testing.T) {
	e := newScaleOutEnv(t)
	ea, eb := e.as("a"), e.as("b")
	payload := map[string][]byte{}
	var sent []string
	batch := func(round int) {
		var ks []string
		for i := range 50 {
			k := fmt.Sprintf("r%d-%d", round, i)
			payload[k] = []byte(k)
			ks = append(ks, k)
		}
		sent = append(sent, ks...)
		e.publishKeys(ks, payload)
	}
	a := ea.start()
	batch(0)
	e.scaleOutDrained(60 * time.Second)
	if got := gauge(t, a.reg, "dedupe_partitions_owned"); got != 4 {
		t.Fatalf("a alone owns %v partitions, want 4", got)
	}
	b := eb.start()
	round := 0
	// A release is counted once it is done: after the hand-off watch
	// (up to 2 s) that follows the partition leaving a's owned set.
	natstest.Poll(t, 60*time.Second, 200*time.Millisecond, "a and b to own 2 partitions each, a's releases done", func() (bool, error) {
		round++
		batch(round)
		owned := [2]float64{gauge(t, a.reg, "dedupe_partitions_owned"), gauge(t, b.reg, "dedupe_partitions_owned")}
		released := counter(t, a.reg, "dedupe_partition_releases_total", nil)
		return owned == [2]float64{2, 2} && released >= 2, fmt.Errorf("a owns %v, b owns %v, a released %v", owned[0], owned[1], released)
	})
	if got := counter(t, a.reg, "dedupe_partition_releases_total", nil); got != 2 {
		t.Errorf("a released %v partitions, want 2", got)
	}
	e.publishKeys(sent, payload) // a copy of every key, after the move
	e.scaleOutDrained(60 * time.Second)
	e.checkOnce(e.scaleOutOutput(), payload)
	if got := counter(t, b.reg, "dedupe_partition_takeovers_total", nil); got != 2 {
		t.Errorf("b took over %v partitions, want 2", got)
	}
}

// TestScaleOutTakeoverChecksRetention starts instance b beside instance a,
// which owns every partition, then shortens the output stream's max_age
// below what a restore reads back and stops a: b does not take partitions
// whose changelog may be short (the messages stay unacked and nothing is
// forwarded) until the stream keeps enough again; then b takes every
// partition and forwards each key once.
func TestScaleOutTakeoverChecksRetention(t *testing.T) {
	e := newScaleOutEnv(t)
	e.cfg.Output.RestartMargin = config.Duration(time.Second) // a 1m duplicate window passes the start-up check
	ea, eb := e.as("a"), e.as("b")
	evs, unique := workload(31, 400, 0)
	ks := keysOf(evs)
	a := ea.start()
	e.publishKeys(ks[:200], unique)
	e.scaleOutDrained(60 * time.Second)

	ctx := context.Background()
	st, err := e.js.Stream(ctx, e.cfg.Output.Stream)
	if err != nil {
		t.Fatal(err)
	}
	dup := st.CachedInfo().Config.Duplicates
	setMaxAge := func(d time.Duration) {
		t.Helper()
		c := st.CachedInfo().Config
		c.MaxAge, c.Duplicates = d, dup
		if d > 0 {
			c.Duplicates = min(dup, d) // the server refuses a window past max_age
		}
		if _, err := e.js.UpdateStream(ctx, c); err != nil {
			t.Fatalf("set the output's max_age to %v: %v", d, err)
		}
	}
	b := eb.start()        // checked at its start, while the stream keeps enough
	setMaxAge(time.Minute) // the restore reads back W + ack_wait + margin, over an hour
	a.stop(t)
	e.publishKeys(ks[200:], unique)
	e.refusedAgain(b, "limits") // b is offered the partitions again and again
	if got := counter(t, b.reg, "dedupe_partition_takeovers_total", nil); got != 0 {
		t.Errorf("instance b took partitions %v times with a changelog kept for 1m, want 0", got)
	}
	if got := counter(t, b.reg, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != 0 {
		t.Errorf("instance b forwarded %v keys without taking a partition", got)
	}

	setMaxAge(0)
	e.scaleOutDrained(60 * time.Second)
	e.checkOnce(e.scaleOutOutput(), unique)
	if got := counter(t, b.reg, "dedupe_partition_takeovers_total", nil); got < 4 {
		t.Errorf("instance b took partitions %v times once the stream kept enough, want at least 4", got)
	}
}

// TestScaleOutMismatchedGroupRefusedAtOnce starts an instance against a
// static consumer group that already exists with other members: no retry
// can change that, so the start fails at once, naming the group, instead
// of asking again for as long as a lost request would be.
func TestScaleOutMismatchedGroupRefusedAtOnce(t *testing.T) {
	e := newScaleOutEnv(t)
	first := e.start() // creates the streams and the group, a member per partition
	first.stop(t)
	ctx := context.Background()
	if err := pcgroups.DeleteStatic(ctx, e.js, e.cfg.Input.Stream, e.cfg.ScaleOut.Group); err != nil {
		t.Fatal(err)
	}
	one := []pcgroups.MemberMapping{{Member: "all", Partitions: []int{0, 1, 2, 3}}}
	if _, err := pcgroups.CreateStatic(ctx, e.js, e.cfg.Input.Stream, e.cfg.ScaleOut.Group, 4, nil, nil, one); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	_, err := stage.New(ctx, stage.Options{Config: e.cfg, Conn: e.nc, Registry: prometheus.NewRegistry(), Clock: e.clock})
	if err == nil || !strings.Contains(err.Error(), "static consumer group dedupe") {
		t.Fatalf("start against a group with other members: %v, want a refusal naming the group", err)
	}
	if took := time.Since(started); took > 10*time.Second {
		t.Errorf("the refusal took %v: a mismatched group was asked again", took)
	}
}
