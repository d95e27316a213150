package changelog

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Ahead is what CheckAhead found of a partition whose store was ahead of
// the output stream, and what it dropped.
type Ahead struct {
	// Partition is the partition's index.
	Partition int
	// Cursor is the partition's cursor before the check: the output
	// sequence up to which its store recorded forwards.
	Cursor uint64
	// LastSeq is the output stream's last sequence.
	LastSeq uint64
	// Kept is the output sequence up to which the store's records were
	// found in the output: the partition's cursor after the check.
	Kept uint64
	// Dropped is how many records it removed: keys whose forwards the
	// output no longer holds.
	Dropped int
	// Rewritten is true when the output holds, at a sequence at or below
	// LastSeq that a record names, another message than that record's
	// forward: the output stored new messages after it lost the ones the
	// store recorded.
	Rewritten bool
}

// CheckAhead compares partition p's store with the output stream, whose
// last sequence is last (as its leader stores it), and repairs the store
// when it is ahead: when the partition's cursor is above last, the output
// lost forwards it had acknowledged (a server that lost writes it had not
// synced, or a stream deleted and made again). The forwards recorded at
// or below last are checked against the output: the message at a
// record's output sequence must be that key's forward (a sequence whose
// message is gone, removed by a limit, counts as held). Sequences are
// checked by bisection over the records' sequences, the output holding a
// prefix of what the store recorded and then, when it stored new messages
// after the loss, other messages. Every record past the last one found is
// removed and the cursor lowered to it (state.Partition.DropAfter), so
// that the restore that follows reads the output from there and the keys
// the output lost are judged New when their copies come again.
//
// It returns false, and touches nothing, when the cursor is at or below
// last: the store is not ahead. A store ahead whose output wrote past
// its cursor after the loss is not detected (docs/state.md, "A server
// that lost acknowledged writes").
func CheckAhead(ctx context.Context, js jetstream.JetStream, stream string, p *state.Partition, last uint64) (Ahead, bool, error) {
	cursor, err := p.Cursor()
	if err != nil {
		return Ahead{}, false, err
	}
	a := Ahead{Partition: p.Index(), Cursor: cursor, LastSeq: last}
	if cursor <= last {
		return a, false, nil
	}
	seqs, err := p.OutputSeqs(ctx, last)
	if err != nil {
		return a, true, fmt.Errorf("changelog: partition %d ahead of output stream %s: %w", a.Partition, stream, err)
	}
	var probeErr error
	i := sort.Search(len(seqs), func(i int) bool {
		if probeErr != nil {
			return true
		}
		held, err := holdsForward(ctx, js, stream, p, seqs[i])
		if err != nil {
			probeErr = err
			return true
		}
		return !held
	})
	if probeErr != nil {
		return a, true, fmt.Errorf("changelog: partition %d ahead of output stream %s: %w", a.Partition, stream, probeErr)
	}
	a.Kept = last
	if i < len(seqs) {
		a.Kept, a.Rewritten = seqs[i]-1, true
	}
	if a.Dropped, err = p.DropAfter(ctx, a.Kept); err != nil {
		return a, true, err
	}
	return a, true, nil
}

// holdsForward reports whether the output stream holds, at seq, the
// forward of the key whose record in p names seq as its forward's, or no
// message at all (removed: it cannot have been written again).
func holdsForward(ctx context.Context, js jetstream.JetStream, stream string, p *state.Partition, seq uint64) (bool, error) {
	var m *jetstream.RawStreamMsg
	ctx, cancel := boundStep(ctx)
	defer cancel()
	err := retry.Do(ctx, "read back", func() error {
		rctx, cancel := Request(ctx)
		defer cancel()
		var err error
		m, err = forward.AtOnLeader(rctx, js, stream, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			m, err = nil, nil
		}
		return err
	}, retry.Options{})
	if err != nil {
		return false, fmt.Errorf("message at sequence %d: %w", seq, err)
	}
	if m == nil {
		return true, nil
	}
	key, _, _, err := ForwardKey(m.Header)
	if err != nil || len(key) == 0 || len(key) > state.MaxKeySize {
		return false, nil // not a forward
	}
	rec, _, err := p.Held([]byte(key))
	if err != nil {
		return false, err
	}
	return rec.OutputSeq == seq, nil
}
