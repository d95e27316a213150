package scaleout

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/ensure"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/streams"
)

// openHandOvers opens (creating it when missing) the bucket in which each
// new owner records its takeover of a partition
// (layout.HandOverBucket), for `dedupe-stage status`. The
// instances of a group starting together all open it at once
// (ensure.Open), for up to streams.SetUpTimeout.
func openHandOvers(ctx context.Context, js jetstream.JetStream, o Options, log *slog.Logger) (jetstream.KeyValue, error) {
	bucket := layout.HandOverBucket(o.Group)
	ctx, cancel := context.WithTimeout(ctx, streams.SetUpTimeout)
	defer cancel()
	kv, _, err := ensure.Open(ctx, "scale-out: hand-over bucket "+bucket, func(ctx context.Context) (jetstream.KeyValue, error) {
		return js.KeyValue(ctx, bucket)
	}, func(ctx context.Context) (jetstream.KeyValue, error) {
		return js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, Replicas: o.Replicas,
			Description: "dedupe-stage: the last takeover of each partition of group " + o.Group + ", for status"})
	}, ensure.Options{Logger: log})
	return kv, err
}

// recordHandOver puts h as partition p's last takeover. It only informs:
// a failure is logged (rate-limited) and the takeover stands.
func (g *Group) recordHandOver(ctx context.Context, p int, h changelog.HandOver) {
	b, err := json.Marshal(h)
	if err == nil {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = g.handOvers.Put(ctx, layout.Member(p), b)
		cancel()
	}
	if err != nil && ctx.Err() == nil {
		g.logs.Warn("handover_record_failed", "scale-out: recording the takeover for status failed; the partition is taken all the same",
			"partition", p, "err", err)
	}
}
