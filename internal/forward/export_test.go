package forward

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// SetPublishBatch makes atomic batches go through f, which may call the
// real publish it is given, until the returned restore runs.
func SetPublishBatch(f func(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg,
	real func(context.Context, jetstream.JetStream, []*nats.Msg, ...jetstreamext.PublishMsgBatchOpt) (*jetstreamext.BatchAck, error),
) (*jetstreamext.BatchAck, error)) (restore func()) {
	real := publishBatch
	publishBatch = func(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg, _ ...jetstreamext.PublishMsgBatchOpt) (*jetstreamext.BatchAck, error) {
		return f(ctx, js, msgs, real)
	}
	return func() { publishBatch = real }
}

// SetPublishMsg makes the fenced one-by-one publishes go through f, which
// may call the real publish it is given, until the returned restore runs.
func SetPublishMsg(f func(ctx context.Context, js jetstream.JetStream, m *nats.Msg,
	real func(context.Context, jetstream.JetStream, *nats.Msg) (*jetstream.PubAck, error),
) (*jetstream.PubAck, error)) (restore func()) {
	real := publishMsg
	publishMsg = func(ctx context.Context, js jetstream.JetStream, m *nats.Msg) (*jetstream.PubAck, error) {
		return f(ctx, js, m, real)
	}
	return func() { publishMsg = real }
}
