// Package pull is the one pull loop of the module: the stage's single
// instance and the route step read their durable pull consumers with it,
// so that both ask the server the same way and re-subscribe the same way.
//
// A pull asks for at most Options.MaxMessages messages and lasts at most
// Expiry(Options.AckWait), with heartbeats every half of it (nats.go's
// default): a pull request the cluster loses, as one can while the
// consumer's node takes it over, is noticed and made again after that
// long, not after nats.go's default of 30 s. A subscription that breaks
// (consumer deleted, server restarted, leader moved) is made again with
// backoff (retry.Backoff) until ctx ends.
//
//	pull.Run(ctx, cons, pull.Options{MaxMessages: 512, AckWait: 30 * time.Second, Logger: log},
//		func(msg jetstream.Msg) { ... })
package pull

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/batcher"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
)

// MinExpiry is the shortest a pull lasts, whatever the ack wait.
const MinExpiry = 2 * time.Second

// Options configure Run.
type Options struct {
	// MaxMessages is the most messages one pull asks for
	// (jetstream.PullMaxMessages). Required: at least 1.
	MaxMessages int
	// AckWait is the consumer's ack wait, which bounds how long a pull
	// lasts (Expiry).
	AckWait time.Duration
	// Logger hears a subscription that failed or ended. Default:
	// slog.Default().
	Logger *slog.Logger
	// Heartbeat, when not 0, is the pull's idle heartbeat
	// (jetstream.PullHeartbeat), at most 2/5 of its expiry: a pull the
	// server stops answering ends within two of them.
	Heartbeat time.Duration
	// Failed, when set, hears each subscription that could not start or
	// ended while ctx was not done.
	Failed func(error)
	// Conn, when set, is the connection the consumer is on: a stop while
	// it is down ends the pull at once instead of draining it
	// (batcher.EndPull).
	Conn *nats.Conn
	// Subscribed, when set, is called as each subscription starts; it
	// returns what is called at each message the subscription delivers and
	// once when it ends.
	Subscribed func() (message, ended func())
}

// Expiry is how long a pull lasts for a consumer whose ack wait is
// ackWait: ackWait, and at least MinExpiry.
func Expiry(ackWait time.Duration) time.Duration { return max(ackWait, MinExpiry) }

// Run pulls messages from cons and hands each to deliver, one at a time
// on the calling goroutine, until ctx is done; it returns once ctx is done
// and the messages already received are handed over (the subscription is
// drained). A subscription that cannot be made, or that ends while ctx
// lasts, is made again after a backoff, which a delivered message resets.
func Run(ctx context.Context, cons jetstream.Consumer, o Options, deliver func(jetstream.Msg)) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	b := retry.NewBackoff()
	for ctx.Err() == nil {
		opts := []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(max(o.MaxMessages, 1)), jetstream.PullExpiry(Expiry(o.AckWait))}
		if o.Heartbeat > 0 {
			// nats.go takes a heartbeat under half the pull's expiry.
			opts = append(opts, jetstream.PullHeartbeat(min(o.Heartbeat, Expiry(o.AckWait)*2/5)))
		}
		iter, err := cons.Messages(opts...)
		if err != nil {
			o.failed(err, "pull subscription failed, retrying")
			_ = b.Wait(ctx)
			continue
		}
		o.consume(ctx, iter, b, deliver)
		if ctx.Err() == nil {
			_ = b.Wait(ctx)
		}
	}
}

// consume hands each message of iter to deliver until the subscription
// ends or ctx is done (then it is ended and drained), resetting b at each
// message.
func (o Options) consume(ctx context.Context, iter jetstream.MessagesContext, b *retry.Backoff, deliver func(jetstream.Msg)) {
	message, ended := func() {}, func() {}
	if o.Subscribed != nil {
		message, ended = o.Subscribed()
	}
	end := iter.Drain
	if o.Conn != nil {
		end = func() { batcher.EndPull(o.Conn, iter) }
	}
	stop := context.AfterFunc(ctx, end)
	defer func() {
		stop()
		iter.Stop()
	}()
	for {
		msg, err := iter.Next()
		if err != nil {
			ended()
			if !errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() == nil {
				o.failed(err, "pull subscription ended, re-subscribing")
			}
			return
		}
		message()
		b.Reset()
		deliver(msg)
	}
}

// failed reports err, which ended or refused a subscription, to Failed
// and the log.
func (o Options) failed(err error, what string) {
	if o.Failed != nil {
		o.Failed(err)
	}
	o.Logger.Warn(what, "err", err)
}
