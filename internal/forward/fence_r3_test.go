package forward_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// TestFencedBatchesOnR3 runs fenced atomic batches on an R3 stream of a
// 3-node cluster. Two publishers share one fence at once, so their
// batches check one fence subject concurrently (the server refuses the
// second proposal in flight with 10164, which is retried as transient):
// every message is stored once, at the sequence its Result gives. After
// another owner writes the fence, a batch is refused whole (10071,
// retry.ErrFenced) and nothing of it is stored.
func TestFencedBatchesOnR3(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	_, js := c.Connect()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, Duplicates: time.Minute, AllowAtomicPublish: true, Replicas: 3}
	c.CreateStream(js, cfg)
	f := takeFence(t, js, "A")

	var mu sync.Mutex
	codes := map[jetstream.ErrorCode]int{}
	o := forward.Options{Atomic: true, BatchMax: 10, Fence: &forward.Fence{Subject: fenceSubject, Seq: f},
		OnRetry: func(_, _ int, err error) {
			var api *jetstream.APIError
			if errors.As(err, &api) {
				mu.Lock()
				codes[api.ErrorCode]++
				mu.Unlock()
			}
		}}
	const per = 60
	msgs := [2][]*nats.Msg{keyed(0, per), keyed(per, 2*per)}
	res := [2][]forward.Result{make([]forward.Result, per), make([]forward.Result, per)}
	errs := [2]error{}
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { errs[i] = forward.Batch(ctx, js, msgs[i], res[i], o) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("publisher %d: %v", i, err)
		}
	}
	t.Logf("refusals retried: %v (%d is another fenced proposal in flight)", codes, retry.CodeWrongLastSequenceConstant)
	checkSeqs(t, js, msgs[0], res[0])
	checkSeqs(t, js, msgs[1], res[1])
	checkOnce(t, dataIDs(t, js), 0, 2*per)

	takeFence(t, js, "B")
	err := refusedAsZombie(t, js, keyed(2*per, 2*per+10), o)
	var api *jetstream.APIError
	if !errors.As(err, &api) || api.ErrorCode != retry.CodeWrongLastSequence {
		t.Errorf("zombie's refusal %v, want API error %d", err, retry.CodeWrongLastSequence)
	}
	if codes[retry.CodeWrongLastSequence] != 0 {
		t.Errorf("a fence refusal was retried: %v", codes)
	}
}

// TestZombieDuplicatesPassAMovedFenceOnR3 documents what an owner's cursor
// must not trust (scaleout's Owner.Claim). On an R3 stream, a zombie (A,
// whose fence B has moved) sends an atomic batch of messages whose ids B
// has stored meanwhile. The stream's leader refuses it for its ids (10201),
// not for the fence (on one server the fence refuses it), so the batch goes
// one message at a time under A's old fence, and each is answered as a
// duplicate at the sequence where B stored it, past B's fence: a duplicate
// says nothing of the fence. Nothing is stored twice.
func TestZombieDuplicatesPassAMovedFenceOnR3(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	_, js := c.Connect()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c.CreateStream(js, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, Duplicates: time.Minute, AllowAtomicPublish: true, Replicas: 3})

	fa := takeFence(t, js, "A")
	fb := takeFence(t, js, "B")
	ours := keyed(0, 6)
	bres := make([]forward.Result, len(ours))
	if err := forward.Batch(ctx, js, ours, bres, forward.Options{Atomic: true, BatchMax: 8, Fence: &forward.Fence{Subject: fenceSubject, Seq: fb}}); err != nil {
		t.Fatalf("B's batch under its fence: %v", err)
	}

	var fbk fallbacks
	zombie := keyed(3, 6)
	ares := make([]forward.Result, len(zombie))
	err := forward.Batch(ctx, js, zombie, ares, forward.Options{Atomic: true, BatchMax: 8, Fence: &forward.Fence{Subject: fenceSubject, Seq: fa}, OnFallback: fbk.record})
	// nats-server 2.15 refuses it for its ids; should a later version
	// refuse it for the fence, this test fails, and Owner.Claim's guard is
	// then belt and braces.
	if err != nil || len(fbk.codes) != 1 || fbk.codes[0] != retry.CodeBatchDuplicateMsgID {
		t.Fatalf("the zombie's batch: err %v, fell back with codes %v; want no error after one fallback for %d", err, fbk.codes, retry.CodeBatchDuplicateMsgID)
	}
	for i, r := range ares {
		if want := bres[3+i].Seq; !r.Done || r.Err != nil || !r.Duplicate || r.Seq != want || r.Seq <= fb {
			t.Errorf("the zombie's message %d: %+v, want a duplicate at B's sequence %d, past B's fence %d", i, r, want, fb)
		}
	}
	checkOnce(t, dataIDs(t, js), 0, 6)
}
