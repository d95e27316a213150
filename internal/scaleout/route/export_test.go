package route

import "github.com/nats-io/nats.go/jetstream"

// WithholdAck returns o with a hook asked before each ack: true leaves the
// message unacked, so that the server redelivers it.
func WithholdAck(o Options, withhold func(jetstream.Msg) bool) Options {
	o.withholdAck = withhold
	return o
}
