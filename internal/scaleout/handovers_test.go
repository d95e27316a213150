package scaleout

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// lostKVReply is a JetStream whose first key-value bucket lookup gets no
// answer.
type lostKVReply struct {
	jetstream.JetStream
	calls atomic.Int32
}

func (l *lostKVReply) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	if l.calls.Add(1) == 1 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return l.JetStream.KeyValue(ctx, bucket)
}

// TestHandOverBucketOutlivesALostReply: instances of a group starting
// together on a new cluster can leave the hand-over bucket's lookup
// unanswered; the start goes on to the create instead of exiting with
// "context deadline exceeded" or waiting for the request timeout.
func TestHandOverBucketOutlivesALostReply(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	lr := &lostKVReply{JetStream: js}
	kv, err := openHandOvers(context.Background(), lr, Options{Group: "g", Replicas: 1}, nil)
	if err != nil {
		t.Fatalf("hand-over bucket after one lost reply: %v", err)
	}
	if n := lr.calls.Load(); n < 1 {
		t.Errorf("%d lookups, want the lost one", n)
	}
	if _, err := kv.Put(context.Background(), layout.Member(0), []byte("{}")); err != nil {
		t.Errorf("put into the opened bucket: %v", err)
	}
}
