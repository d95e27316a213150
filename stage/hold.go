package stage

import "time"

// hold passes items from in to out in order, and never keeps in's sender
// waiting on out. In scale-out the sender is a group member's message
// callback, and nats.go pulls again only when that callback returns: a
// callback blocked behind a partition busy restoring sends no pull, the
// pin's TTL (input.ack_wait) passes, and the server hands the partition
// to another instance in the middle of the takeover. What hold keeps is
// bounded by the server: a member's consumer has at most
// input.max_ack_pending messages delivered and unacked (on the routed
// stream, bundles of up to scale_out.route_bundle_max inputs each, all
// held as items of their own). An item held for
// every is told to the server as in progress, again every every, so that
// it is not redelivered while it waits. When in is closed, hold hands out
// what it keeps, then closes out.
func hold(in <-chan item, out chan<- item, every time.Duration) {
	type held struct {
		it    item
		since time.Time
	}
	var q []held
	t := time.NewTicker(every)
	defer t.Stop()
	defer close(out)
	for {
		var send chan<- item
		var next item
		if len(q) > 0 {
			send, next = out, q[0].it
		}
		select {
		case it, ok := <-in:
			if !ok {
				for _, h := range q {
					out <- h.it
				}
				return
			}
			q = append(q, held{it: it, since: time.Now()})
		case send <- next:
			q[0] = held{}
			q = q[1:]
		case now := <-t.C:
			for i := range q {
				if now.Sub(q[i].since) >= every {
					_ = q[i].it.msg.InProgress()
					q[i].since = now
				}
			}
		}
	}
}
