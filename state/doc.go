// Package state keeps dedupe records: which keys were seen, when first and
// with which payload fingerprint, over a sliding window W.
//
// # Partitions
//
// A Store has P partitions, which share one Badger database in
// Dir/badger (BadgerDir): partition i's keys start with its keyspace, i
// as a big-endian uint16, so they sort together and drop together. Each
// partition has its own windowed Bloom filter (package bloom), snapshotted
// in Dir/p%03d; it is the unit of ownership, so that it can move between
// instances. One database, not one per partition, because Badger's
// memory while it writes is per database (see BadgerSizing), and
// partitions that commit at once share its write-ahead log. A data dir
// written with a database per partition is moved into the shared one at
// Open (logged). A key
// belongs to partition PartitionOf(partitionKey, P) = xxhash64(partitionKey)
// mod P. Dir/LAYOUT records P; opening with another P is refused
// (ErrLayout), because keys would route to the wrong partition. One
// goroutine is expected to own a partition, but every method is safe for
// concurrent use.
//
// # Records
//
// A record is stored under keyspace+'k'+key (other one-byte prefixes are reserved
// for other record kinds, such as totals, written in the same transaction)
// as 17 bytes: version 1, FirstSeen in Unix nanoseconds and the
// fingerprint, both big endian; one that carries a refresh or a version
// is version 2 (docs/state.md, "Policies"). Claim records a batch of keys
// in one Badger transaction (one fsync with SyncWrites): copies inside the
// batch resolve to one New claim, keys with an unexpired record are
// repeats. With Options.RefreshOnRepeat a repeat moves its key's window to
// Record.WindowStart()+W; a Versioned claim is New only over an older
// version (version-wins).
//
// # Hand-over: first-seen times, the cursor, Restore
//
// For a partition that moves between instances (internal/changelog), a
// Claim may carry the FirstSeen decided at judge time, which the record
// stores instead of the clock's now, so that the record read back from
// the output stream on another instance equals the local one.
// ClaimWithCursor also stores the partition's cursor, the output stream
// sequence of the batch, under the single key keyspace+'c', in the same transaction
// as the claims: nothing that scans records or totals sees it. Restore
// puts records read back from the output (and their keys in the filter)
// and the cursor, idempotently; Cursor reads it.
//
// # Totals
//
// With Options.TotalsBucket set, a Claim may carry a Contribution: a New
// claim adds its Value to the total of its (group, time bucket), stored
// under keyspace + 't' + bucket + group, in the same Badger transaction that records
// its key, so a crash never keeps a key without its contribution nor a
// contribution without its key. Repeats (and copies inside one batch) add
// nothing. The partition remembers in memory which pairs changed;
// TakeDirtyTotals returns their absolute values for a flush, and
// MarkTotalsDirty hands them back when the flush fails. That set is empty
// after Open: ScanTotals reads every total still kept, for a re-flush. A
// total's Badger TTL runs to its bucket's end + W + TotalsKeep.
//
// # Logical and physical expiry
//
// A record first seen at t is logically expired from t+W on, judged by the
// injected Clock (window.Window.Inside): Lookup and Claim treat it as absent
// even while Badger still holds it. Badger drops it physically later: its
// TTL is W + W/G + 1s (G the filter's generations), on the wall clock, and
// value-log GC runs every GCInterval.
//
// # Filter and restart safety
//
// Lookup asks the filter first: "definitely not seen" answers without
// reading Badger; "maybe" always reads Badger, so a false positive costs one
// read, never a wrong answer. The filter must therefore answer "maybe" for
// every unexpired record, also after a restart. Each partition's filter is
// snapshotted to Dir/p%03d/filter.snap (every SnapshotInterval and at
// Close, when the partition wrote since the last) together with the
// Badger version it covers; the capture holds the partition lock, so
// every record of the partition up to that version is in it. Open loads
// the snapshot and tops it up with the records written after that version
// (a crash after the snapshot loses nothing), or rebuilds the filter from a
// full scan when the snapshot is missing, corrupt, made with other options,
// ahead of the store, or lacking a sample of the records it covers (a
// snapshot of another partition). Open returns only when every filter is
// ready.
//
// # Use
//
//	opts := state.DefaultOptions("/var/lib/dedupe", w) // w from window.Derive
//	st, err := state.Open(ctx, opts)
//	if err != nil { ... }
//	defer st.Close()
//	p := st.Partition(state.PartitionOf(key, st.Partitions()))
//	if r, err := p.Lookup(key); err == nil && r.Found {
//		// repeat: first seen at r.Record.FirstSeen
//	}
//	res, err := p.Claim([]state.Claim{{Key: key, Fingerprint: fp}})
//	// res[0].New: this call recorded the key
package state
