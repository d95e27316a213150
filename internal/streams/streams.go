// Package streams holds the rules of the duplicate windows of the
// JetStream streams the stage publishes to with a Nats-Msg-Id: the output
// stream, and with scale-out the route step's routed stream. The
// configuration (config) and the route step (internal/scaleout/route) both take
// their streams' windows from here, as values computed from the settings
// they are given; the package imports nothing of this module.
//
// The model: a publisher that crashes after a publish and before it
// acknowledges the input gets the input again once the consumer's
// ack_wait (or its longest backoff step) has passed, and publishes it
// again as soon as it has restarted. The stream drops that second copy
// only while the first is inside its duplicate window, so the window must
// be at least RequiredDuplicateWindow; a stream created by the stage gets
// DuplicateWindow, twice that and never less than JetStream's default.
//
// Use:
//
//	need := streams.RequiredDuplicateWindow(ackWait, nil, restartMargin)
//	sc.Duplicates = streams.DuplicateWindow(ackWait, restartMargin)
package streams

import "time"

// DefaultDuplicateWindow is JetStream's own default duplicate window, the
// floor of a computed one (DuplicateWindow).
const DefaultDuplicateWindow = 2 * time.Minute

// DefaultRestartMargin is how long a crash and restart of a publisher may
// take unless it is configured (output.restart_margin, the route step's
// Options.RestartMargin).
const DefaultRestartMargin = time.Minute

// RequiredDuplicateWindow is the longest time a message can wait for
// redelivery after a crash between its publish and its acknowledgement:
// ackWait (the server redelivers what the dead publisher held after it) or
// the longest consumer backoff, whichever is longer, plus restartMargin,
// the time a restart may take. The duplicate window of the stream
// published to must cover it, or a copy published again after a crash is
// stored twice.
func RequiredDuplicateWindow(ackWait time.Duration, backoff []time.Duration, restartMargin time.Duration) time.Duration {
	longest := ackWait
	for _, b := range backoff {
		longest = max(longest, b)
	}
	return longest + restartMargin
}

// DuplicateWindow is the duplicate window a stream is created with when
// none is configured, for a consumer without backoff (what the stage and
// the route step create): twice RequiredDuplicateWindow(ackWait, nil,
// restartMargin), and at least DefaultDuplicateWindow. With the defaults
// (ack_wait 10s, restart margin 1m) it is 2m20s.
func DuplicateWindow(ackWait, restartMargin time.Duration) time.Duration {
	return max(DefaultDuplicateWindow, 2*RequiredDuplicateWindow(ackWait, nil, restartMargin))
}

// SetUpTimeout bounds how long the stage asks again for the streams,
// consumers and buckets it creates or checks at start before it gives up
// starting, and RequestTimeout bounds one request of it: a cluster can
// leave a request unanswered while it elects a leader, and the request
// asked again is answered.
const (
	SetUpTimeout   = time.Minute
	RequestTimeout = 10 * time.Second
)
