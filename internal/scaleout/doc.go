// Package scaleout is one instance's part in a scale-out group
// (docs/scale-out.md). A static consumer group has one member per
// partition, and the server pins each member to one instance of the group.
// An instance owns a partition while it holds the partition's fence in the
// output stream: it takes the fence with the first batch the server pins to
// it, restoring the partition from its snapshot and the changelog up to the
// fence first, and every output batch of the tenure expects that fence.
//
// Group runs the members, the route step, balance and the snapshots, and
// hands each delivered message to the stage. The stage's worker of a
// partition asks the partition's Owner before it judges a batch, and tells
// it what the batch forwarded; it does not know more of the group.
//
// # Tenure
//
// A partition's worker owns the partition under the pins the server
// delivers its messages under. A batch under a pin it does not own yet makes
// it take the fence (changelog.Take) and restore up to it; the batch it holds
// is kept from redelivery (in progress) during a long restore. A new pin of
// the same instance, after the pin's TTL lapsed, does not end the tenure:
// with messages of the old pin queued behind the new one, batches alternated
// between two pins and each took the fence again. A tenure keeps every pin
// it is delivered under until its fence is refused, it is released for
// balance, or balance sees the partition pinned to another client; then all
// its pins count as lost, and what still arrives under them is given back
// (nak, no delay) for the new owner.
//
// A batch refused for the fence (10071) is left unacked and ends the
// tenure; the worker then asks the server (consumer info) whether its pin is
// still the pinned one, and if it is, the next batch takes the fence again.
// A pin counted lost is checked again (pincheck.go): when a batch still
// comes under it, the worker asks the server, at most once per ack_wait per
// partition, which pin the member consumer holds, and if it is that one (the
// check inside the refusal failed, for example with the consumer's leader
// node down, and the server still delivers the partition to no one else),
// the batch takes the fence again. Without the re-check the partitions
// stalled (TestScaleOutRecoversFromFailedPinCheck).
//
// The cursor stored with a batch's claims moves only to sequences the batch
// stored itself. A batch retried under an old fence was refused whole for
// its ids (10201) and then sent one message at a time, and each message was
// answered as a duplicate at the new owner's sequence, because the server
// checks an id before the expected sequences; a cursor taken from those
// skipped the new owner's records when the partition came back
// (TestClaimCursorLeavesOutDuplicates; the server's side:
// TestZombieDuplicatesPassAMovedFenceOnR3).
//
// # Members, balance and a clean stop
//
// Each member runs on a context of its own, which only its leave ends:
// pcgroups watches the group's record on the context a member was joined
// with and spins on the watch's closed channel once that context ends, so
// members joined on the stop's context spun at full speed until their leave.
// A clean stop finishes the batches in flight, gives back what its workers
// have not started and what its members still deliver, and unpins
// (StaticMemberStepDown) before it stops consuming: stopping first dropped
// what the client had buffered, which the server redelivers only after
// ack_wait. A presence bucket that cannot be reached at start (a cluster
// still electing) is retried with backoff.
//
// # Snapshots
//
// The writer (snapshot.go) reads one Badger view of a partition
// (state.Partition.ScanRecords) without the partition's lock and streams the
// records through an io.Pipe into the object store, one 64 KiB block in
// memory, one partition at a time, in the background. The reader (objread.go)
// reads an object through an ordered pull consumer of its chunks, 16 (2 MiB)
// at a time, and checks its size and SHA-256 at the end: the client's own
// ObjectStore.Get reads through a push consumer whose flow control let the
// server send up to 32 MiB ahead of a reader as slow as a load. A chunk that
// does not come in 30 s (an object replaced while it is read loses its
// chunks) ends the read, and the takeover falls back to the changelog.
//
// A snapshot's records come sorted by key, so a partition that holds nothing
// loads them with a state.Loader (write batches, no read before each write,
// the cursor committed last); a partition that holds anything merges each
// chunk in with Restore. A snapshot found unusable part way cancels the
// load, which drops what it wrote (the partition's keyspace), and the
// takeover reads the changelog. An instance loads one snapshot at a time
// (loadOne), keeping the waiting takeovers' batches alive: object store
// reads that share one connection stalled each other.
//
// # Checks of the streams
//
// The output stream is checked at start and at every takeover
// (changelog.go): its limits (a refusal names the field and the nats
// command that fixes it), and its reach: a stream whose first message is
// past the restore's start and younger than now minus the retention lost
// records some other way (a purge, a limit lowered for a while), and no edit
// brings them back. The check cannot tell such a removal from a stream that
// was quiet around the retention's edge (the refusal then ends once the edge
// passes its first message), and it does not see messages removed from the
// middle of the stream. An input holding messages without the partition
// token (untokened.go) is counted as the stream's messages less those an
// ordered consumer on "0.>" … "<N-1>.>" has pending.
package scaleout
