package redrive_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/internal/redrive"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// setup starts a server with an input stream IN (events.>) and a
// dead-letter stream DLQ (dlq.>).
func setup(t *testing.T) jetstream.JetStream {
	t.Helper()
	return setupWith(t, 0)
}

// setupWith is setup with IN's duplicate window dup (0: the server's
// default, 2m).
func setupWith(t *testing.T, dup time.Duration) jetstream.JetStream {
	t.Helper()
	s := natstest.RunServer(t, t.TempDir())
	_, js := natstest.Connect(t, s.ClientURL())
	for _, sc := range []jetstream.StreamConfig{
		{Name: "IN", Subjects: []string{"events.>"}, Duplicates: dup},
		{Name: "DLQ", Subjects: []string{"dlq.>"}, MaxAge: time.Hour},
	} {
		if _, err := js.CreateStream(context.Background(), sc); err != nil {
			t.Fatalf("create %s: %v", sc.Name, err)
		}
	}
	return js
}

// deadLetter publishes m to IN and its dead letter of reason to DLQ, as
// the stage builds it (shrunk when shrink), and returns the dead letter's
// sequence.
func deadLetter(t *testing.T, js jetstream.JetStream, m *nats.Msg, reason deadletter.Reason, shrink bool) uint64 {
	t.Helper()
	ctx := context.Background()
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatalf("publish the input: %v", err)
	}
	in := deadletter.Input{Reason: reason, Detail: "test", Header: m.Header, Data: m.Data,
		Subject: m.Subject, Stream: ack.Stream, Sequence: ack.Sequence}
	dl := deadletter.Build(in, "dlq."+string(reason), 1<<20, deadletter.OmittedTooLarge)
	if shrink {
		dl = deadletter.Shrink(in, "dlq."+string(reason))
	}
	dack, err := js.PublishMsg(ctx, dl)
	if err != nil {
		t.Fatalf("publish the dead letter: %v", err)
	}
	return dack.Sequence
}

// event is an input on events.a with an Event-Id and a trace header of two values.
func event(id, body string) *nats.Msg {
	return &nats.Msg{Subject: "events.a", Header: nats.Header{"Event-Id": {id}, "X-Trace": {"t1", "t2"}}, Data: []byte(body)}
}

// opts are the Options of a run over DLQ.
func opts(edit func(*redrive.Options)) redrive.Options {
	o := redrive.Options{Stream: "DLQ", Subject: "dlq", FetchWait: 500 * time.Millisecond}
	if edit != nil {
		edit(&o)
	}
	return o
}

// run redrives with o and fails the test on an error.
func run(t *testing.T, js jetstream.JetStream, o redrive.Options) redrive.Summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum, err := redrive.Run(ctx, js, o)
	if err != nil {
		t.Fatalf("redrive: %v", err)
	}
	return sum
}

// copies returns the messages of IN that a redrive published.
func copies(t *testing.T, js jetstream.JetStream) []natstest.Message {
	t.Helper()
	var out []natstest.Message
	for _, m := range natstest.ReadAll(t, js, "IN") {
		if m.Header.Get(redrive.HeaderRedrivenFrom) != "" {
			out = append(out, m)
		}
	}
	return out
}

// The copy is the input: its subject, payload and headers, none of the
// dead letter's, stored in the input's stream.
func TestRedriveRepublishesTheInput(t *testing.T) {
	js := setup(t)
	seq := deadLetter(t, js, event("e1", `{"id":"e1"}`), deadletter.ReasonOutputRejected, false)
	sum := run(t, js, opts(nil))
	if sum.Selected != 1 || sum.Republished != 1 || sum.RefusedCount() != 0 {
		t.Fatalf("summary %+v, want one dead letter selected and republished", sum)
	}
	got := copies(t, js)
	if len(got) != 1 {
		t.Fatalf("%d copies in IN, want 1", len(got))
	}
	c := got[0]
	if c.Subject != "events.a" || string(c.Data) != `{"id":"e1"}` {
		t.Errorf("copy on %q with %q, want the input's subject and payload", c.Subject, c.Data)
	}
	if v := c.Header.Values("X-Trace"); len(v) != 2 || c.Header.Get("Event-Id") != "e1" {
		t.Errorf("copy headers %v, want the input's Event-Id and both X-Trace values", c.Header)
	}
	for k := range c.Header {
		if strings.HasPrefix(k, "Dedupe-") && k != redrive.HeaderRedrivenFrom && k != redrive.HeaderRedrivenReason {
			t.Errorf("copy carries the dead letter's header %s", k)
		}
	}
	if got, want := c.Header.Get(jetstream.MsgIDHeader), redrive.MsgID("DLQ", seq); got != want {
		t.Errorf("copy Nats-Msg-Id %q, want %q", got, want)
	}
	if got := c.Header.Get(redrive.HeaderRedrivenFrom); got != "DLQ:1" {
		t.Errorf("%s = %q, want DLQ:1", redrive.HeaderRedrivenFrom, got)
	}
	if got := c.Header.Get(redrive.HeaderRedrivenReason); got != string(deadletter.ReasonOutputRejected) {
		t.Errorf("%s = %q, want output_rejected", redrive.HeaderRedrivenReason, got)
	}
	if r := sum.Results[0]; r.Stream != "IN" || r.StreamSeq != c.Seq || r.Reason != deadletter.ReasonOutputRejected {
		t.Errorf("result %+v, want it stored as IN %d", r, c.Seq)
	}
}

// A dead letter that does not carry its input whole, or does not say
// where it was, is refused with its reason; the others are republished.
func TestRedriveRefusesWhatItCannotCopyWhole(t *testing.T) {
	js := setup(t)
	ctx := context.Background()
	deadLetter(t, js, event("shrunk", "x"), deadletter.ReasonOversized, true)
	in := deadletter.Input{Reason: deadletter.ReasonOversized, Subject: "events.a", Stream: "IN", Sequence: 100, Data: []byte("big")}
	if _, err := js.PublishMsg(ctx, deadletter.Build(in, "dlq.oversized", 0, deadletter.OmittedTooLarge)); err != nil {
		t.Fatal(err)
	}
	in.Stream = ""
	if _, err := js.PublishMsg(ctx, deadletter.Build(in, "dlq.oversized", 1<<20, deadletter.OmittedTooLarge)); err != nil {
		t.Fatal(err)
	}
	in.Stream, in.Sequence = "ELSEWHERE", 101 // events.a is IN's: the copy expecting ELSEWHERE is refused
	if _, err := js.PublishMsg(ctx, deadletter.Build(in, "dlq.oversized", 1<<20, deadletter.OmittedTooLarge)); err != nil {
		t.Fatal(err)
	}
	deadLetter(t, js, event("good", "y"), deadletter.ReasonOversized, false)

	// Forced: oversized lies in the input, and is refused unless forced; a
	// dead letter that is not whole is refused even so.
	sum := run(t, js, opts(func(o *redrive.Options) { o.Force = true }))
	want := map[redrive.Refusal]int{redrive.RefusedHeadersTruncated: 1, redrive.RefusedPayloadOmitted: 1,
		redrive.RefusedNoOrigin: 1, redrive.RefusedRejected: 1}
	for r, n := range want {
		if sum.Refused[r] != n {
			t.Errorf("refused %s: %d, want %d (summary %+v)", r, sum.Refused[r], n, sum.Refused)
		}
	}
	if sum.Selected != 5 || sum.Republished != 1 {
		t.Errorf("selected %d, republished %d, want 5 and 1", sum.Selected, sum.Republished)
	}
	if got := copies(t, js); len(got) != 1 || got[0].Header.Get("Event-Id") != "good" {
		t.Errorf("copies %v, want only the good one", got)
	}
	for _, r := range sum.Results {
		if r.Outcome == redrive.Refused && r.Detail == "" {
			t.Errorf("refusal of dead letter %d says nothing", r.Seq)
		}
	}
}

// A run cut off by its limit is resumed by the next without doubling, and
// a copy stored without its mark (a run cut off between the two) is not
// stored again.
func TestRedriveResumesWithoutDoubling(t *testing.T) {
	js := setup(t)
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		deadLetter(t, js, event(id, id), deadletter.ReasonOutputRejected, false)
	}
	first := run(t, js, opts(func(o *redrive.Options) { o.Limit = 2 }))
	if first.Republished != 2 || !first.LimitReached || first.NextSeq != 3 {
		t.Fatalf("first run %+v, want 2 republished and the limit reached at 3", first)
	}
	second := run(t, js, opts(nil))
	if second.AlreadyRedriven != 2 || second.Republished != 3 || second.LimitReached {
		t.Fatalf("second run %+v, want 2 already redriven and 3 republished", second)
	}
	if got := copies(t, js); len(got) != 5 {
		t.Fatalf("%d copies after two runs, want 5", len(got))
	}

	kv, err := js.KeyValue(context.Background(), redrive.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(context.Background(), "DLQ.5"); err != nil {
		t.Fatal(err)
	}
	third := run(t, js, opts(nil))
	if third.AlreadyRedriven != 5 || third.Republished != 0 {
		t.Errorf("third run %+v, want all 5 already redriven", third)
	}
	if got := copies(t, js); len(got) != 5 {
		t.Errorf("%d copies after a run without a mark, want 5", len(got))
	}
	if _, err := kv.Get(context.Background(), "DLQ.5"); err != nil {
		t.Errorf("the mark of dead letter 5 is not written again: %v", err)
	}
}

// Reasons, sequences and times select; a dry run publishes nothing and
// creates no bucket.
func TestRedriveSelects(t *testing.T) {
	js := setup(t)
	reasons := []deadletter.Reason{deadletter.ReasonNoKey, deadletter.ReasonOutputRejected, deadletter.ReasonNoKey, deadletter.ReasonMaxDeliver}
	for i, r := range reasons {
		deadLetter(t, js, event(string(rune('a'+i)), "x"), r, false)
	}
	var stamps []time.Time
	if _, err := natstest.Read(context.Background(), js, "DLQ", func(m jetstream.Msg) {
		md, _ := m.Metadata()
		stamps = append(stamps, md.Timestamp)
	}); err != nil || len(stamps) != 4 {
		t.Fatalf("read DLQ: %d stamps, %v", len(stamps), err)
	}
	for _, tc := range []struct {
		name string
		edit func(*redrive.Options)
		want []uint64
	}{
		{"all", nil, []uint64{1, 2, 3, 4}},
		{"one reason", func(o *redrive.Options) { o.Reasons = []deadletter.Reason{deadletter.ReasonNoKey} }, []uint64{1, 3}},
		{"two reasons", func(o *redrive.Options) {
			o.Reasons = []deadletter.Reason{deadletter.ReasonMaxDeliver, deadletter.ReasonOutputRejected}
		}, []uint64{2, 4}},
		{"sequences", func(o *redrive.Options) { o.FromSeq, o.ToSeq = 2, 3 }, []uint64{2, 3}},
		{"since", func(o *redrive.Options) { o.Since = stamps[2] }, []uint64{3, 4}},
		{"until", func(o *redrive.Options) { o.Until = stamps[1] }, []uint64{1, 2}},
		{"reason and sequences", func(o *redrive.Options) {
			o.Reasons, o.FromSeq = []deadletter.Reason{deadletter.ReasonNoKey}, 2
		}, []uint64{3}},
		{"none", func(o *redrive.Options) { o.Reasons = []deadletter.Reason{deadletter.ReasonBadTime} }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sum := run(t, js, opts(func(o *redrive.Options) {
				o.DryRun, o.Force = true, true // no_key lies in the input: forced, it is selected like the others
				if tc.edit != nil {
					tc.edit(o)
				}
			}))
			var got []uint64
			for _, r := range sum.Results {
				if r.Outcome != redrive.WouldRepublish {
					t.Errorf("dry run: dead letter %d %s, want %s", r.Seq, r.Outcome, redrive.WouldRepublish)
				}
				got = append(got, r.Seq)
			}
			if len(got) != len(tc.want) || sum.Selected != len(tc.want) {
				t.Fatalf("selected %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("selected %v, want %v", got, tc.want)
				}
			}
		})
	}
	if got := copies(t, js); len(got) != 0 {
		t.Errorf("dry runs published %d copies", len(got))
	}
	if _, err := js.KeyValue(context.Background(), redrive.DefaultBucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Errorf("dry runs left a bucket: %v", err)
	}
}

// A copy carries its input's Nats-Msg-Id; while the input stream still
// holds that id from the input it drops the copy, and the run says so
// instead of counting it done.
func TestRedriveKeepsTheInputsMsgID(t *testing.T) {
	js := setup(t)
	m := event("e1", "x")
	m.Header.Set(jetstream.MsgIDHeader, "order-1")
	deadLetter(t, js, m, deadletter.ReasonOutputRejected, false)
	sum := run(t, js, opts(nil))
	if sum.Refused[redrive.RefusedInDuplicateWindow] != 1 || sum.Republished != 0 {
		t.Fatalf("summary %+v, want the copy refused in the duplicate window", sum)
	}
	if !strings.Contains(sum.Results[0].Detail, "order-1") {
		t.Errorf("detail %q does not name the id", sum.Results[0].Detail)
	}
	again := run(t, js, opts(nil))
	if again.Refused[redrive.RefusedInDuplicateWindow] != 1 {
		t.Errorf("a refused dead letter was marked done: %+v", again)
	}
}

func TestCopyMsgID(t *testing.T) {
	h := nats.Header{deadletter.HeaderOriginalSubject: {"events.a"}, deadletter.HeaderOriginalStream: {"IN"},
		deadletter.HeaderOriginalSequence: {"7"}, jetstream.MsgIDHeader: {"dlq:IN:7"}}
	for _, tc := range []struct {
		name         string
		original     string
		keyFromMsgID bool
		want         string
	}{
		{"the input's", "order-1", false, "order-1"},
		{"the input's, keyed by it", "order-1", true, "order-1"},
		{"minted", "", false, "redrive:DLQ:3"},
		{"none: it would be the key", "", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := nats.Header(http.Header(h).Clone())
			if tc.original != "" {
				h.Set(deadletter.HeaderOriginalMsgID, tc.original)
			}
			m, seq, refusal, _ := redrive.Copy("DLQ", 3, h, nil, tc.keyFromMsgID)
			if refusal != "" || seq != 7 {
				t.Fatalf("Copy refused %q, input sequence %d", refusal, seq)
			}
			if got := m.Header.Get(jetstream.MsgIDHeader); got != tc.want {
				t.Errorf("Nats-Msg-Id %q, want %q", got, tc.want)
			}
			if got := m.Header.Get(jetstream.ExpectedStreamHeader); got != "IN" {
				t.Errorf("expected stream %q, want IN", got)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*redrive.Options)
		want string
	}{
		{"ok", nil, ""},
		{"no stream", func(o *redrive.Options) { o.Stream = "" }, "stream"},
		{"stream with a dot", func(o *redrive.Options) { o.Stream = "a.b" }, `"a.b"`},
		{"no subject", func(o *redrive.Options) { o.Subject = "" }, "subject"},
		{"sequences", func(o *redrive.Options) { o.FromSeq, o.ToSeq = 5, 2 }, "from sequence 5"},
		{"times", func(o *redrive.Options) { o.Since, o.Until = time.Unix(2, 0), time.Unix(1, 0) }, "since"},
		{"limit", func(o *redrive.Options) { o.Limit = -1 }, "limit -1"},
		{"bucket", func(o *redrive.Options) { o.Bucket = "a b" }, `bucket "a b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := opts(tc.edit).Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate() = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// An input stored under the partition token of a scale-out stream's
// subject transform goes back on its subject without that token, and the
// stream puts it in the same partition again.
func TestRedriveThroughAPartitionTransform(t *testing.T) {
	s := natstest.RunServer(t, t.TempDir())
	_, js := natstest.Connect(t, s.ClientURL())
	for _, sc := range []jetstream.StreamConfig{
		{Name: "IN", Subjects: []string{"events.*"}, SubjectTransform: &jetstream.SubjectTransformConfig{
			Source: "events.*", Destination: "{{partition(4,1)}}.events.{{wildcard(1)}}"}},
		{Name: "DLQ", Subjects: []string{"dlq.>"}},
	} {
		if _, err := js.CreateStream(context.Background(), sc); err != nil {
			t.Fatalf("create %s: %v", sc.Name, err)
		}
	}
	natstest.PublishAll(t, js, []*nats.Msg{{Subject: "events.k1", Data: []byte("x")}})
	stored := natstest.ReadAll(t, js, "IN")[0].Subject
	if !strings.HasSuffix(stored, ".events.k1") {
		t.Fatalf("stored on %q, want a partition token first", stored)
	}
	in := deadletter.Input{Reason: deadletter.ReasonOutputRejected, Subject: stored, Stream: "IN", Sequence: 1, Data: []byte("x")}
	if _, err := js.PublishMsg(context.Background(), deadletter.Build(in, "dlq.output_rejected", 1<<20, deadletter.OmittedTooLarge)); err != nil {
		t.Fatal(err)
	}
	sum := run(t, js, opts(nil))
	if sum.Republished != 1 || sum.Results[0].Subject != "events.k1" {
		t.Fatalf("summary %+v, want one copy published on events.k1", sum)
	}
	if got := copies(t, js); len(got) != 1 || got[0].Subject != stored {
		t.Errorf("copies %v, want one stored on %q", got, stored)
	}
}

// deadLetterAgain plays the stage on copy c: it dead-letters it again for
// reason, carrying its headers as the stage's dead letters do, and returns
// the dead letter's sequence. Without keepReason the copy loses
// HeaderRedrivenReason first, as a copy an older version published.
func deadLetterAgain(t *testing.T, js jetstream.JetStream, c natstest.Message, reason deadletter.Reason, keepReason bool) uint64 {
	t.Helper()
	h := nats.Header(http.Header(c.Header).Clone())
	if !keepReason {
		h.Del(redrive.HeaderRedrivenReason)
	}
	in := deadletter.Input{Reason: reason, Detail: "again", Header: h, Data: c.Data, Subject: c.Subject, Stream: "IN", Sequence: c.Seq}
	ack, err := js.PublishMsg(context.Background(), deadletter.Build(in, "dlq."+string(reason), 1<<20, deadletter.OmittedTooLarge))
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// A redrive does not loop: a dead letter whose reason lies in the input is
// refused unless forced, saying why; the dead letter of a copy,
// dead-lettered again for the reason it was redriven for, is skipped
// (dry runs say why), also for a copy an older version published without
// HeaderRedrivenReason; one dead-lettered again for another reason is
// republished. Forced, both are republished.
func TestRedriveDoesNotLoop(t *testing.T) {
	// A copy of a copy carries the first copy's Nats-Msg-Id: IN's duplicate
	// window is kept short, and waited out before each run that publishes.
	const dup = 200 * time.Millisecond
	js := setupWith(t, dup)
	noKey := deadLetter(t, js, event("", "no key"), deadletter.ReasonNoKey, false)
	rejected := deadLetter(t, js, event("r1", "big"), deadletter.ReasonOutputRejected, false)
	old := deadLetter(t, js, event("r2", "big"), deadletter.ReasonOutputRejected, false)
	other := deadLetter(t, js, event("r3", "big"), deadletter.ReasonOutputRejected, false)

	first := run(t, js, opts(nil))
	if first.Republished != 3 || first.Refused[redrive.RefusedReasonInInput] != 1 || first.SkippedCount() != 0 {
		t.Fatalf("first run %+v, want 3 republished and no_key refused", first)
	}
	if r := first.Results[0]; r.Seq != noKey || r.Outcome != redrive.Refused || !strings.Contains(r.Detail, "no_key lies in the input") ||
		!strings.Contains(r.Detail, "--force") {
		t.Errorf("the no_key dead letter: %+v, want refused saying why and how", r)
	}
	// The stage dead-letters the copies again: r1's and r2's for the reason
	// they were redriven for (r2's copy as an older version made it), r3's
	// for another.
	cs := copies(t, js)
	if len(cs) != 3 {
		t.Fatalf("%d copies, want 3", len(cs))
	}
	again := deadLetterAgain(t, js, cs[0], deadletter.ReasonOutputRejected, true)
	oldAgain := deadLetterAgain(t, js, cs[1], deadletter.ReasonOutputRejected, false)
	otherAgain := deadLetterAgain(t, js, cs[2], deadletter.ReasonMaxDeliver, true)

	dry := run(t, js, opts(func(o *redrive.Options) { o.DryRun = true }))
	outcome := map[uint64]redrive.Result{}
	for _, r := range dry.Results {
		outcome[r.Seq] = r
	}
	for seq, want := range map[uint64]redrive.Outcome{noKey: redrive.Refused, rejected: redrive.AlreadyRedriven, old: redrive.AlreadyRedriven,
		other: redrive.AlreadyRedriven, again: redrive.Skipped, oldAgain: redrive.Skipped, otherAgain: redrive.WouldRepublish} {
		if got := outcome[seq]; got.Outcome != want {
			t.Errorf("dry run: dead letter %d %s (%s), want %s", seq, got.Outcome, got.Detail, want)
		}
	}
	for seq, from := range map[uint64]uint64{again: rejected, oldAgain: old} {
		r := outcome[seq]
		if r.Skip != redrive.SkippedDeadLetteredAgain || !strings.Contains(r.Detail, "dead-lettered again") ||
			!strings.Contains(r.Detail, fmt.Sprintf("DLQ:%d", from)) {
			t.Errorf("dry run: dead letter %d: %+v, want skipped, saying it is a copy of DLQ:%d dead-lettered again", seq, r, from)
		}
	}

	time.Sleep(dup + 100*time.Millisecond) // IN's duplicate window: the copies may be published again
	second := run(t, js, opts(nil))
	if second.Republished != 1 || second.Skipped[redrive.SkippedDeadLetteredAgain] != 2 {
		t.Errorf("second run %+v, want max_deliver's copy republished and two skipped", second)
	}
	if n := len(copies(t, js)); n != 4 {
		t.Errorf("%d copies after the second run, want 4", n)
	}
	third := run(t, js, opts(nil))
	if third.Republished != 0 || third.Skipped[redrive.SkippedDeadLetteredAgain] != 2 {
		t.Errorf("third run %+v, want nothing republished: the loop is cut", third)
	}

	time.Sleep(dup + 100*time.Millisecond)
	forced := run(t, js, opts(func(o *redrive.Options) { o.Force = true }))
	if forced.Republished != 3 || forced.SkippedCount() != 0 || forced.RefusedCount() != 0 {
		t.Errorf("forced run %+v, want no_key's and the two skipped copies republished", forced)
	}
}

// The reasons that lie in the input are the ones docs/failures.md lists as
// refused by a redrive, and no other.
func TestInInputReasonsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/failures.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Redrive\n")
	if !ok {
		t.Fatal("docs/failures.md has no \"## Redrive\" section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	refused, _, ok := strings.Cut(section, "Republished:")
	if !ok {
		t.Fatal("docs/failures.md, \"Redrive\": no \"Republished:\" list after the refused one")
	}
	for _, r := range deadletter.Reasons() {
		named := strings.Contains(refused, "`"+string(r)+"`")
		if named != r.InInput() {
			t.Errorf("%s: InInput %v, but docs/failures.md's refused list names it: %v", r, r.InInput(), named)
		}
		if !strings.Contains(section, "`"+string(r)+"`") {
			t.Errorf("docs/failures.md, \"Redrive\", does not say what a redrive does with %s", r)
		}
	}
}
