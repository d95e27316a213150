// Package stage wires dedupe-stage together: a durable pull consumer on the
// input stream, key extraction, partitioned workers that consult the windowed
// Bloom pre-check and the Badger state, a publish to the output stream that
// carries the key as Nats-Msg-Id, the commit, and the ack.
//
// For every message the order is publish -> commit -> ack:
//
//   - a crash before the publish redelivers the message and it is judged again;
//   - a crash after the publish and before the commit redelivers it, it is
//     published again with the same Nats-Msg-Id, and the output stream's
//     duplicate window drops the copy (New refuses to start when that window
//     is shorter than the redelivery wait);
//   - a crash after the commit and before the ack redelivers it, and the
//     store recognises it as a repeat.
//
// One goroutine owns each partition, so the check and the claim of a key are
// serial without locks across partitions. Work is batched: a partition's
// batch publishes its new messages concurrently, commits its claims in one
// transaction and then acks.
//
// Use:
//
//	st, err := stage.New(ctx, stage.Options{Config: cfg, Conn: nc, Registry: reg})
//	...
//	err = st.Run(ctx) // returns after ctx is done and the batch in flight is finished
//	st.Close()
//
// # One pipeline, with or without a group
//
// The stage does not know whether it is one instance of many. Its
// messages come from a source (source.go): the single instance's consumer
// (single.go) or this instance's part in a scale-out group (group.go),
// which decodes what the route step wrote and hands the stage the same
// decoded arrivals (key, input subject, partition, pin). A partition's
// worker asks its partition's owner (ownership.Owner, declared once in
// internal/ownership) to own a batch, annotate a forwarded copy, give the
// fence the output batch expects, handle a fence loss, commit the claims
// with the cursor and fence a dead letter. One instance alone uses
// soleOwner (ownership.go), which does next to nothing; in a group each
// partition's owner is its *scaleout.Owner itself.
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
