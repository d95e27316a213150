package route_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/route"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// routeOneBundle routes n inputs of one key's partition with BundleMax n
// (one batch), in bundles of the newest form, and returns a consumer of
// the routed stream, with ackWait, that has the bundle to deliver.
func routeOneBundle(t *testing.T, n int, ackWait time.Duration) jetstream.Consumer {
	t.Helper()
	return routeOneBundleOf(t, n, ackWait, route.BundleForm2)
}

// routeOneBundleOf is routeOneBundle in bundles of form.
func routeOneBundleOf(t *testing.T, n int, ackWait time.Duration, form int) jetstream.Consumer {
	t.Helper()
	e := newEnv(t, 1, ackWait)
	o, _ := e.options(t, keyFunc(t, keys.DefaultKeyConfig()), 1, ackWait)
	o.BundleMax, o.BatchLinger, o.BatchesInFlight = n, 200*time.Millisecond, 1
	o.BundleForm = func() int { return form }
	publishEvents(t, e.js, n)
	start(t, o)
	natstest.WaitDrained(t, e.js, input, route.ConsumerName(group), time.Minute)
	cons, err := e.js.CreateConsumer(context.Background(), routedStream, jetstream.ConsumerConfig{
		Durable: "member", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

// nextBundle fetches the next message of cons and unbundles it.
func nextBundle(t *testing.T, cons jetstream.Consumer) (jetstream.Msg, []jetstream.Msg) {
	t.Helper()
	b, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("fetch the bundle: %v", err)
	}
	parts, err := route.Unbundle(b)
	if err != nil {
		t.Fatalf("unbundle: %v", err)
	}
	return b, parts
}

// ackPending returns cons's delivered, unacked messages.
func ackPending(t *testing.T, cons jetstream.Consumer) int {
	t.Helper()
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.NumAckPending
}

// TestBundleSettlesWhenEveryPartDoes: a bundle is acked only once each of
// its inputs is acked or given up (Term), each counted once however often
// it is settled; until then it stays with the member that holds it. Each
// part of a form-2 bundle has its input's origin (OriginOfMsg,
// InputOfMsg) and its input's own headers, publish directives left out,
// with nothing of the route step's.
func TestBundleSettlesWhenEveryPartDoes(t *testing.T) {
	const n = 5
	cons := routeOneBundle(t, n, 10*time.Second)
	b, parts := nextBundle(t, cons)
	if len(parts) != n {
		t.Fatalf("the bundle carries %d inputs, want %d (the batch's, one partition)", len(parts), n)
	}
	for i, p := range parts {
		checkPart(t, i, p)
		h := p.Headers()
		if h.Get(jetstream.MsgIDHeader) != "id-"+strconv.Itoa(i) || h.Get("Tenant") != "t"+strconv.Itoa(i%3) ||
			h.Get(route.HeaderKey) != "" || h.Get(route.HeaderInputTime) != "" || h.Get(jetstream.ExpectedStreamHeader) != "" {
			t.Errorf("part %d: headers %v, want the input's own (Nats-Msg-Id id-%d), no directive, nothing of the route step's", i, h, i)
		}
	}
	if b.Headers().Get(route.HeaderBundle) != "2" {
		t.Errorf("bundle header %q, want form 2", b.Headers().Get(route.HeaderBundle))
	}
	for i, p := range parts[:n-1] {
		settle := p.Ack
		if i == 1 {
			settle = p.Term // a dead-lettered input
		}
		if err := settle(); err != nil {
			t.Fatal(err)
		}
	}
	_ = parts[0].Ack()                 // a part settled twice counts once
	time.Sleep(500 * time.Millisecond) // an ack, had one gone out, has landed
	if got := ackPending(t, cons); got != 1 {
		t.Fatalf("with one part unsettled the member has %d unacked, want the bundle", got)
	}
	if err := parts[n-1].Ack(); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 5*time.Second, "the bundle acked", func() bool { return ackPending(t, cons) == 0 })
}

// checkPart checks part i of a bundle of inputs 1..n of publishEvents:
// its origin and input, its payload, and the bundle's metadata.
func checkPart(t *testing.T, i int, p jetstream.Msg) {
	t.Helper()
	o, err := route.OriginOfMsg(routedSubject, p)
	if err != nil || o.Sequence != uint64(i+1) || o.Stream != input || string(o.Key) != "id-"+strconv.Itoa(i) ||
		o.Time.IsZero() || time.Since(o.Time) > time.Minute || string(p.Data()) != "payload "+strconv.Itoa(i) {
		t.Errorf("part %d: origin %+v, %v, payload %q; want input %d, key id-%d", i, o, err, p.Data(), i+1, i)
	}
	if subj, stream, seq, ok := route.InputOfMsg(routedSubject, p); !ok || subj != o.Subject || stream != input || seq != uint64(i+1) {
		t.Errorf("part %d: input %q %q %d %v, want %q %q %d", i, subj, stream, seq, ok, o.Subject, input, i+1)
	}
	if md, err := p.Metadata(); err != nil || md.Stream != routedStream {
		t.Errorf("part %d: metadata %+v, %v, want the bundle's", i, md, err)
	}
}

// TestBundleOfForm1IsStillRead: a form-1 bundle, as a version that reads
// no other writes it, is read as before: each part has the headers of
// its routed copy alone, and the same origin a form-2 part has.
func TestBundleOfForm1IsStillRead(t *testing.T) {
	const n = 3
	cons := routeOneBundleOf(t, n, 10*time.Second, route.BundleForm1)
	b, parts := nextBundle(t, cons)
	if b.Headers().Get(route.HeaderBundle) != "1" || len(parts) != n {
		t.Fatalf("bundle header %q with %d parts, want form 1 with %d", b.Headers().Get(route.HeaderBundle), len(parts), n)
	}
	for i, p := range parts {
		checkPart(t, i, p)
		h := p.Headers()
		if h.Get(route.HeaderKey) != "id-"+strconv.Itoa(i) || h.Get(route.HeaderOriginalMsgID) != "id-"+strconv.Itoa(i) ||
			h.Get(jetstream.MsgIDHeader) != route.MsgID(input, uint64(i+1)) {
			t.Errorf("part %d: headers %v, want its routed copy's", i, h)
		}
	}
}

// TestBundleNakBringsItBack: one part's nak brings the whole bundle back,
// at once, with every input (those already acked are judged again as
// repeats); the parts' later acks do not ack it.
func TestBundleNakBringsItBack(t *testing.T) {
	const n = 4
	cons := routeOneBundle(t, n, 10*time.Second)
	_, parts := nextBundle(t, cons)
	_ = parts[0].Ack()
	if err := parts[1].Nak(); err != nil {
		t.Fatal(err)
	}
	_ = parts[1].Nak() // a second nak of the same bundle is not sent again
	for _, p := range parts[2:] {
		_ = p.Ack()
	}
	again, parts2 := nextBundle(t, cons)
	md, err := again.Metadata()
	if err != nil || md.NumDelivered != 2 || len(parts2) != n {
		t.Fatalf("after a part's nak: delivery %+v, %v, %d parts; want the bundle's second delivery with %d", md, err, len(parts2), n)
	}
}

// TestBundleLeftUnsettledComesBackAfterAckWait: a part neither acked nor
// nakked (its partition lost to another instance) leaves the bundle
// unacked, and the server delivers it again after ack_wait.
func TestBundleLeftUnsettledComesBackAfterAckWait(t *testing.T) {
	const n = 3
	cons := routeOneBundle(t, n, time.Second)
	_, parts := nextBundle(t, cons)
	for _, p := range parts[:n-1] {
		_ = p.Ack()
	}
	_ = parts[n-1].InProgress() // told once, then left
	again, _ := nextBundle(t, cons)
	if md, err := again.Metadata(); err != nil || md.NumDelivered != 2 {
		t.Fatalf("delivery %+v, %v, want the bundle again", md, err)
	}
}

// TestReadBundleRefusesWhatItCannotRead: a bundle of an unknown form, or
// one cut short or padded, is refused with ErrNotABundle (the stage
// dead-letters it whole as not_routed) rather than read in part.
func TestReadBundleRefusesWhatItCannotRead(t *testing.T) {
	cons := routeOneBundle(t, 3, 10*time.Second)
	b, _ := nextBundle(t, cons)
	subj, h, data := b.Subject(), b.Headers(), b.Data()
	if _, err := route.ReadBundle(subj, h, data); err != nil {
		t.Fatalf("the bundle as stored: %v", err)
	}
	other := nats.Header(http.Header(h).Clone())
	other.Set(route.HeaderBundle, "3")
	cases := map[string]error{}
	_, cases["form 3"] = route.ReadBundle(subj, other, data)
	other.Set(route.HeaderBundle, "1")
	_, cases["form 2 marked 1"] = route.ReadBundle(subj, other, data)
	_, cases["cut short"] = route.ReadBundle(subj, h, data[:len(data)-3])
	_, cases["padded"] = route.ReadBundle(subj, h, append(append([]byte{}, data...), 0))
	_, cases["empty"] = route.ReadBundle(subj, h, nil)
	_, cases["another subject"] = route.ReadBundle("0.dedupe.routed.other", h, data)
	for what, err := range cases {
		if !errors.Is(err, route.ErrNotABundle) {
			t.Errorf("%s: %v, want ErrNotABundle", what, err)
		}
	}
}

// TestRefusedBundleIsRoutedAsCopiesAlone: the routed stream's
// max_msg_size lowered after the route step started (it sizes bundles by
// what it read at start) refuses bundles for good; their inputs are then
// routed as copies alone, each of which fits, and none is dead-lettered.
func TestRefusedBundleIsRoutedAsCopiesAlone(t *testing.T) {
	const n, partitions = 40, 2
	ackWait := 10 * time.Second
	e := newEnv(t, partitions, ackWait)
	o, reg := e.options(t, keyFunc(t, keys.DefaultKeyConfig()), partitions, ackWait)
	o.BundleMax, o.BatchLinger, o.BatchesInFlight = n, 200*time.Millisecond, 1
	start(t, o)
	ctx := context.Background()
	natstest.WaitFor(t, time.Minute, "the route consumer", func() bool {
		_, err := e.js.Consumer(ctx, input, route.ConsumerName(group))
		return err == nil
	})
	st, err := e.js.Stream(ctx, routedStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxMsgSize = 512 // a copy alone is about 300 bytes; a bundle of two is more
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	publishEvents(t, e.js, n)
	natstest.WaitDrained(t, e.js, input, route.ConsumerName(group), time.Minute)
	checkRoutedOnce(t, e.js, n)
	if _, sizes := copies(t, readStream(t, e.js, routedStream)); len(sizes) != 0 {
		t.Errorf("bundles stored %v, want none (each refused)", sizes)
	}
	if got := metrictest.Sum(t, reg, "dedupe_route_dead_letters_total", nil); got != 0 {
		t.Errorf("%v inputs dead-lettered, want none", got)
	}
}
