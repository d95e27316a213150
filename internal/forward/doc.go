// Package forward publishes a batch of messages to JetStream with many in
// flight, waits for every PubAck, and retries what failed transiently: the
// forward loop of the stage's partition workers, shared with the
// benchmark's raw loop so that both forward with the same code.
//
// A message the server (or the client) refuses permanently (retry.Classify)
// is not retried: its Result carries the error and the rest of the batch
// proceeds. Use CheckSize before publishing to turn away a message that
// cannot fit the server's limits without sending it.
//
// With Options.Atomic, the batch is published as atomic batches of at most
// Options.BatchMax messages (github.com/synadia-io/orbit.go/jetstreamext):
// the server stores each whole or not at all, and syncs it to disk once
// instead of once per message, which is what makes a server that fsyncs
// every write fast. An atomic batch that fails transiently
// (retry.ClassifyBatch: a timeout, too many batches open on the stream) is
// published again whole; one the server refuses as a whole (an id already
// in the duplicate window, after a crash between publish and commit; a
// batch over the server's size limit; a stream that does not allow atomic
// publish) is published again one message at a time, as without Atomic,
// so that the duplicate window drops the copies it holds and the rest are
// stored. Options.OnFallback hears about each such batch. A Limiter shared
// by every caller that publishes to one stream bounds the batches open on
// it at once.
//
// Use:
//
//	res := make([]forward.Result, len(msgs))
//	err := forward.Batch(ctx, js, msgs, res, forward.Options{})
//	// err != nil: ctx ended with publishes still failing; res[i].Done says which landed.
//	// res[i].Err != nil: message i was refused permanently.
//
// # Fenced batches
//
// With Options.Fence, the fence check goes on the first message of every
// atomic batch and on every message of the one-at-a-time path, one fenced
// batch (or message) is in flight at a time (a second one on R3 is refused
// with 10164, transient), and a refusal for the fence (10071) ends Batch
// with retry.ErrFenced, the refused messages not done. Result.Seq is each
// stored message's stream sequence; an atomic batch's are the commit's less
// the messages after it.
//
// A fenced batch whose publish got no answer is not simply sent again: the
// stream is first asked for the last message on the batch's last subject,
// and if that is the batch's last message (stored after the fence, with the
// same payload and headers, whose first-seen time tells two forwards of one
// key apart) the batch counts as stored at that sequence. An atomic batch is
// stored whole or not at all, and the fence makes the owner the partition's
// only writer, so a retry no longer depends on the duplicate window: during
// a node restart a batch's publish timed out after it had landed, and its
// retry, after a short test window, stored three messages twice
// (TestFencedBatchLandedWithoutAnswer). The one-at-a-time fallback does the
// same for each fenced message (TestFencedFallbackLandedWithoutAnswer); a
// later message of the same round on the same subject hides an earlier one
// from this check, and the duplicate window drops that copy. Without a fence
// (no scale-out) a retry relies on the duplicate window, which the stage's
// start-up check sizes to ack_wait plus the restart margin.
//
// # Directives are not carried
//
// A copy leaves out every header the server acts on (IsDirective: the
// Nats-Expected-* checks, Nats-Batch-*, rollups, ...). A routed copy's own
// Nats-Batch-* headers, carried into an output copy, once made the
// one-at-a-time fallback send a batch id the output stream never saw
// (10176), and a good input was dead-lettered.
package forward
