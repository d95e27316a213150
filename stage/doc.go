// Package stage wires dedupe-stage together. Below are the notes on its
// scale-out side; the model follows them, and the design is
// docs/scale-out.md.
//
// # One worker, with or without a group
//
// A partition's worker does not know whether it is one instance of many: it
// asks its partition's ownership (ownership.go) to own a batch, annotate a
// forwarded copy, give the fence the output batch expects, handle a fence
// loss, commit the claims with the cursor and fence a dead letter. One
// instance alone uses soleOwner, which does nothing; in a group each
// partition has a scaleout.Owner. The stage's side of setting the group up
// and of the routed stream's dispatch is group.go.
//
// # A member's callback never waits on its partition
//
// The client pulls again only when the message callback returns, so a
// callback blocked behind a partition busy restoring sent no pull, the pin's
// TTL passed, and the server pinned the partition anew in the middle of the
// takeover. hold.go queues what the callback delivers (bounded by the member
// consumer's max_ack_pending) and marks what waits in progress every
// ack_wait / 3.
//
// # Requests a cluster leaves unanswered
//
// A cluster can leave a request unanswered (a stream create, a pull):
// stream creation at start is asked again after a time-out.
package stage
