package scaleout

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// TestConsumerGroupBucketHoldsEveryWatcher: each member an instance
// consumes watches the group's key in pcgroups' bucket, instances x
// partitions watchers in all, and a stream without a limit of its own
// refuses consumers past the server's default (1,000 since nats-server
// 2.15; 10 here). Once raiseConsumerLimit has run on the bucket's stream,
// 20 watchers open where the 11th was refused before.
func TestConsumerGroupBucketHoldsEveryWatcher(t *testing.T) {
	const serverDefault = 10
	srv := natstest.RunServerWith(t, func(o *server.Options) { o.JetStreamLimits.DefaultMaxConsumers = serverDefault })
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: pcgroupsBucket, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	watch := func(n int) error {
		for range n {
			w, err := kv.Watch(ctx, "EVENTS.dedupe")
			if err != nil {
				return err
			}
			t.Cleanup(func() { _ = w.Stop() })
		}
		return nil
	}
	if err := watch(serverDefault + 1); err == nil || !strings.Contains(err.Error(), "maximum consumers limit") {
		t.Fatalf("%d watchers on the bucket as pcgroups makes it: %v; want the server's default limit to refuse the last", serverDefault+1, err)
	}
	if err := raiseConsumerLimit(ctx, js, "KV_"+pcgroupsBucket, pcgroupsBucketConsumers); err != nil {
		t.Fatal(err)
	}
	if err := watch(2 * serverDefault); err != nil {
		t.Errorf("watchers after the limit was raised: %v", err)
	}
	if err := raiseConsumerLimit(ctx, js, "KV_"+pcgroupsBucket, 5); err != nil {
		t.Errorf("a limit already above what is asked: %v, want it left as it is", err)
	}
	st, err := js.Stream(ctx, "KV_"+pcgroupsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.MaxConsumers; got != pcgroupsBucketConsumers {
		t.Errorf("the bucket's max_consumers %d, want %d", got, pcgroupsBucketConsumers)
	}
}
