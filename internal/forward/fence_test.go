package forward_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

const fenceSubject = "out._fence.0"

// takeFence writes a fence message as an owner taking the partition does,
// and returns its sequence.
func takeFence(t *testing.T, js jetstream.JetStream, who string) uint64 {
	t.Helper()
	var seq uint64
	// A stream just created on a cluster has no responders until its
	// leader is elected; no responder means nothing was stored, so the
	// fence is taken again.
	natstest.Poll(t, 10*time.Second, 50*time.Millisecond, who+" takes the fence", func() (bool, error) {
		ack, err := js.Publish(context.Background(), fenceSubject, []byte(who))
		switch {
		case errors.Is(err, jetstream.ErrNoStreamResponse):
			return false, err
		case err != nil:
			t.Fatalf("%s takes the fence: %v", who, err)
		}
		seq = ack.Sequence
		return true, nil
	})
	return seq
}

// streamState returns the message count and last sequence of stream OUT.
func streamState(t *testing.T, js jetstream.JetStream) (uint64, uint64) {
	t.Helper()
	st, err := js.Stream(context.Background(), "OUT")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs, info.State.LastSeq
}

// stored returns every message in stream OUT, read one by one by sequence
// (on a cluster, a new consumer may find no responders for a moment; a
// get by sequence goes to the stream's leader).
func stored(t *testing.T, js jetstream.JetStream) []natstest.Message {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, "OUT")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []natstest.Message
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("get OUT sequence %d: %v", seq, err)
		}
		out = append(out, natstest.Message{Seq: m.Sequence, Subject: m.Subject, Header: m.Header, Data: m.Data})
	}
	return out
}

// dataIDs returns how often each Nats-Msg-Id is in stream OUT, leaving
// out the fence messages.
func dataIDs(t *testing.T, js jetstream.JetStream) map[string]int {
	t.Helper()
	ids := map[string]int{}
	for _, m := range stored(t, js) {
		if m.Subject == fenceSubject {
			continue
		}
		ids[m.Header.Get(jetstream.MsgIDHeader)]++
		if m.Header.Get("Trace") != "t" {
			t.Errorf("seq %d lost its headers: %v", m.Seq, m.Header)
		}
	}
	return ids
}

// checkSeqs fails unless every done, stored message of msgs has the Seq at
// which stream OUT holds its Nats-Msg-Id.
func checkSeqs(t *testing.T, js jetstream.JetStream, msgs []*nats.Msg, res []forward.Result) {
	t.Helper()
	at := map[string]uint64{}
	for _, m := range stored(t, js) {
		if id := m.Header.Get(jetstream.MsgIDHeader); id != "" {
			at[id] = m.Seq
		}
	}
	for i, m := range msgs {
		id := m.Header.Get(jetstream.MsgIDHeader)
		if !res[i].Done || res[i].Err != nil {
			t.Errorf("%s: %+v, want stored", id, res[i])
			continue
		}
		if seq, ok := at[id]; !ok || seq != res[i].Seq {
			t.Errorf("%s: Result.Seq %d, the stream holds it at %d (held: %v)", id, res[i].Seq, seq, ok)
		}
	}
}

// checkUnfenced fails when a message given to Batch kept a fence header.
func checkUnfenced(t *testing.T, msgs []*nats.Msg) {
	t.Helper()
	for _, m := range msgs {
		for k := range m.Header {
			if strings.HasPrefix(k, "Nats-Expected-") {
				t.Fatalf("message %s keeps %s after Batch", m.Header.Get(jetstream.MsgIDHeader), k)
			}
		}
	}
}

// refusedAsZombie publishes msgs under o, whose fence has moved, and
// fails unless Batch returns an error wrapping retry.ErrFenced, no message
// is Done, the stream stored nothing, and msgs kept no fence header. It
// returns Batch's error.
func refusedAsZombie(t *testing.T, js jetstream.JetStream, msgs []*nats.Msg, o forward.Options) error {
	t.Helper()
	msgsBefore, lastBefore := streamState(t, js)
	res := make([]forward.Result, len(msgs))
	err := forward.Batch(context.Background(), js, msgs, res, o)
	if !errors.Is(err, retry.ErrFenced) || !retry.IsFenced(err) {
		t.Fatalf("publish after the fence moved: %v, want an error wrapping retry.ErrFenced", err)
	}
	for i, r := range res {
		if r.Done {
			t.Errorf("zombie message %d: %+v, want not done", i, r)
		}
	}
	if n, last := streamState(t, js); n != msgsBefore || last != lastBefore {
		t.Errorf("after the zombie's publish the stream holds %d messages up to %d, want %d up to %d", n, last, msgsBefore, lastBefore)
	}
	checkUnfenced(t, msgs)
	return err
}

// TestFencedBatchZombie plays a hand-over: owner A takes the fence and
// stores batches that expect it; B takes the fence; A, a zombie now,
// publishes again and is refused with retry.ErrFenced, nothing of its batch
// stored and none of its messages Done; B's batch expecting the new fence
// is stored. Each stored message's Result.Seq is where the stream holds it,
// across sub-batches (BatchMax 4).
func TestFencedBatchZombie(t *testing.T) {
	_, js := runServer(t, 0)
	atomicStream(t, js, true)
	ctx := context.Background()

	fa := takeFence(t, js, "A")
	a := forward.Options{Atomic: true, BatchMax: 4, Fence: &forward.Fence{Subject: fenceSubject, Seq: fa}}
	first := keyed(0, 10)
	res := make([]forward.Result, len(first))
	if err := forward.Batch(ctx, js, first, res, a); err != nil {
		t.Fatalf("A's batch under its own fence: %v", err)
	}
	checkSeqs(t, js, first, res)
	checkUnfenced(t, first)

	fb := takeFence(t, js, "B")
	var fbk fallbacks
	a.OnFallback = fbk.record
	zombie := keyed(10, 20)
	err := refusedAsZombie(t, js, zombie, a)
	var api *jetstream.APIError
	if !errors.As(err, &api) || api.ErrorCode != retry.CodeWrongLastSequence {
		t.Errorf("A's refusal %v does not carry the server's %d", err, retry.CodeWrongLastSequence)
	}
	if len(fbk.codes) != 0 {
		t.Errorf("A's fenced batch fell back to one publish per message (codes %v)", fbk.codes)
	}

	b := forward.Options{Atomic: true, BatchMax: 4, Fence: &forward.Fence{Subject: fenceSubject, Seq: fb}}
	bres := make([]forward.Result, len(zombie))
	if err := forward.Batch(ctx, js, zombie, bres, b); err != nil {
		t.Fatalf("B's batch under its fence: %v", err)
	}
	for i, r := range bres {
		if r.Duplicate {
			t.Errorf("B's message %d reported a duplicate: the zombie stored it", i)
		}
	}
	checkSeqs(t, js, zombie, bres)
	checkOnce(t, dataIDs(t, js), 0, 20)
}

// TestFencedFallbackKeepsFence checks the one-publish-per-message path
// under a fence: a batch refused as a whole for a reason other than the
// fence (10201: ids already stored) is published one fenced message at a
// time, the repeats reported as duplicates at the sequence of the stored
// copy; and on a stream that refuses every atomic batch (10174) a zombie's
// messages, published one by one, are refused by the fence, none stored.
func TestFencedFallbackKeepsFence(t *testing.T) {
	t.Run("duplicate ids, fence held", func(t *testing.T) {
		_, js := runServer(t, 0)
		atomicStream(t, js, true)
		ctx := context.Background()
		o := forward.Options{Atomic: true, Fence: &forward.Fence{Subject: fenceSubject, Seq: takeFence(t, js, "A")}}
		first := keyed(0, 5)
		fres := make([]forward.Result, len(first))
		if err := forward.Batch(ctx, js, first, fres, o); err != nil {
			t.Fatal(err)
		}
		var fb fallbacks
		o.OnFallback = fb.record
		again := keyed(3, 10)
		res := make([]forward.Result, len(again))
		if err := forward.Batch(ctx, js, again, res, o); err != nil {
			t.Fatal(err)
		}
		if len(fb.codes) != 1 || fb.codes[0] != retry.CodeBatchDuplicateMsgID {
			t.Errorf("fallbacks %v, want one with %d", fb.codes, retry.CodeBatchDuplicateMsgID)
		}
		for k, r := range res {
			if dup := k+3 < 5; r.Duplicate != dup {
				t.Errorf("k%d: duplicate %v, want %v", k+3, r.Duplicate, dup)
			}
		}
		checkSeqs(t, js, again, res)
		checkOnce(t, dataIDs(t, js), 0, 10)
		checkUnfenced(t, again)
	})
	t.Run("atomic publish off, fence moved", func(t *testing.T) {
		_, js := runServer(t, 0)
		atomicStream(t, js, false)
		ctx := context.Background()
		fa := takeFence(t, js, "A")
		var fb fallbacks
		o := forward.Options{Atomic: true, OnFallback: fb.record, Fence: &forward.Fence{Subject: fenceSubject, Seq: fa}}
		first := keyed(0, 5)
		fres := make([]forward.Result, len(first))
		if err := forward.Batch(ctx, js, first, fres, o); err != nil {
			t.Fatalf("A's messages one by one under its own fence: %v", err)
		}
		checkSeqs(t, js, first, fres)
		takeFence(t, js, "B")
		refusedAsZombie(t, js, keyed(5, 10), o)
		if len(fb.codes) != 2 || fb.codes[1] != retry.CodeBatchDisabled {
			t.Errorf("fallbacks %v, want two with %d", fb.codes, retry.CodeBatchDisabled)
		}
	})
	t.Run("asynchronous publishes, fence moved", func(t *testing.T) {
		_, js := runServer(t, 0)
		atomicStream(t, js, true)
		ctx := context.Background()
		fa := takeFence(t, js, "A")
		o := forward.Options{StallWait: time.Second, Fence: &forward.Fence{Subject: fenceSubject, Seq: fa}}
		first := keyed(0, 5)
		fres := make([]forward.Result, len(first))
		if err := forward.Batch(ctx, js, first, fres, o); err != nil {
			t.Fatal(err)
		}
		checkSeqs(t, js, first, fres)
		takeFence(t, js, "B")
		refusedAsZombie(t, js, keyed(5, 10), o)
		checkOnce(t, dataIDs(t, js), 0, 5)
	})
}

// TestBatchSeqMatchesTheStream checks Result.Seq without a fence, for
// asynchronous publishes and for atomic batches split in three, with
// other writes to the stream in between.
func TestBatchSeqMatchesTheStream(t *testing.T) {
	_, js := runServer(t, 0)
	atomicStream(t, js, true)
	ctx := context.Background()
	plain := keyed(0, 20)
	pres := make([]forward.Result, len(plain))
	if err := forward.Batch(ctx, js, plain, pres, forward.Options{}); err != nil {
		t.Fatal(err)
	}
	takeFence(t, js, "other writer")
	atomic := keyed(20, 45)
	ares := make([]forward.Result, len(atomic))
	if err := forward.Batch(ctx, js, atomic, ares, forward.Options{Atomic: true, BatchMax: 10}); err != nil {
		t.Fatal(err)
	}
	checkSeqs(t, js, plain, pres)
	checkSeqs(t, js, atomic, ares)
}

// TestFencedBatchLandedWithoutAnswer loses the answer to a fenced atomic
// batch that the stream stored (as a publish time-out during a leader
// election can) and answers only after the stream's duplicate window has
// passed, so that publishing it again would store it twice. Batch asks the
// stream whether the batch landed before it publishes again: every message
// is stored once, at the sequence its Result gives; a batch that did not
// land is published again. The stream's leader answers whether it landed,
// also on a stream that allows direct gets (which any replica answers).
func TestFencedBatchLandedWithoutAnswer(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow_direct=%v", direct), func(t *testing.T) { fencedBatchLandedWithoutAnswer(t, direct) })
	}
}

func fencedBatchLandedWithoutAnswer(t *testing.T, allowDirect bool) {
	_, js := runServer(t, 0)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"},
		Duplicates: 500 * time.Millisecond, AllowAtomicPublish: true, AllowDirect: allowDirect}); err != nil {
		t.Fatal(err)
	}
	f := takeFence(t, js, "A")
	o := forward.Options{Atomic: true, Fence: &forward.Fence{Subject: fenceSubject, Seq: f}}

	calls := 0
	restore := forward.SetPublishBatch(func(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg,
		real func(context.Context, jetstream.JetStream, []*nats.Msg, ...jetstreamext.PublishMsgBatchOpt) (*jetstreamext.BatchAck, error),
	) (*jetstreamext.BatchAck, error) {
		calls++
		switch calls {
		case 1: // stored, answer lost, the window passes
			if _, err := real(ctx, js, msgs); err != nil {
				return nil, err
			}
			time.Sleep(time.Second) // on purpose: past the stream's 500ms duplicate window
			return nil, nats.ErrTimeout
		case 3: // not stored at all
			return nil, nats.ErrTimeout
		}
		return real(ctx, js, msgs)
	})
	defer restore()

	landed := keyed(0, 5)
	res := make([]forward.Result, len(landed))
	if err := forward.Batch(ctx, js, landed, res, o); err != nil {
		t.Fatalf("a batch whose answer was lost: %v", err)
	}
	checkSeqs(t, js, landed, res)
	if calls != 1 {
		t.Errorf("the batch was published %d times, want once: it had landed", calls)
	}

	lost := keyed(5, 10)
	res = make([]forward.Result, len(lost))
	calls = 2
	if err := forward.Batch(ctx, js, lost, res, o); err != nil {
		t.Fatalf("a batch that timed out unstored: %v", err)
	}
	checkSeqs(t, js, lost, res)
	if calls != 4 {
		t.Errorf("the unstored batch was published %d times, want twice", calls-2)
	}
	checkOnce(t, dataIDs(t, js), 0, 10)
}

// TestFencedFallbackLandedWithoutAnswer has the server refuse a fenced
// atomic batch whole (10201, as after a lost PubAck of a batch that did
// land), so that its messages go one by one, and loses the answer to one
// of those publishes after the message was stored, answering only after the
// stream's duplicate window has passed. Batch asks the stream whether the
// message landed before it publishes it again: every message is stored
// once, at the sequence its Result gives.
func TestFencedFallbackLandedWithoutAnswer(t *testing.T) {
	_, js := runServer(t, 0)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"},
		Duplicates: 500 * time.Millisecond, AllowAtomicPublish: true}); err != nil {
		t.Fatal(err)
	}
	f := takeFence(t, js, "A")
	o := forward.Options{Atomic: true, Fence: &forward.Fence{Subject: fenceSubject, Seq: f}}
	restoreBatch := forward.SetPublishBatch(func(context.Context, jetstream.JetStream, []*nats.Msg,
		func(context.Context, jetstream.JetStream, []*nats.Msg, ...jetstreamext.PublishMsgBatchOpt) (*jetstreamext.BatchAck, error),
	) (*jetstreamext.BatchAck, error) {
		return nil, &jetstream.APIError{Code: 400, ErrorCode: 10201, Description: "atomic publish batch contains duplicate message id"}
	})
	defer restoreBatch()
	calls := 0
	restore := forward.SetPublishMsg(func(ctx context.Context, js jetstream.JetStream, m *nats.Msg,
		real func(context.Context, jetstream.JetStream, *nats.Msg) (*jetstream.PubAck, error),
	) (*jetstream.PubAck, error) {
		calls++
		if calls == 3 { // stored, answer lost, the window passes
			if _, err := real(ctx, js, m); err != nil {
				return nil, err
			}
			time.Sleep(time.Second) // on purpose: past the stream's 500ms duplicate window
			return nil, nats.ErrTimeout
		}
		return real(ctx, js, m)
	})
	defer restore()

	msgs := keyed(0, 5)
	res := make([]forward.Result, len(msgs))
	if err := forward.Batch(ctx, js, msgs, res, o); err != nil {
		t.Fatalf("a fallback publish whose answer was lost: %v", err)
	}
	checkSeqs(t, js, msgs, res)
	if calls != 5 {
		t.Errorf("%d publishes of 5 messages, want 5: the one whose answer was lost had landed", calls)
	}
	checkOnce(t, dataIDs(t, js), 0, 5)
}

// TestUnansweredBatchAfterAnotherOwnerTookTheFence loses a fenced atomic
// batch unstored (no answer: a time-out during a leader election) while
// another owner takes the partition's fence and forwards the batch's last
// message itself: the same input, redelivered or routed twice, makes a
// message equal in subject, payload and headers. Batch must not take that
// message for its own batch having landed, which would settle (and ack)
// the batch's other messages unstored; it reports the fence refusal, and
// the batch stays with the new owner.
func TestUnansweredBatchAfterAnotherOwnerTookTheFence(t *testing.T) {
	_, js := runServer(t, 0)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"},
		Duplicates: 500 * time.Millisecond, AllowAtomicPublish: true}); err != nil {
		t.Fatal(err)
	}
	fa := takeFence(t, js, "A")
	batch := keyed(0, 5)
	lost := false
	restore := forward.SetPublishBatch(func(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg,
		real func(context.Context, jetstream.JetStream, []*nats.Msg, ...jetstreamext.PublishMsgBatchOpt) (*jetstreamext.BatchAck, error),
	) (*jetstreamext.BatchAck, error) {
		if lost || msgs[0].Header.Get(jetstream.ExpectedLastSubjSeqHeader) != fmt.Sprint(fa) {
			return real(ctx, js, msgs) // B's, or A's again
		}
		lost = true
		// A's attempt is not stored. Before A asks whether it landed, B
		// takes the fence and forwards A's last message on its own.
		fb := takeFence(t, js, "B")
		last := []*nats.Msg{batch[len(batch)-1]}
		res := make([]forward.Result, 1)
		if err := forward.Batch(ctx, js, last, res, forward.Options{Atomic: true, Fence: &forward.Fence{Subject: fenceSubject, Seq: fb}}); err != nil {
			t.Fatalf("B forwards the message: %v", err)
		}
		return nil, nats.ErrTimeout
	})
	defer restore()

	res := make([]forward.Result, len(batch))
	err := forward.Batch(ctx, js, batch, res, forward.Options{Atomic: true, Fence: &forward.Fence{Subject: fenceSubject, Seq: fa}})
	if !retry.IsFenced(err) {
		t.Fatalf("A's batch after B took the fence: %v, want a fence refusal", err)
	}
	for i, r := range res {
		if r.Done {
			t.Errorf("message %d of A's batch: %+v, want unsettled: only B's copy of the last one is stored", i, r)
		}
	}
	checkOnce(t, dataIDs(t, js), 4, 5)
}
