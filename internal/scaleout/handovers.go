package scaleout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/handover"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/streams"
)

// openHandOvers opens (creating it when missing) the bucket in which each
// new owner records its takeover of a partition
// (config.Config.ScaleOutHandOverBucket), for `dedupe-stage status`.
func openHandOvers(ctx context.Context, js jetstream.JetStream, cfg config.Config) (jetstream.KeyValue, error) {
	bucket := cfg.ScaleOutHandOverBucket()
	// As the streams' set-up: a request the cluster leaves unanswered
	// (instances of a group starting together on a new cluster) is asked
	// again, each for streams.RequestTimeout of streams.SetUpTimeout.
	ctx, cancel := context.WithTimeout(ctx, streams.SetUpTimeout)
	defer cancel()
	var kv jetstream.KeyValue
	err := retry.Do(ctx, "hand-over bucket", func() error {
		rctx, cancel := context.WithTimeout(ctx, streams.RequestTimeout)
		defer cancel()
		var err error
		kv, err = js.KeyValue(rctx, bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			kv, err = js.CreateKeyValue(rctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, Replicas: cfg.ScaleOut.Replicas,
				Description: "dedupe-stage: the last takeover of each partition of group " + cfg.ScaleOut.Group + ", for status"})
			if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				kv, err = js.KeyValue(rctx, bucket)
			}
		}
		return err
	}, retry.Options{})
	if err != nil {
		return nil, fmt.Errorf("scale-out: hand-over bucket %s: %w", bucket, err)
	}
	return kv, nil
}

// recordHandOver puts h as partition p's last takeover. It only informs:
// a failure is logged (rate-limited) and the takeover stands.
func (g *Group) recordHandOver(ctx context.Context, p int, h handover.HandOver) {
	b, err := json.Marshal(h)
	if err == nil {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = g.handOvers.Put(ctx, config.ScaleOutMember(p), b)
		cancel()
	}
	if err != nil && ctx.Err() == nil {
		g.logs.Warn("handover_record_failed", "scale-out: recording the takeover for status failed; the partition is taken all the same",
			"partition", p, "err", err)
	}
}
