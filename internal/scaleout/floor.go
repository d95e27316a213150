package scaleout

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/pending"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/route"
)

// PendingFloors returns, for each partition this instance owns that may
// still be handed a message older than the ones it judged, the input time
// of the oldest such message: what the servers hold unacknowledged for
// it. A partition absent from the map has none. Partition p's member
// consumer's first unacknowledged message counts (with the route step,
// the routed stream's oldest message of p, since a work queue keeps only
// what is not acknowledged), and, with the route step, the route
// consumer's first unacknowledged input counts for every partition: it is
// routed later with its own input time. The stage expires no record that
// a message at such a time could still repeat (stage.runExpiry).
func (g *Group) PendingFloors(ctx context.Context) (map[int]time.Time, error) {
	owned := g.ownedPartitions()
	floors := make(map[int]time.Time, len(owned))
	var routeFloor time.Time
	if g.routed != nil {
		var err error
		if routeFloor, err = pending.ConsumerFloor(ctx, g.js, g.routed.InputStream, route.ConsumerName(g.name)); err != nil {
			return nil, err
		}
	}
	for _, p := range owned {
		var f time.Time
		var err error
		if g.routed != nil {
			f, err = routedFloor(ctx, g.js, g.inStream, route.Subject(p, g.routed.RoutedSubject, ">"), g.routed.RoutedSubject)
		} else {
			f, err = pending.ConsumerFloor(ctx, g.js, g.inStream, layout.MemberConsumer(g.name, p))
		}
		if err != nil {
			return nil, fmt.Errorf("partition %d: %w", p, err)
		}
		if !routeFloor.IsZero() && (f.IsZero() || routeFloor.Before(f)) {
			f = routeFloor
		}
		if !f.IsZero() {
			floors[p] = f
		}
	}
	return floors, nil
}

// routedFloor returns the oldest input time among the copies of the
// routed stream's first message on filter (a work queue: every message it
// holds is unacknowledged); zero when there is none.
func routedFloor(ctx context.Context, js jetstream.JetStream, stream, filter, routedSubject string) (time.Time, error) {
	m, err := pending.FirstMsg(ctx, js, stream, 1, filter)
	if err != nil || m == nil {
		return time.Time{}, err
	}
	if !route.IsBundle(m.Header) {
		o, err := route.OriginOf(routedSubject, m.Subject, m.Header)
		if err != nil {
			return m.Time, nil // not the route step's copy: its own time is its input time
		}
		return o.Time, nil
	}
	copies, err := route.ReadBundle(m.Subject, m.Header, m.Data)
	if err != nil {
		return m.Time, nil // dead-lettered when delivered: its own time is as late as any it holds
	}
	floor := m.Time
	for _, c := range copies {
		if o, err := route.OriginOf(routedSubject, c.Subject, c.Header); err == nil && o.Time.Before(floor) {
			floor = o.Time
		}
	}
	return floor, nil
}
