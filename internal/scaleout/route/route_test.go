package route_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/route"
	"github.com/dedupe-stage/dedupe-stage/internal/streams"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

const (
	input         = "EVENTS"
	routedStream  = "ROUTED"
	routedSubject = "dedupe.routed"
	dlqStream     = "DLQ"
	group         = "dd"
)

// env is one server with the input, routed and dead-letter streams.
type env struct {
	url string
	js  jetstream.JetStream
}

// newEnv starts a server and creates the streams; the routed stream is
// route.StreamConfig for partitions and ackWait.
func newEnv(t *testing.T, partitions int, ackWait time.Duration) env {
	t.Helper()
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx := context.Background()
	for _, sc := range []jetstream.StreamConfig{
		{Name: input, Subjects: []string{"events.>"}, AllowMsgTTL: true},
		route.StreamConfig(routedStream, routedSubject, partitions, 1, ackWait, route.DefaultRestartMargin),
		{Name: dlqStream, Subjects: []string{"dlq.>"}},
	} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatalf("create stream %s: %v", sc.Name, err)
		}
	}
	return env{url: srv.ClientURL(), js: js}
}

// options returns route options for e with key kf and n partitions, on a
// connection of its own and a new registry.
func (e env) options(t *testing.T, kf *keys.KeyFunc, n int, ackWait time.Duration) (route.Options, *prometheus.Registry) {
	t.Helper()
	nc, _ := natstest.Connect(t, e.url)
	reg := prometheus.NewRegistry()
	return route.Options{
		Conn: nc, InputStream: input, Group: group, Partitions: n,
		RoutedStream: routedStream, RoutedSubject: routedSubject,
		Key:               kf,
		DeadLetterSubject: func(reason string) string { return "dlq." + reason },
		AckWait:           ackWait,
		Registry:          reg,
		Logger:            slog.New(slog.DiscardHandler),
	}, reg
}

// start runs the route step until the test ends, and fails the test if
// Run returns an error.
func start(t *testing.T, o route.Options) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- route.Run(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("route.Run: %v", err)
		}
	})
}

// keyFunc builds a KeyFunc or fails the test.
func keyFunc(t *testing.T, cfg keys.KeyConfig) *keys.KeyFunc {
	t.Helper()
	kf, err := keys.NewKeyFunc(cfg)
	if err != nil {
		t.Fatalf("key func: %v", err)
	}
	return kf
}

// stored is a message read back from a stream with its timestamp.
type stored struct {
	seq     uint64
	subject string
	header  nats.Header
	data    []byte
	time    time.Time
}

// readStream returns every message stream holds, by direct get (a
// work-queue stream refuses the ordered consumer natstest.ReadAll uses).
func readStream(t *testing.T, js jetstream.JetStream, name string) []stored {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatalf("stream %s info: %v", name, err)
	}
	var out []stored
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("stream %s get %d: %v", name, seq, err)
		}
		out = append(out, stored{seq: m.Sequence, subject: m.Subject, header: m.Header, data: m.Data, time: m.Time})
	}
	if uint64(len(out)) != info.State.Msgs {
		t.Fatalf("stream %s: read %d messages, it holds %d", name, len(out), info.State.Msgs)
	}
	return out
}

// serverPartitions returns, for each key, the partition nats-server's own
// {{partition(n,1)}} transform stores it under.
func serverPartitions(t *testing.T, js jetstream.JetStream, n int, keyList []string) map[string]int {
	t.Helper()
	name := "REF" + strconv.Itoa(n)
	_, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: name, Subjects: []string{"ref.*"},
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: "ref.*", Destination: fmt.Sprintf("{{partition(%d,1)}}.ref.{{wildcard(1)}}", n)},
	})
	if err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	msgs := make([]*nats.Msg, len(keyList))
	for i, k := range keyList {
		msgs[i] = &nats.Msg{Subject: "ref." + k}
	}
	natstest.PublishAll(t, js, msgs)
	out := make(map[string]int, len(keyList))
	for _, m := range natstest.ReadAll(t, js, name) {
		parts := strings.SplitN(m.Subject, ".", 3)
		p, err := strconv.Atoi(parts[0])
		if err != nil {
			t.Fatalf("reference subject %q: %v", m.Subject, err)
		}
		out[parts[2]] = p
	}
	return out
}

// publishEvents publishes n input messages with Nats-Msg-Id "id-<i>",
// header Tenant "t<i%3>", a custom header and payload "payload <i>". Every
// fifth one also carries Nats-Expected-Stream, a check against the input
// stream that the routed copy must not carry.
func publishEvents(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	msgs := make([]*nats.Msg, n)
	for i := range msgs {
		h := nats.Header{}
		h.Set(jetstream.MsgIDHeader, "id-"+strconv.Itoa(i))
		h.Set("Tenant", "t"+strconv.Itoa(i%3))
		h.Set("X-Custom", "c"+strconv.Itoa(i))
		if i%5 == 0 {
			h.Set(jetstream.ExpectedStreamHeader, input)
		}
		msgs[i] = &nats.Msg{Subject: "events.e" + strconv.Itoa(i%7), Header: h, Data: []byte("payload " + strconv.Itoa(i))}
	}
	natstest.PublishAll(t, js, msgs)
}

// copies returns the routed copies msgs hold: a bundle's copies
// (route.ReadBundle), each with the bundle's sequence and time, and every
// other message as it is; and how many bundles there were, by their size.
func copies(t *testing.T, msgs []stored) ([]stored, map[int]int) {
	t.Helper()
	var out []stored
	sizes := map[int]int{}
	for _, m := range msgs {
		if !route.IsBundle(m.header) {
			out = append(out, m)
			continue
		}
		cs, err := route.ReadBundle(m.subject, m.header, m.data)
		if err != nil {
			t.Fatalf("routed message %d: %v", m.seq, err)
		}
		sizes[len(cs)]++
		for _, c := range cs {
			out = append(out, stored{seq: m.seq, subject: c.Subject, header: c.Header, data: c.Data, time: m.time})
		}
	}
	return out, sizes
}

// checkRoutedOnce checks that the routed stream holds exactly one copy of
// each of the n input messages, under its id, and returns them by input
// sequence.
func checkRoutedOnce(t *testing.T, js jetstream.JetStream, n int) map[uint64]stored {
	t.Helper()
	routed, _ := copies(t, readStream(t, js, routedStream))
	bySeq := make(map[uint64]stored, len(routed))
	for _, m := range routed {
		id := m.header.Get(jetstream.MsgIDHeader)
		seq, err := strconv.ParseUint(strings.TrimPrefix(id, "route:"+input+":"), 10, 64)
		if err != nil {
			t.Fatalf("routed message %d has id %q, want route:%s:<seq>", m.seq, id, input)
		}
		if _, dup := bySeq[seq]; dup {
			t.Errorf("input sequence %d routed twice", seq)
		}
		bySeq[seq] = m
	}
	for seq := uint64(1); seq <= uint64(n); seq++ {
		if _, ok := bySeq[seq]; !ok {
			t.Errorf("input sequence %d not routed", seq)
		}
	}
	if len(routed) != n {
		t.Errorf("routed stream holds %d messages, want %d (one per input)", len(routed), n)
	}
	return bySeq
}

// TestRoutesEveryInputOnceToTheServersPartition: with copies one by one
// and in bundles of up to 8 (Options.BundleMax), every input is routed
// once, to the partition nats-server would pick, with its headers and
// payload, and reads back as the stage reads it.
func TestRoutesEveryInputOnceToTheServersPartition(t *testing.T) {
	for _, bundleMax := range []int{0, 8} {
		t.Run("bundle_max="+strconv.Itoa(bundleMax), func(t *testing.T) { routesEveryInputOnce(t, bundleMax) })
	}
}

func routesEveryInputOnce(t *testing.T, bundleMax int) {
	const n, partitions = 300, 8
	ackWait := 10 * time.Second
	e := newEnv(t, partitions, ackWait)
	kf := keyFunc(t, keys.KeyConfig{
		Field: keys.FieldSpec{Source: keys.SourceHeader, Header: keys.DefaultHeader},
		Scope: keys.FieldSpec{Source: keys.SourceHeader, Header: "Tenant"},
	})
	o, reg := e.options(t, kf, partitions, ackWait)
	o.BundleMax = bundleMax
	publishEvents(t, e.js, n)
	start(t, o)
	natstest.WaitDrained(t, e.js, input, route.ConsumerName(group), time.Minute)

	bySeq := checkRoutedOnce(t, e.js, n)
	_, sizes := copies(t, readStream(t, e.js, routedStream))
	t.Logf("bundles by size: %v", sizes)
	for size := range sizes {
		if size > bundleMax {
			t.Errorf("a bundle of %d copies, BundleMax is %d", size, bundleMax)
		}
	}
	if bundleMax > 1 && len(sizes) == 0 {
		t.Errorf("no bundle among %d inputs in %d partitions with BundleMax %d", n, partitions, bundleMax)
	}
	inputs := readStream(t, e.js, input)
	keyList := make([]string, 0, n)
	for _, in := range inputs {
		keyList = append(keyList, in.header.Get("Tenant")+":"+in.header.Get(jetstream.MsgIDHeader))
	}
	want := serverPartitions(t, e.js, partitions, keyList)
	for i, in := range inputs {
		m := bySeq[in.seq]
		key := keyList[i]
		p, inSubject, ok := route.SplitSubject(routedSubject, m.subject)
		if !ok {
			t.Fatalf("routed subject %q is not <p>.%s.<input subject>", m.subject, routedSubject)
		}
		if p != want[key] || inSubject != in.subject {
			t.Errorf("input %d (key %q, subject %q) routed to %q: partition %d, the server's partition(%d,1) is %d",
				in.seq, key, in.subject, m.subject, p, partitions, want[key])
		}
		checks := map[string][2]string{
			route.HeaderKey:           {m.header.Get(route.HeaderKey), key},
			route.HeaderOriginalMsgID: {m.header.Get(route.HeaderOriginalMsgID), in.header.Get(jetstream.MsgIDHeader)},
			"X-Custom":                {m.header.Get("X-Custom"), in.header.Get("X-Custom")},
			"Tenant":                  {m.header.Get("Tenant"), in.header.Get("Tenant")},
			"payload":                 {string(m.data), string(in.data)},
		}
		for what, got := range checks {
			if got[0] != got[1] {
				t.Errorf("input %d: routed %s is %q, want %q", in.seq, what, got[0], got[1])
			}
		}
		// What the owner of the partition reads back, with the partition
		// token as stored and as a pcgroups consumer hands it over.
		for _, subj := range []string{m.subject, strings.SplitN(m.subject, ".", 2)[1]} {
			org, err := route.OriginOf(routedSubject, subj, m.header)
			if err != nil {
				t.Fatalf("input %d: OriginOf(%q): %v", in.seq, subj, err)
			}
			if org.Subject != in.subject || org.Stream != input || org.Sequence != in.seq || string(org.Key) != key || !org.Time.Equal(in.time) {
				t.Errorf("input %d: OriginOf(%q) = %+v, want subject %q, stream %s, sequence %d, key %q, time %v",
					in.seq, subj, org, in.subject, input, in.seq, key, in.time)
			}
			// What its dead letter reads, also once the stage replaced
			// the copy's Nats-Msg-Id on its forwarded copy.
			h := nats.Header(http.Header(m.header).Clone())
			h.Set(jetstream.MsgIDHeader, key)
			if s, st, seq, ok := route.InputOf(routedSubject, subj, h); !ok || s != in.subject || st != input || seq != in.seq {
				t.Errorf("input %d: InputOf(%q) = %q, %q, %d, %v, want %q, %s, %d", in.seq, subj, s, st, seq, ok, in.subject, input, in.seq)
			}
		}
		for k := range m.header {
			if strings.HasPrefix(k, "Nats-Expected-") {
				t.Errorf("input %d: routed copy carries %s", in.seq, k)
			}
		}
	}
	if got := metrictest.Sum(t, reg, "dedupe_route_messages_total", map[string]string{"outcome": route.OutcomeRouted}); got != n {
		t.Errorf("dedupe_route_messages_total{outcome=routed} = %v, want %d", got, n)
	}
}

func TestTwoRoutersRouteEverythingOnce(t *testing.T) {
	const n = 1000
	ackWait := 10 * time.Second
	e := newEnv(t, 4, ackWait)
	kf := keyFunc(t, keys.DefaultKeyConfig())
	var regs []*prometheus.Registry
	for range 2 {
		o, reg := e.options(t, kf, 4, ackWait)
		o.BatchSize = 32
		start(t, o)
		regs = append(regs, reg)
	}
	publishEvents(t, e.js, n)
	natstest.WaitDrained(t, e.js, input, route.ConsumerName(group), time.Minute)
	checkRoutedOnce(t, e.js, n)
	routed := 0.0
	for i, reg := range regs {
		got := metrictest.Sum(t, reg, "dedupe_route_messages_total", map[string]string{"outcome": route.OutcomeRouted})
		t.Logf("router %d routed %v", i, got)
		routed += got
	}
	if routed != n {
		t.Errorf("the two routers stored %v copies in all, want %d", routed, n)
	}
}

func TestRedeliveredInputIsNotRoutedTwice(t *testing.T) {
	const n = 50
	ackWait := 500 * time.Millisecond
	e := newEnv(t, 4, ackWait)
	o, reg := e.options(t, keyFunc(t, keys.DefaultKeyConfig()), 4, ackWait)
	// The first delivery of every message is routed and never acked: the
	// server delivers it again after AckWait.
	o = route.WithholdAck(o, func(m jetstream.Msg) bool {
		md, err := m.Metadata()
		return err == nil && md.NumDelivered == 1
	})
	publishEvents(t, e.js, n)
	start(t, o)
	natstest.WaitDrained(t, e.js, input, route.ConsumerName(group), time.Minute)
	checkRoutedOnce(t, e.js, n)
	// A busy machine may let a redelivery's ack wait pass too: more than
	// one redelivery of a message, each dropped by its id.
	if got := metrictest.Sum(t, reg, "dedupe_route_messages_total", map[string]string{"outcome": route.OutcomeDuplicate}); got < n {
		t.Errorf("dedupe_route_messages_total{outcome=duplicate} = %v, want at least %d (every redelivery dropped by its id)", got, n)
	}
	if got := metrictest.Sum(t, reg, "dedupe_route_messages_total", map[string]string{"outcome": route.OutcomeRouted}); got != n {
		t.Errorf("dedupe_route_messages_total{outcome=routed} = %v, want %d (each message routed once)", got, n)
	}
}

func TestBadInputsAreDeadLetteredWithReasons(t *testing.T) {
	ackWait := 10 * time.Second
	e := newEnv(t, 4, ackWait)
	kf := keyFunc(t, keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceJSON, JSONPath: "id"}, MaxLength: 16})
	o, reg := e.options(t, kf, 4, ackWait)
	o.MaxMessageBytes = 2048
	ttl := nats.Header{}
	ttl.Set(jetstream.MsgTTLHeader, "1h") // the input allows per-message TTLs, the routed stream does not
	ttl.Set("X-Trace", "t1")
	cases := []struct {
		reason string
		header nats.Header
		data   string
	}{
		{"", nil, `{"id":"good"}`},
		{keys.ReasonNoKey, nil, `{"other":"x"}`},
		{keys.ReasonBadPayload, nil, `not json`},
		{keys.ReasonBadKeyType, nil, `{"id":{"a":1}}`},
		{keys.ReasonKeyTooLong, nil, `{"id":"` + strings.Repeat("k", 17) + `"}`},
		{string(deadletter.ReasonOversized), nil, `{"id":"big","pad":"` + strings.Repeat("x", 3000) + `"}`},
		{string(deadletter.ReasonRoutedRejected), ttl, `{"id":"ttl"}`},
	}
	msgs := make([]*nats.Msg, len(cases))
	for i, c := range cases {
		msgs[i] = &nats.Msg{Subject: "events.x" + strconv.Itoa(i), Header: c.header, Data: []byte(c.data)}
	}
	natstest.PublishAll(t, e.js, msgs)
	start(t, o)
	natstest.WaitDrained(t, e.js, input, route.ConsumerName(group), time.Minute)

	dlq := readStream(t, e.js, dlqStream)
	bySeq := map[string]stored{}
	for _, d := range dlq {
		bySeq[d.header.Get(deadletter.HeaderOriginalSequence)] = d
	}
	for i, c := range cases {
		seq := strconv.Itoa(i + 1)
		d, ok := bySeq[seq]
		if c.reason == "" {
			if ok {
				t.Errorf("good input %s dead-lettered: %s", seq, d.header.Get(deadletter.HeaderReason))
			}
			continue
		}
		if !ok {
			t.Errorf("input %s (%s) not dead-lettered", seq, c.reason)
			continue
		}
		if got := d.header.Get(deadletter.HeaderReason); got != c.reason || d.subject != "dlq."+c.reason {
			t.Errorf("input %s dead-lettered on %s with reason %q, want %q", seq, d.subject, got, c.reason)
		}
		if d.header.Get(deadletter.HeaderDetail) == "" || d.header.Get(deadletter.HeaderOriginalStream) != input ||
			d.header.Get(deadletter.HeaderOriginalSubject) != msgs[i].Subject {
			t.Errorf("input %s: dead letter lacks its detail or origin: %v", seq, d.header)
		}
		if string(d.data) != c.data {
			t.Errorf("input %s: dead letter payload %q, want the input's", seq, d.data)
		}
		if c.header != nil && d.header.Get("X-Trace") != "t1" {
			t.Errorf("input %s: dead letter lost the input's header X-Trace: %v", seq, d.header)
		}
	}
	if len(dlq) != len(cases)-1 {
		t.Errorf("dead-letter stream holds %d messages, want %d", len(dlq), len(cases)-1)
	}
	routed := readStream(t, e.js, routedStream)
	if len(routed) != 1 || routed[0].header.Get(route.HeaderKey) != "good" {
		t.Errorf("routed stream holds %d messages, want only the good one", len(routed))
	}
	if got := metrictest.Sum(t, reg, "dedupe_route_messages_total", map[string]string{"outcome": route.OutcomeDeadLetter}); got != float64(len(cases)-1) {
		t.Errorf("dedupe_route_messages_total{outcome=dead_letter} = %v, want %d", got, len(cases)-1)
	}
}

func TestRoutedStreamConfigAndCheck(t *testing.T) {
	ackWait, margin := 10*time.Second, time.Minute
	sc := route.StreamConfig(routedStream, routedSubject, 8, 3, ackWait, margin)
	if err := route.CheckStream(sc, routedSubject, 8, ackWait, margin); err != nil {
		t.Fatalf("CheckStream refuses StreamConfig's stream: %v", err)
	}
	if sc.Duplicates < 2*(ackWait+margin) || sc.Replicas != 3 {
		t.Errorf("StreamConfig: duplicate window %v, replicas %d; want at least %v and 3", sc.Duplicates, sc.Replicas, 2*(ackWait+margin))
	}
	if want := streams.DuplicateWindow(ackWait, margin); sc.Duplicates != want {
		t.Errorf("StreamConfig: duplicate window %v, want %v, the rule of the output stream's computed window", sc.Duplicates, want)
	}
	bad := map[string]func(*jetstream.StreamConfig){
		"limits retention":       func(c *jetstream.StreamConfig) { c.Retention = jetstream.LimitsPolicy },
		"short duplicate window": func(c *jetstream.StreamConfig) { c.Duplicates = ackWait },
		"a partition missing":    func(c *jetstream.StreamConfig) { c.Subjects = c.Subjects[:7] },
	}
	for name, edit := range bad {
		t.Run(name, func(t *testing.T) {
			c := sc
			edit(&c)
			if err := route.CheckStream(c, routedSubject, 8, ackWait, margin); !errors.Is(err, route.ErrRoutedStream) || !strings.Contains(err.Error(), routedStream) {
				t.Errorf("CheckStream = %v, want ErrRoutedStream naming the stream", err)
			}
		})
	}
	for _, subj := range []string{"events.a", "events.a.b.c"} {
		p, got, ok := route.SplitSubject(routedSubject, route.Subject(7, routedSubject, subj))
		if !ok || p != 7 || got != subj {
			t.Errorf("SplitSubject(Subject(7, %q)) = %d, %q, %v", subj, p, got, ok)
		}
	}
	if _, _, ok := route.SplitSubject(routedSubject, "7.other.events.a"); ok {
		t.Error("SplitSubject accepts a subject outside the routed root")
	}
}

func TestRunRefusesAShortDuplicateWindow(t *testing.T) {
	e := newEnv(t, 4, 10*time.Second)
	o, _ := e.options(t, keyFunc(t, keys.DefaultKeyConfig()), 4, 10*time.Minute)
	if err := route.Run(context.Background(), o); !errors.Is(err, route.ErrRoutedStream) {
		t.Fatalf("Run with a routed stream whose duplicate window is shorter than the route ack wait = %v, want ErrRoutedStream", err)
	}
	if err := route.Run(context.Background(), route.Options{}); err == nil || !strings.Contains(err.Error(), "Options.Conn") {
		t.Errorf("Run with zero Options = %v, want an error naming the missing fields", err)
	}
}

// reporter counts failed attempts by component. For tests only.
type reporter struct {
	mu     sync.Mutex
	failed map[string]int
}

func (r *reporter) Failed(component string, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed == nil {
		r.failed = map[string]int{}
	}
	r.failed[component]++
}

func (r *reporter) Succeeded(string, bool) {}

func (r *reporter) failures(component string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed[component]
}

// A routed stream that is gone for a while is a transient failure: the
// route step retries, dead-letters nothing, and routes everything once the
// stream is back.
func TestRoutedStreamOutageIsRetriedNotDeadLettered(t *testing.T) {
	const n, partitions = 40, 4
	ackWait := 10 * time.Second
	e := newEnv(t, partitions, ackWait)
	o, reg := e.options(t, keyFunc(t, keys.DefaultKeyConfig()), partitions, ackWait)
	rep := &reporter{}
	o.Reporter = rep
	start(t, o)
	ctx := context.Background()
	// Run checks the routed stream before it creates its consumer.
	natstest.WaitFor(t, time.Minute, "the route consumer", func() bool {
		_, err := e.js.Consumer(ctx, input, route.ConsumerName(group))
		return err == nil
	})
	if err := e.js.DeleteStream(ctx, routedStream); err != nil {
		t.Fatalf("delete the routed stream: %v", err)
	}
	publishEvents(t, e.js, n)
	natstest.WaitFor(t, time.Minute, "a failed routed publish", func() bool { return rep.failures(route.CompRoute) > 0 })
	if _, err := e.js.CreateStream(ctx, route.StreamConfig(routedStream, routedSubject, partitions, 1, ackWait, route.DefaultRestartMargin)); err != nil {
		t.Fatalf("create the routed stream again: %v", err)
	}
	natstest.WaitDrained(t, e.js, input, route.ConsumerName(group), time.Minute)
	checkRoutedOnce(t, e.js, n)
	if dl := readStream(t, e.js, dlqStream); len(dl) != 0 {
		t.Errorf("%d inputs dead-lettered during the outage (first: %s), want none", len(dl), dl[0].header.Get(deadletter.HeaderReason))
	}
	if got := metrictest.Sum(t, reg, "dedupe_route_messages_total", map[string]string{"outcome": route.OutcomeRouted}); got != n {
		t.Errorf("dedupe_route_messages_total{outcome=routed} = %v, want %d", got, n)
	}
}

func TestOriginOfRefusesWhatTheRouteStepDidNotWrite(t *testing.T) {
	good := func() nats.Header {
		h := nats.Header{}
		h.Set(jetstream.MsgIDHeader, route.MsgID(input, 42))
		h.Set(route.HeaderKey, "k")
		h.Set(route.HeaderInputTime, time.Unix(0, 1_700_000_000_123_456_789).UTC().Format(time.RFC3339Nano))
		return h
	}
	if o, err := route.OriginOf(routedSubject, route.Subject(3, routedSubject, "events.a"), good()); err != nil || o.Sequence != 42 || o.Partition != 3 ||
		o.Time.UnixNano() != 1_700_000_000_123_456_789 {
		t.Fatalf("OriginOf of a routed message = %+v, %v", o, err)
	}
	cases := map[string]func(h nats.Header) string{
		"other subject root": func(nats.Header) string { return "3.other.events.a" },
		"input id kept":      func(h nats.Header) string { h.Set(jetstream.MsgIDHeader, "id-1"); return "" },
		"bad sequence":       func(h nats.Header) string { h.Set(jetstream.MsgIDHeader, "route:EVENTS:x"); return "" },
		"no key":             func(h nats.Header) string { h.Del(route.HeaderKey); return "" },
		"bad input time":     func(h nats.Header) string { h.Set(route.HeaderInputTime, "yesterday"); return "" },
	}
	for name, edit := range cases {
		h := good()
		subj := edit(h)
		if subj == "" {
			subj = route.Subject(3, routedSubject, "events.a")
		}
		if _, err := route.OriginOf(routedSubject, subj, h); err == nil {
			t.Errorf("%s: OriginOf accepted it", name)
		}
	}
}

func TestInputOf(t *testing.T) {
	subj := route.Subject(3, routedSubject, "events.a")
	withHeaders := nats.Header{}
	withHeaders.Set(route.HeaderInputStream, input)
	withHeaders.Set(route.HeaderInputSequence, "42")
	withHeaders.Set(jetstream.MsgIDHeader, "replaced-by-the-stage")
	idOnly := nats.Header{}
	idOnly.Set(jetstream.MsgIDHeader, route.MsgID(input, 42))
	for name, tc := range map[string]struct {
		subject string
		h       nats.Header
		ok      bool
	}{
		"headers, id replaced":          {subj, withHeaders, true},
		"headers, partition token gone": {strings.SplitN(subj, ".", 2)[1], withHeaders, true},
		"routed before the headers: id": {subj, idOnly, true},
		"neither":                       {subj, nats.Header{}, false},
		"bad sequence header":           {subj, nats.Header{route.HeaderInputStream: {input}, route.HeaderInputSequence: {"x"}}, false},
		"not the routed subject":        {"3.other.events.a", withHeaders, false},
	} {
		t.Run(name, func(t *testing.T) {
			s, st, seq, ok := route.InputOf(routedSubject, tc.subject, tc.h)
			if ok != tc.ok || ok && (s != "events.a" || st != input || seq != 42) {
				t.Fatalf("InputOf = %q, %q, %d, %v, want events.a, %s, 42, %v", s, st, seq, ok, input, tc.ok)
			}
		})
	}
}
