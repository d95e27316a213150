package changelog

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
)

// Holds reports whether stream holds any message on one of subjects
// (filters may have wildcards): a takeover of a partition whose forwards
// and key-state records are all gone, or were never written, restores
// nothing and needs neither the snapshot nor a reader. It asks the
// stream's leader (LastOnLeader): after a fence written through the
// leader, its answer covers every record before the fence.
func Holds(ctx context.Context, js jetstream.JetStream, stream string, subjects ...string) (bool, error) {
	for _, s := range subjects {
		_, found, err := LastOnLeader(ctx, js, stream, s)
		if err != nil || found {
			return found, err
		}
	}
	return false, nil
}

// FenceHolder returns the instance that wrote the last message on
// fenceSubject, as the stream's leader has it (LastOnLeader); "" when
// there is none.
func FenceHolder(ctx context.Context, js jetstream.JetStream, stream, fenceSubject string) (string, error) {
	data, found, err := LastOnLeader(ctx, js, stream, fenceSubject)
	if err != nil || !found {
		return "", err
	}
	f, err := ParseFence(data)
	return f.Instance, err
}

// LastOnLeader returns the body of stream's last message on subject (a
// filter may have wildcards), found false when there is none. It asks the
// stream's leader (forward.LastOnLeader), never a direct get, which any
// replica answers, one maybe behind. Transient failures are retried for
// StepBound at most; an error the API answers with is not.
func LastOnLeader(ctx context.Context, js jetstream.JetStream, stream, subject string) (data []byte, found bool, err error) {
	ctx, cancel := boundStep(ctx)
	defer cancel()
	var answered error // an error the API answered with: not retried
	err = retry.Do(ctx, "last message", func() error {
		ctx, cancel := Request(ctx)
		defer cancel()
		m, err := forward.LastOnLeader(ctx, js, stream, subject)
		var api *jetstream.APIError
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			data, found = nil, false
			return nil
		case errors.As(err, &api):
			answered = err
			return nil
		case err != nil:
			return err
		}
		data, found = m.Data, true
		return nil
	}, retry.Options{})
	if err == nil {
		err = answered
	}
	if err != nil {
		return nil, false, fmt.Errorf("changelog: last message of %s in stream %s: %w", subject, stream, err)
	}
	return data, found, nil
}
