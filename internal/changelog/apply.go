package changelog

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/state"
)

// ApplyChunk is how many restored records Apply writes to a partition at
// once.
const ApplyChunk = 4096

// Target is a partition Apply restores: the store's partition and its
// cursor, the output sequence up to which it already holds its records
// (records at or below it are left out).
type Target struct {
	P      *state.Partition
	Cursor uint64
}

// ApplyOptions are what Apply reports to and asks of its caller.
type ApplyOptions struct {
	// Route returns the index in targets of the partition a record read on
	// subject belongs to, or -1 for none (it is skipped and counted); it
	// may drop what the partition does not keep of the record (a
	// contribution to a total, with totals off).
	Route func(r *Record, subject string) int
	// Progress, when set, is called after each write with the target's
	// index and the records written to it so far.
	Progress func(t, records int)
	// KeepAlive, when set, is called after each write (a takeover keeps
	// its batch in progress meanwhile).
	KeepAlive func()
}

// ApplyStats is what an Apply did.
type ApplyStats struct {
	RestoreStats
	// Applied is how many records it wrote to each target (state
	// Restore calls; a record a partition held already counts too).
	Applied []int
	// Stored is how many keys it stored that the partitions did not hold
	// (state.Partition.RestoreCounted).
	Stored int
	// Unrouted is how many records Route sent nowhere.
	Unrouted int
}

// Apply reads sp (Read) and restores each record into the target Route
// names, ApplyChunk at a time, each write storing the target's cursor at
// the last sequence written; then every target's cursor at sp.UpTo. It
// is the one restore of the store from its changelog, for a group's new
// owner of a partition (one target) and for a single instance at start
// (one target per partition, each record routed by its key, or its group
// with totals on). A record is applied to a target only past its cursor,
// so an Apply that fails part way and runs again from the cursors adds
// nothing twice.
func Apply(ctx context.Context, js jetstream.JetStream, sp Span, targets []Target, o ApplyOptions) (ApplyStats, error) {
	st := ApplyStats{Applied: make([]int, len(targets))}
	recs := make([][]state.Restored, len(targets))
	flush := func(t int, upTo uint64) error {
		n, err := targets[t].P.RestoreCounted(recs[t], upTo)
		if err != nil {
			return fmt.Errorf("changelog: restore into partition %d: %w", targets[t].P.Index(), err)
		}
		st.Stored += n
		st.Applied[t] += len(recs[t])
		if upTo > targets[t].Cursor {
			targets[t].Cursor = upTo
		}
		recs[t] = recs[t][:0]
		if o.Progress != nil {
			o.Progress(t, st.Applied[t])
		}
		if o.KeepAlive != nil {
			o.KeepAlive()
		}
		return nil
	}
	rs, err := Read(ctx, js, sp, func(r Record, subject string, seq uint64) error {
		t := o.Route(&r, subject)
		if t < 0 || t >= len(targets) {
			st.Unrouted++
			return nil
		}
		if seq <= targets[t].Cursor {
			return nil // the partition holds it already
		}
		recs[t] = append(recs[t], Restored(r, seq))
		if len(recs[t]) == ApplyChunk {
			return flush(t, seq)
		}
		return nil
	})
	st.RestoreStats = rs
	if err != nil {
		return st, err
	}
	for t := range targets {
		if len(recs[t]) > 0 || targets[t].Cursor < sp.UpTo {
			if err := flush(t, sp.UpTo); err != nil { // the rest, and the cursor at UpTo
				return st, err
			}
		}
	}
	return st, nil
}

// Restored is the state record of rec, read back from the changelog at
// sequence seq: a forward's record, a refresh's (its record with the
// window start it moved to) or a forget's (its record marked forgotten).
func Restored(rec Record, seq uint64) state.Restored {
	return state.Restored{Key: rec.Key, FirstSeen: rec.FirstSeen, Fingerprint: rec.Fingerprint,
		Total: state.Contribution{Group: rec.Group, Bucket: rec.Bucket, Value: rec.Value}, Seq: seq,
		Refreshed: rec.WindowStart, Version: rec.Version, HasVersion: rec.HasVersion, Forgotten: rec.Forgotten,
		OutputSeq: rec.OutputSeq}
}
