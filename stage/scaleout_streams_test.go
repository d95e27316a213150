package stage_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/stage"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// TestScaleOutStreamsOnACluster creates the streams StreamsToCreate
// describes for scale-out on a 3-node cluster: each is R3, the input
// stream stores every message under the partition nats-server's hash of
// the key token gives (the stage's state.PartitionFNV), and the output
// allows atomic batches and keeps its records for the window and more.
func TestScaleOutStreamsOnACluster(t *testing.T) {
	cl := natstest.StartCluster(t, 3)
	_, js := cl.Connect()
	cfg := config.Default()
	cfg.NATS.URL = cl.URLs()
	cfg.Input.Subjects = []string{"orders.*.created"}
	cfg.Key.Field = keys.FieldSpec{Source: keys.SourceSubject, SubjectToken: 2}
	cfg.State.Partitions = 4
	cfg.ScaleOut.Enabled = true
	cfg.ScaleOut.Instance = "a"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	streams, err := stage.StreamsToCreate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range streams {
		st := cl.CreateStream(js, s.Config)
		if got := st.CachedInfo().Config.Replicas; got != 3 {
			t.Errorf("%s: %d replicas, want 3", s.Config.Name, got)
		}
	}
	out, err := js.Stream(ctx, cfg.Output.Stream)
	if err != nil {
		t.Fatal(err)
	}
	oc := out.CachedInfo().Config
	w, _ := cfg.Window.Derive()
	if !oc.AllowAtomicPublish || oc.Retention != jetstream.LimitsPolicy || oc.MaxAge < cfg.OutputRetention(w.W) || oc.MaxBytes > 0 || oc.MaxMsgs > 0 {
		t.Errorf("output stream %+v: want atomic publish, limits retention, max_age >= %v, no size or count limit", oc, cfg.OutputRetention(w.W))
	}

	var msgs []*nats.Msg
	for i := range 40 {
		msgs = append(msgs, &nats.Msg{Subject: fmt.Sprintf("orders.o-%d.created", i), Data: []byte("x")})
	}
	natstest.PublishAll(t, js, msgs)
	got := natstest.ReadAll(t, js, cfg.Input.Stream)
	if len(got) != len(msgs) {
		t.Fatalf("input holds %d messages, want %d", len(got), len(msgs))
	}
	// Async publishes to a cluster may be stored out of order (one
	// retried while the stream's leader settles), so each stored message
	// is matched by the key its subject carries.
	parts, seen := map[int]int{}, map[string]bool{}
	for _, m := range got {
		tok := strings.Split(m.Subject, ".")
		if len(tok) != 4 || tok[1] != "orders" || tok[3] != "created" || seen[tok[2]] {
			t.Errorf("stored on %s, want <partition>.orders.<key>.created, each key once", m.Subject)
			continue
		}
		key := tok[2]
		seen[key] = true
		p := state.PartitionFNV([]byte(key), 4)
		parts[p]++
		if want := fmt.Sprintf("%d.orders.%s.created", p, key); m.Subject != want {
			t.Errorf("stored on %s, want %s", m.Subject, want)
		}
	}
	for i := range 40 {
		if key := fmt.Sprintf("o-%d", i); !seen[key] {
			t.Errorf("key %s not stored", key)
		}
	}
	if len(parts) != 4 {
		t.Errorf("40 keys fell in partitions %v, want all 4 used (the test's keys should spread)", parts)
	}
}
