// Package handover is what hands a partition from one instance to another
// when several instances share one input. Below are the notes on how Take
// and Restore work and why; the model follows them and is docs/scale-out.md.
//
// # Restore ends at the fence message
//
// Restore reads the partition's records and its fence subject with one
// ordered consumer and ends only on the message at the fence's sequence.
// The reader is an R1 consumer that the server may place on any replica of
// the output stream, and a replica catching up after a restart or a leader
// change counts and delivers only what it has applied, so "nothing pending"
// could hold short of the fence: a takeover once restored none of the
// records of a range that held some, and keys of one batch were forwarded
// again (TestRestoreReadsUpToTheFence). An earlier restore that ended on a
// two-second gap missed 198 of 1M records on a loaded machine. A reader of
// two subjects started by time skips records on nats-server 2.15 (it starts
// at the first subject that begins after the time), so a restore by time
// first finds its start sequence with a reader of the partition's subject
// alone.
//
// A reader that delivers nothing for RestoreReopenAfter is replaced by a new
// ordered consumer from the message after the last one read, which the
// server may place on another replica: a reader was once seen subscribed and
// heartbeating while it delivered nothing (TestRestoreReopensASilentReader).
// 30 s with no message at all ends the restore with a transient error.
//
// # Every step is bounded
//
// Every step of a takeover that asks the cluster something (reading the
// output stream, taking a fence, opening the restore's reader, the owner's
// fence refresh) gives up after StepBound with the last failure, so a
// takeover that cannot proceed fails, its batch stays unacked, and the
// partition's next batch tries again (TestTakeoverStepsGiveUp); it used to
// be retried silently, holding the partition's worker. A refresh that gave
// up after its write landed costs one refused batch: the owner, still
// pinned, takes the fence again. A refresh that got no answer reads the
// fence's last message before it writes again, and counts as done when that
// message is its own. The landed check after a lost answer asks the stream's
// leader (STREAM.MSG.GET), not any replica, also when the stream allows
// direct gets.
package handover
