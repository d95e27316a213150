package changelog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/retry"
)

// Refresh writes a partition's fence again, expecting seq (the owner's own
// last fence), so that it does not age out of an output stream with a
// max_age (docs/scale-out.md §3.4), and returns the new sequence. A fence
// another writer moved gives an error for which retry.IsFenced is true;
// transient failures are retried for StepBound at most, never writing twice
// (docs/scale-out.md, "Code notes").
func Refresh(ctx context.Context, js jetstream.JetStream, stream, fenceSubject, instance string, seq uint64) (uint64, error) {
	ctx, cancel := boundStep(ctx)
	defer cancel()
	body, err := json.Marshal(fenceBody{Instance: instance, Time: time.Now().UTC()})
	if err != nil {
		return 0, fmt.Errorf("changelog: refresh %s: %w", fenceSubject, err)
	}
	var out uint64
	tried := false
	err = retry.Do(ctx, "fence", func() error {
		ctx, cancel := Request(ctx)
		defer cancel()
		if tried {
			st, err := js.Stream(ctx, stream)
			if err != nil {
				return err
			}
			m, err := st.GetLastMsgForSubject(ctx, fenceSubject)
			switch {
			case err != nil && !errors.Is(err, jetstream.ErrMsgNotFound):
				return err
			case err == nil && m.Sequence > seq && bytes.Equal(m.Data, body):
				out = m.Sequence // the last write landed
				return nil
			}
		}
		tried = true
		m := &nats.Msg{Subject: fenceSubject, Data: body, Header: nats.Header{
			jetstream.ExpectedLastSubjSeqHeader:     {strconv.FormatUint(seq, 10)},
			jetstream.ExpectedLastSubjSeqSubjHeader: {fenceSubject},
		}}
		ack, err := js.PublishMsg(ctx, m)
		if err == nil {
			out = ack.Sequence
		}
		return err
	}, retry.Options{})
	if err != nil {
		return 0, fmt.Errorf("changelog: refresh %s expecting sequence %d: %w", fenceSubject, seq, err)
	}
	return out, nil
}
