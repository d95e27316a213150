package forward_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// atomicStream creates stream OUT on out.> with a one-minute duplicate
// window, allowing atomic publish when allow is set.
func atomicStream(t *testing.T, js jetstream.JetStream, allow bool) {
	t.Helper()
	cfg := jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, Duplicates: time.Minute, AllowAtomicPublish: allow}
	if _, err := js.CreateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
}

// keyed returns messages with ids k<from> .. k<to-1>, on subjects spread
// over four partitions of the output.
func keyed(from, to int) []*nats.Msg {
	var msgs []*nats.Msg
	for i := from; i < to; i++ {
		msgs = append(msgs, &nats.Msg{
			Subject: fmt.Sprintf("out.%d.e", i%4),
			Header:  nats.Header{jetstream.MsgIDHeader: {fmt.Sprint("k", i)}, "Trace": {"t"}},
			Data:    []byte(fmt.Sprint("payload-", i)),
		})
	}
	return msgs
}

// storedIDs returns how often each Nats-Msg-Id is in stream OUT, and fails
// the test when a stored message carries a batch header.
func storedIDs(t *testing.T, js jetstream.JetStream) map[string]int {
	t.Helper()
	ids := map[string]int{}
	for _, m := range natstest.ReadAll(t, js, "OUT") {
		ids[m.Header.Get(jetstream.MsgIDHeader)]++
		if m.Header.Get("Trace") != "t" {
			t.Errorf("seq %d lost its headers: %v", m.Seq, m.Header)
		}
	}
	return ids
}

// fallbacks records OnFallback calls.
type fallbacks struct {
	mu    sync.Mutex
	codes []jetstream.ErrorCode
	sizes []int
}

func (f *fallbacks) record(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var api *jetstream.APIError
	code := jetstream.ErrorCode(0)
	if errors.As(err, &api) {
		code = api.ErrorCode
	}
	f.codes = append(f.codes, code)
	f.sizes = append(f.sizes, n)
}

// checkOnce fails unless ids holds exactly k<from> .. k<to-1>, each once.
func checkOnce(t *testing.T, ids map[string]int, from, to int) {
	t.Helper()
	if len(ids) != to-from {
		t.Errorf("output holds %d distinct ids, want %d", len(ids), to-from)
	}
	for i := from; i < to; i++ {
		if n := ids[fmt.Sprint("k", i)]; n != 1 {
			t.Errorf("k%d stored %d times, want once", i, n)
		}
	}
}

// TestAtomicBatchSplitsAndStoresEachOnce publishes 2500 messages over four
// subjects with the default BatchMax: three atomic batches (1000, 1000,
// 500), none refused, each message stored once, and the messages given
// left without the batch headers.
func TestAtomicBatchSplitsAndStoresEachOnce(t *testing.T) {
	_, js := runServer(t, 0)
	atomicStream(t, js, true)
	msgs := keyed(0, 2500)
	res := make([]forward.Result, len(msgs))
	var fb fallbacks
	o := forward.Options{Atomic: true, Inflight: forward.NewLimiter(2), OnFallback: fb.record}
	if err := forward.Batch(context.Background(), js, msgs, res, o); err != nil {
		t.Fatal(err)
	}
	if len(fb.codes) != 0 {
		t.Errorf("batches refused (codes %v), want none at the server's default limit", fb.codes)
	}
	for i, r := range res {
		if !r.Done || r.Err != nil || r.Duplicate {
			t.Errorf("message %d: %+v, want stored", i, r)
		}
	}
	checkOnce(t, storedIDs(t, js), 0, 2500)
	for i, m := range msgs {
		if m.Header.Get(jetstreamext.BatchIDHeader) != "" || m.Header.Get(jetstreamext.BatchSeqHeader) != "" || m.Reply != "" {
			t.Fatalf("message %d keeps the batch's headers: %v reply %q", i, m.Header, m.Reply)
		}
	}
}

// TestAtomicBatchWithStoredIDsFallsBack publishes k0..k9 as one atomic
// batch, then a batch holding k5..k9 again and the new k10..k19, as after a
// crash between publish and commit: the server refuses the second batch
// whole (10201), it is published one message at a time, the repeats are
// reported as duplicates the window dropped, and the new ones are stored
// once.
func TestAtomicBatchWithStoredIDsFallsBack(t *testing.T) {
	_, js := runServer(t, 0)
	atomicStream(t, js, true)
	ctx := context.Background()
	var fb fallbacks
	o := forward.Options{Atomic: true, OnFallback: fb.record}
	first := keyed(0, 10)
	if err := forward.Batch(ctx, js, first, make([]forward.Result, len(first)), o); err != nil {
		t.Fatal(err)
	}
	again := keyed(5, 20)
	res := make([]forward.Result, len(again))
	if err := forward.Batch(ctx, js, again, res, o); err != nil {
		t.Fatal(err)
	}
	if len(fb.codes) != 1 || fb.codes[0] != retry.CodeBatchDuplicateMsgID || fb.sizes[0] != 15 {
		t.Errorf("fallbacks: codes %v sizes %v, want one of 15 messages with %d", fb.codes, fb.sizes, retry.CodeBatchDuplicateMsgID)
	}
	for k, r := range res {
		i := k + 5
		switch {
		case !r.Done || r.Err != nil:
			t.Errorf("k%d: %+v, want done", i, r)
		case i < 10 && !r.Duplicate:
			t.Errorf("k%d: stored again, want dropped as a duplicate", i)
		case i >= 10 && r.Duplicate:
			t.Errorf("k%d: reported a duplicate, want stored", i)
		}
	}
	checkOnce(t, storedIDs(t, js), 0, 20)
}

// TestAtomicBatchOverTheServerLimit sets BatchMax above the server's
// max_batch_size: the server refuses the batch as too large (10199), its
// messages are stored one by one, none dead, none twice.
func TestAtomicBatchOverTheServerLimit(t *testing.T) {
	_, js := runServer(t, 0)
	atomicStream(t, js, true)
	msgs := keyed(0, 1200)
	res := make([]forward.Result, len(msgs))
	var fb fallbacks
	o := forward.Options{Atomic: true, BatchMax: 1200, OnFallback: fb.record}
	if err := forward.Batch(context.Background(), js, msgs, res, o); err != nil {
		t.Fatal(err)
	}
	if len(fb.codes) != 1 || fb.codes[0] != retry.CodeBatchTooLarge {
		t.Errorf("fallbacks: codes %v, want one with %d", fb.codes, retry.CodeBatchTooLarge)
	}
	for i, r := range res {
		if !r.Done || r.Err != nil || r.Duplicate {
			t.Errorf("message %d: %+v, want stored", i, r)
		}
	}
	checkOnce(t, storedIDs(t, js), 0, 1200)
}

// TestAtomicBatchOnAStreamWithoutAtomicPublish publishes atomic batches to
// a stream that does not allow them: each is refused (10174) and its
// messages are stored one by one, none dead.
func TestAtomicBatchOnAStreamWithoutAtomicPublish(t *testing.T) {
	_, js := runServer(t, 0)
	atomicStream(t, js, false)
	msgs := keyed(0, 30)
	res := make([]forward.Result, len(msgs))
	var fb fallbacks
	o := forward.Options{Atomic: true, BatchMax: 10, OnFallback: fb.record}
	if err := forward.Batch(context.Background(), js, msgs, res, o); err != nil {
		t.Fatal(err)
	}
	if len(fb.codes) != 3 {
		t.Errorf("%d fallbacks, want 3 (one per batch of 10)", len(fb.codes))
	}
	for _, c := range fb.codes {
		if c != retry.CodeBatchDisabled {
			t.Errorf("fallback code %d, want %d", c, retry.CodeBatchDisabled)
		}
	}
	for i, r := range res {
		if !r.Done || r.Err != nil {
			t.Errorf("message %d: %+v, want stored", i, r)
		}
	}
	checkOnce(t, storedIDs(t, js), 0, 30)
}

// TestAtomicBatchWithARefusedMessage puts messages over the stream's
// max_msg_size in an atomic batch: the batch is refused, and published one
// by one the oversized ones come back with their permanent error while the
// rest are stored once.
func TestAtomicBatchWithARefusedMessage(t *testing.T) {
	_, js := runServer(t, 0)
	cfg := jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, Duplicates: time.Minute, AllowAtomicPublish: true, MaxMsgSize: 1000}
	if _, err := js.CreateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	msgs := keyed(0, 20)
	msgs[7].Data = make([]byte, 2000)
	res := make([]forward.Result, len(msgs))
	var fb fallbacks
	if err := forward.Batch(context.Background(), js, msgs, res, forward.Options{Atomic: true, OnFallback: fb.record}); err != nil {
		t.Fatal(err)
	}
	if len(fb.codes) != 1 {
		t.Errorf("%d fallbacks, want 1", len(fb.codes))
	}
	for i, r := range res {
		var api *jetstream.APIError
		switch {
		case !r.Done:
			t.Errorf("message %d: not done", i)
		case i == 7 && (!errors.As(r.Err, &api) || api.ErrorCode != retry.CodeMessageTooLarge):
			t.Errorf("message 7: err %v, want API error %d", r.Err, retry.CodeMessageTooLarge)
		case i != 7 && r.Err != nil:
			t.Errorf("message %d: %v, want stored", i, r.Err)
		}
	}
	ids := storedIDs(t, js)
	delete(ids, "k7")
	if len(ids) != 19 {
		t.Errorf("output holds %d ids, want 19", len(ids))
	}
}

// TestAtomicMinPublishesSmallBatchesOneByOne: with AtomicMin 4, a batch of
// 3 messages is published one message at a time (stored without batch
// headers) and one of 4 as an atomic batch (all of it under one batch id);
// a fenced batch is atomic whatever its size, since fenced publishes one
// at a time go one after the other.
func TestAtomicMinPublishesSmallBatchesOneByOne(t *testing.T) {
	_, js := runServer(t, 0)
	atomicStream(t, js, true)
	ctx := context.Background()
	publish := func(msgs []*nats.Msg, o forward.Options) {
		t.Helper()
		res := make([]forward.Result, len(msgs))
		if err := forward.Batch(ctx, js, msgs, res, o); err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if !r.Done || r.Err != nil || r.Duplicate {
				t.Fatalf("message %d: %+v, want stored", i, r)
			}
		}
	}
	o := forward.Options{Atomic: true, AtomicMin: 4}
	publish(keyed(0, 3), o)
	publish(keyed(3, 7), o)
	f := takeFence(t, js, "A")
	o.Fence = &forward.Fence{Subject: fenceSubject, Seq: f}
	publish(keyed(7, 9), o)

	batchOf := map[string]string{}
	for _, m := range natstest.ReadAll(t, js, "OUT") {
		if id := m.Header.Get(jetstream.MsgIDHeader); id != "" {
			batchOf[id] = m.Header.Get(jetstreamext.BatchIDHeader)
		}
	}
	for i := range 9 {
		k, b := fmt.Sprint("k", i), batchOf[fmt.Sprint("k", i)]
		switch {
		case i < 3 && b != "":
			t.Errorf("%s of a batch of 3 stored in atomic batch %q, want one message at a time", k, b)
		case i >= 3 && i < 7 && b != batchOf["k3"]:
			t.Errorf("%s of a batch of 4 in atomic batch %q, k3 in %q: want one batch", k, b, batchOf["k3"])
		case i >= 7 && (b == "" || b != batchOf["k7"]):
			t.Errorf("%s of a fenced batch of 2 in atomic batch %q, want one atomic batch", k, b)
		}
	}
	if batchOf["k3"] == "" {
		t.Error("the batch of 4 was not published as an atomic batch")
	}
}
