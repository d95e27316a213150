package batcher

import (
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// EndPull ends a pull iterator at a stop: it drains it (the messages it
// holds are handed out, then Next reports it closed) while nc is connected,
// and stops it at once while nc is down, where a drain would wait for a
// flush round trip that cannot come (nats.go waits 10 s) before Next
// returns. Messages a stop drops stay unacknowledged and come back after
// AckWait. The stage's consumer and the route step call it.
func EndPull(nc *nats.Conn, iter jetstream.MessagesContext) {
	if nc.IsConnected() {
		iter.Drain()
		return
	}
	iter.Stop()
}
