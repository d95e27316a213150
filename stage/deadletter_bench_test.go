package stage_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// BenchmarkDeadLetterFlood measures how fast the stage dead-letters a
// backlog of b.N messages that carry no key, on a server that fsyncs every
// write (as the embedded default does): the rate at which a flood of bad
// input drains. It reports dead letters/s, with output.publish auto (here,
// an external server: asynchronous publishes) and atomic (atomic batches).
func BenchmarkDeadLetterFlood(b *testing.B) {
	for _, publish := range []string{config.PublishAuto, config.PublishAtomic} {
		b.Run("publish="+publish, func(b *testing.B) { deadLetterFlood(b, publish) })
	}
}

func deadLetterFlood(b *testing.B, publish string) {
	srv := natstest.RunServerWith(b, func(o *server.Options) { o.SyncAlways = true })
	_, js := natstest.Connect(b, srv.ClientURL())
	cfg := scaleOutBenchConfig(b, srv.ClientURL(), true)
	cfg.ScaleOut.Enabled = false
	cfg.Output.Publish = publish
	cfg.Key = keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceHeader, Header: "Event-Id"}, MaxLength: 256}
	createStreams(b, js, cfg)
	msgs := make([]*nats.Msg, b.N)
	for i := range msgs {
		msgs[i] = &nats.Msg{Subject: "orders.x", Data: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	natstest.PublishAll(b, js, msgs)

	b.ResetTimer()
	start := time.Now()
	in := startInstance(b, cfg, "a")
	ctx := context.Background()
	natstest.WaitFor(b, 5*time.Minute, "every message dead-lettered", func() bool {
		st, err := js.Stream(ctx, cfg.DeadLetter.Stream)
		return err == nil && st.CachedInfo().State.Msgs >= uint64(b.N)
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "deadletters/s")
	b.StopTimer()
	in.stop(b)
	if got := in.sum(b, "dedupe_dead_letters_total", map[string]string{"reason": "no_key"}); got != float64(b.N) {
		b.Fatalf("dedupe_dead_letters_total{reason=no_key} = %v, want %d", got, b.N)
	}
}
