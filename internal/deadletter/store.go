package deadletter

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
)

// publishTimeout bounds one publish of Store.
const publishTimeout = 10 * time.Second

// StoreOptions configure Store.
type StoreOptions struct {
	// Component names the publishes to Reporter (retry.Do).
	Component string
	// Reporter is told about every attempt. Default: nobody.
	Reporter retry.Reporter
	// MaxPayload is the server's max payload; a dead letter over it is refused before any publish.
	MaxPayload int64
	// AckWait is the input's ack wait: the input is kept in progress once a third of it has passed.
	AckWait time.Duration
	// OnRetry, if set, runs after each transient failure, for the logs.
	OnRetry func(attempt int, err error)
}

// Store publishes dead letter m of input alone and waits for the stream to store it, retrying transient failures until ctx ends; one that cannot fit the server's limits is refused, permanently, before any publish.
func Store(ctx context.Context, js jetstream.JetStream, m *nats.Msg, input jetstream.Msg, o StoreOptions) error {
	if err := forward.CheckSize(m, o.MaxPayload); err != nil {
		return err
	}
	b := retry.NewBackoff()
	return retry.Do(ctx, o.Component, func() error {
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		defer cancel()
		_, err := js.PublishMsg(pctx, m)
		return err
	}, retry.Options{
		Reporter: o.Reporter,
		Pause: func() {
			if b.Since() > o.AckWait/3 {
				_ = input.InProgress()
			}
		},
		OnRetry: o.OnRetry,
	})
}
