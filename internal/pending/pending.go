// Package pending reads, from the servers, how old the oldest message is
// that a durable consumer may still deliver again: the floor below which
// the stage expires nothing (docs/state.md, "The input's clock").
//
// A message a consumer delivered and has not had acknowledged comes back
// after ack_wait, to this instance or another, with the time the input
// stream stored it. Records that such a message could repeat must outlive
// its return, however far newer messages have moved the input's clock
// meanwhile (a backlog judged after a stop, a crash, a hand-over).
//
// Use:
//
//	floor, err := pending.ConsumerFloor(ctx, js, "EVENTS", "dedupe-stage")
//	// floor.IsZero(): nothing is pending
package pending

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ConsumerFloor returns the stream time of the first message after
// durable consumer name's ack floor on stream, on its filter subject (any
// subject when it has several, which can only give an older one): the
// oldest message the consumer may deliver again. It is zero when the
// consumer holds nothing delivered and unacknowledged, or when that
// message is gone from the stream.
func ConsumerFloor(ctx context.Context, js jetstream.JetStream, stream, name string) (time.Time, error) {
	c, err := js.Consumer(ctx, stream, name)
	if err != nil {
		return time.Time{}, fmt.Errorf("pending: consumer %s on %s: %w", name, stream, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("pending: consumer %s on %s: %w", name, stream, err)
	}
	if info.NumAckPending == 0 {
		return time.Time{}, nil
	}
	filter := info.Config.FilterSubject
	if filter == "" {
		filter = ">"
	}
	return FirstTime(ctx, js, stream, info.AckFloor.Stream+1, filter)
}

// FirstTime returns the stream time of the first message of stream at or
// after sequence seq on subject filter; zero when there is none.
func FirstTime(ctx context.Context, js jetstream.JetStream, stream string, seq uint64, filter string) (time.Time, error) {
	m, err := FirstMsg(ctx, js, stream, seq, filter)
	if err != nil || m == nil {
		return time.Time{}, err
	}
	return m.Time, nil
}

// FirstMsg returns the first message of stream at or after sequence seq
// on subject filter; nil when there is none.
func FirstMsg(ctx context.Context, js jetstream.JetStream, stream string, seq uint64, filter string) (*jetstream.RawStreamMsg, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("pending: stream %s: %w", stream, err)
	}
	m, err := st.GetMsg(ctx, max(seq, 1), jetstream.WithGetMsgSubject(filter))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pending: stream %s: the first message on %s from sequence %d: %w", stream, filter, seq, err)
	}
	return m, nil
}
