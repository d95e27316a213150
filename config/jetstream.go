package config

import (
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NewJetStream returns the JetStream API on nc as the configuration asks:
// in nats.jetstream_domain, under nats.jetstream_api_prefix, or the
// server's own. Every JetStream context of the stage is made here, so that
// the domain reaches all of them.
func (n NATS) NewJetStream(nc *nats.Conn, opts ...jetstream.JetStreamOpt) (jetstream.JetStream, error) {
	switch {
	case n.JetStreamDomain != "":
		return jetstream.NewWithDomain(nc, n.JetStreamDomain, opts...)
	case n.JetStreamAPIPrefix != "":
		return jetstream.NewWithAPIPrefix(nc, n.JetStreamAPIPrefix, opts...)
	}
	return jetstream.New(nc, opts...)
}
