package stage_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/boot"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// TestEmbeddedDefaultSyncsEveryWrite runs the default configuration (no
// nats.url: the embedded server), wired as `dedupe-stage run` wires it, and
// checks its durability: the embedded server's JetStream syncs every write
// before acknowledging it, and every Badger partition fsyncs each commit.
// Only the port (a free one), the data dir and the HTTP listener differ from
// the defaults.
func TestEmbeddedDefaultSyncsEveryWrite(t *testing.T) {
	cfg := config.Default()
	if cfg.NATS.URL != "" || !cfg.NATS.IsEmbedded() {
		t.Fatalf("the default config is not the embedded server: nats.url %q", cfg.NATS.URL)
	}
	cfg.NATS.Embedded.Port = -1
	cfg.State.DataDir = t.TempDir()
	cfg.HTTP.Addr = ""
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	srv, err := boot.StartEmbedded(cfg.EmbeddedServer(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	if jsc := srv.JetStreamConfig(); jsc == nil || !jsc.SyncAlways {
		t.Errorf("embedded JetStream config %+v: want SyncAlways (every write synced before it is acknowledged)", jsc)
	}
	nc, err := boot.Connect(cfg.NATS.Dial(), srv, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	st, err := stage.New(context.Background(), stage.Options{Config: cfg, Conn: nc, Registry: prometheus.NewRegistry(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- st.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := st.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	for i := range st.Store().Partitions() {
		if !st.Store().Partition(i).SyncWrites() {
			t.Errorf("partition %d: Badger opened without SyncWrites: commits are not fsynced", i)
		}
	}

	// And the path works: an event published twice is forwarded once.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		m := &nats.Msg{Subject: "events.embedded", Header: nats.Header{}, Data: []byte(`{"a":1}`)}
		m.Header.Set(jetstream.MsgIDHeader, "embedded-1")
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	natstest.WaitDrained(t, js, cfg.Input.Stream, cfg.Input.Consumer, 30*time.Second)
	out := natstest.ReadAll(t, js, cfg.Output.Stream)
	if len(out) != 1 || out[0].Header.Get(jetstream.MsgIDHeader) != "embedded-1" {
		t.Errorf("output %+v, want embedded-1 once", out)
	}
}
