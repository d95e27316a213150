// Package changelog is the output stream read as each partition's
// changelog: the record format every forward carries, the subjects that
// name a partition's records, its fence and its key-state records, taking
// and refreshing a fence, and restoring a partition from its records
// (docs/scale-out.md §3.3, §3.4, §7). It is its own package, beside the
// scale-out code, because the output is the changelog whatever the mode: a
// single instance's forwards take their ids and record headers from it
// too (ForwardID, VersionedID, AnnotateTotal), and a group's partition
// owner restores from it. A per-partition fence subject in the stream
// decides which instance may write a partition.
//
// Every forwarded message is a record of the partition's state: its
// Nats-Msg-Id is the key, Annotate adds the first-seen time and the payload
// fingerprint decided at judge time (and AnnotateTotal, with totals, what
// the forward added to its group's total), and its subject
// (PartitionSubject) carries the partition. A new owner takes the partition's fence (Take),
// which refuses every later publish of the old owner that expects the old
// fence, and then reads the partition's records back up to its own fence
// message (Restore, Decode): the fence's sequence is a cut in the stream's
// single order, so every record the old owner stored is before it.
//
// This package is the one owner of the changelog's subjects and headers:
//
//	<prefix>.<p>.<input subject>   a forwarded message of partition p (PartitionSubject)
//	<prefix>.<p>.>                 all of partition p's records (PartitionFilter)
//	_dedupe.<prefix>.fence.<p>     partition p's fence (FenceSubject)
//	_dedupe.<prefix>.key.<p>       partition p's key-state records: refreshes and forgets (KeyStateSubject)
//	_dedupe.<prefix>.>             every control record (ControlSubjects)
//
// A key-state record (KeyStateSubject, DecodeKeyState) is what changes a
// key's record without a forward: a repeat that moved its window, an
// operator's forget. The owner writes it expecting the partition's fence,
// and Restore passes it on in stream order with the records.
//
// Control records have a subject root of their own in the output stream,
// so that a consumer of <prefix>.> receives forwarded messages only; one
// atomic batch may still check a fence and write data, since both are
// subjects of one stream.
//
// Use, on taking partition p:
//
//	f, err := changelog.Take(ctx, js, "OUT", changelog.FenceSubject("out", p), instance)
//	st, err := changelog.Restore(ctx, js, "OUT", changelog.PartitionFilter("out", p), changelog.FenceSubject("out", p),
//		changelog.KeyStateSubject("out", p), cursor+1, time.Time{}, f,
//		func(r changelog.Record, seq uint64) error { ... })
//	// then publish with forward.Options{Fence: &forward.Fence{Subject: changelog.FenceSubject("out", p), Seq: f}}
//
// # Restore ends at the fence message
//
// Restore reads the partition's records, its key-state subject and its
// fence subject with one ordered consumer and ends only on the message at the fence's sequence.
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
package changelog
