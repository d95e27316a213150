package status_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/status"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/keys"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// scaleOutConfig is a group of 4 partitions on srvURL keyed by the second
// token of orders.<key>, running as instance.
func scaleOutConfig(t *testing.T, srvURL, instance string) config.Config {
	t.Helper()
	cfg := config.Default()
	yes := true
	cfg.NATS.URL = srvURL
	cfg.NATS.CreateStreams = &yes
	cfg.State.DataDir = t.TempDir()
	cfg.State.Partitions = 4
	no := false
	cfg.State.SyncWrites = &no
	cfg.State.MemoryBudget = 64 << 20
	cfg.Filter.ExpectedKeys = 100_000
	cfg.HTTP.Addr = ""
	cfg.Input.Subjects = []string{"orders.*"}
	cfg.Key = keys.KeyConfig{Field: keys.FieldSpec{Source: keys.SourceSubject, SubjectToken: 2}, MaxLength: 256}
	cfg.Input.AckWait = config.Duration(2 * time.Second)
	// A hand-over time of about 3s (ack_wait + restart_margin), so that
	// input waiting without an owner is stalled soon.
	cfg.Output.RestartMargin = config.Duration(time.Second)
	cfg.ScaleOut.Enabled = true
	cfg.ScaleOut.Replicas = 1
	cfg.ScaleOut.Instance = instance
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// runStage runs a stage of cfg until the returned stop is called (or the
// test ends).
func runStage(t *testing.T, nc *nats.Conn, cfg config.Config) (stop func()) {
	t.Helper()
	st, err := stage.New(context.Background(), stage.Options{Config: cfg, Conn: nc, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatalf("stage.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- st.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("Run did not return 60s after stop")
		}
		if err := st.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// TestStatusOfAGroup runs instance a of a group, which takes every
// partition once input flows: status lists every partition with a as its
// owner, its fence, an empty backlog, and the snapshot age where the
// snapshot bucket holds one. Before any instance ran and after a clean
// stop (which unpins) no partition has an owner, and with nothing waiting
// each is idle and Check passes. Input published then waits, and once it
// has waited longer than the hand-over time Check names every partition.
func TestStatusOfAGroup(t *testing.T) {
	srv := natstest.RunServer(t, "")
	nc, js := natstest.Connect(t, srv.ClientURL())
	cfg := scaleOutConfig(t, srv.ClientURL(), "a")
	ctx := context.Background()

	before, err := status.Read(ctx, js, stage.StatusTarget(cfg), time.Now())
	if err != nil {
		t.Fatalf("Read before any instance ran: %v", err)
	}
	if err := before.Check(); err != nil || before.Health != status.HealthOK {
		t.Fatalf("Check before any instance ran, with no input: %v (health %s), want nil", err, before.Health)
	}
	for _, p := range before.Partitions {
		if p.State != status.StateIdle {
			t.Errorf("partition %d before any instance ran, with no input: %s, want idle", p.Partition, p.State)
		}
	}
	if !strings.Contains(before.GroupProblem, "not created yet") {
		t.Errorf("group problem before any instance ran: %q, want not created yet", before.GroupProblem)
	}

	stop := runStage(t, nc, cfg)
	var msgs []*nats.Msg
	for i := range 200 {
		msgs = append(msgs, &nats.Msg{Subject: fmt.Sprintf("orders.k%d", i), Data: []byte("x")})
	}
	natstest.PublishAll(t, js, msgs)
	// One snapshot, of partition 0, in the bucket the stage writes them
	// to (which it may have created already).
	obs, err := js.ObjectStore(ctx, layout.SnapshotBucket(cfg.ScaleOut.Group))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		obs, err = js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: layout.SnapshotBucket(cfg.ScaleOut.Group)})
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			obs, err = js.ObjectStore(ctx, layout.SnapshotBucket(cfg.ScaleOut.Group))
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(ctx, layout.SnapshotObject(0), []byte("snapshot")); err != nil {
		t.Fatal(err)
	}

	var r status.Report
	natstest.Poll(t, 60*time.Second, 200*time.Millisecond, "every partition owned by a, fenced and drained", func() (bool, error) {
		var err error
		if r, err = status.Read(ctx, js, stage.StatusTarget(cfg), time.Now()); err != nil {
			return false, err
		}
		for _, p := range r.Partitions {
			if p.State != status.StateOwned || p.Owner != "a" || !p.OwnerConfirmed || p.FenceSeq == 0 || p.Consumer.Pending != 0 || p.Consumer.AckPending != 0 {
				return false, nil
			}
		}
		return len(r.Partitions) == 4 && len(r.Instances) == 1, nil
	})
	if err := r.Check(); err != nil {
		t.Errorf("Check with every partition owned: %v", err)
	}
	if r.GroupProblem != "" {
		t.Errorf("group problem with the group running: %q", r.GroupProblem)
	}
	other := cfg
	other.State.Partitions = 8
	if mis, err := status.Read(ctx, js, stage.StatusTarget(other), time.Now()); err != nil || !strings.Contains(mis.GroupProblem, "has 4 partitions, the configuration 8") {
		t.Errorf("Read with 8 partitions configured: %q, %v", mis.GroupProblem, err)
	} else if err := mis.Check(); !errors.Is(err, status.ErrGroupMismatch) || mis.Health != status.HealthUnknown {
		t.Errorf("Check with 8 partitions configured: %v (health %s), want ErrGroupMismatch", err, mis.Health)
	}
	if len(r.Instances) != 1 || r.Instances[0] != "a" {
		t.Errorf("live instances %v, want [a]", r.Instances)
	}
	for _, p := range r.Partitions {
		if h := p.LastHandOver; h == nil || h.Instance != "a" || h.Fence == 0 || h.Path == "" || h.RestoreSeconds < 0 || h.At.IsZero() {
			t.Errorf("partition %d: last hand-over %+v, want the takeover a recorded", p.Partition, h)
		}
	}
	if r.Partitions[0].SnapshotAge == nil || r.Partitions[1].SnapshotAge != nil {
		t.Errorf("snapshot ages %v, %v: want partition 0's only", r.Partitions[0].SnapshotAge, r.Partitions[1].SnapshotAge)
	}

	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("status:\n%s", table.String())
	for p := range 4 {
		// partition, owned by a, pinned ..., pending 0, ack pending 0, a fence sequence.
		line := regexp.MustCompile(fmt.Sprintf(`(?m)^%d +owned +a +\S+ ago +0 +0 +[1-9]\d* .* a \S+ ago: \d+ records \(\w+\) in `, p))
		if !line.MatchString(table.String()) {
			t.Errorf("no line for partition %d owned by a in the table", p)
		}
	}

	var js1 bytes.Buffer
	if err := r.WriteJSON(&js1); err != nil {
		t.Fatal(err)
	}
	var decoded struct {
		Mode       string `json:"mode"`
		Partitions []struct {
			Partition   int    `json:"partition"`
			Owner       string `json:"owner"`
			FenceSeq    uint64 `json:"fence_seq"`
			SnapshotAge string `json:"snapshot_age"`
		} `json:"partitions"`
		Ownerless []int  `json:"ownerless"`
		Stalled   []int  `json:"stalled"`
		Health    string `json:"health"`
	}
	if err := json.Unmarshal(js1.Bytes(), &decoded); err != nil {
		t.Fatalf("JSON: %v\n%s", err, js1.String())
	}
	if decoded.Mode != "scale-out" || len(decoded.Partitions) != 4 || len(decoded.Ownerless) != 0 || decoded.Stalled == nil || len(decoded.Stalled) != 0 || decoded.Health != "ok" {
		t.Fatalf("JSON: %s", js1.String())
	}
	for i, p := range decoded.Partitions {
		if p.Partition != i || p.Owner != "a" || p.FenceSeq == 0 {
			t.Errorf("JSON partition %d: %+v", i, p)
		}
	}
	if _, err := time.ParseDuration(decoded.Partitions[0].SnapshotAge); err != nil {
		t.Errorf("JSON snapshot_age %q: %v", decoded.Partitions[0].SnapshotAge, err)
	}

	stop()
	natstest.Poll(t, 30*time.Second, 200*time.Millisecond, "every partition without an owner", func() (bool, error) {
		var err error
		r, err = status.Read(ctx, js, stage.StatusTarget(cfg), time.Now())
		return err == nil && len(r.Ownerless) == 4, err
	})
	for _, p := range r.Partitions {
		if p.State != status.StateIdle || p.LastOwner != "a" || p.Waiting != nil {
			t.Errorf("partition %d with a stopped and nothing pending: %s, last owner %q, waiting %+v; want idle, last owner a", p.Partition, p.State, p.LastOwner, p.Waiting)
		}
	}
	if err := r.Check(); err != nil {
		t.Errorf("Check with a stopped and nothing pending: %v, want nil", err)
	}
	table.Reset()
	_ = r.WriteTable(&table)
	if n := strings.Count(table.String(), " idle  "); n != 4 || !strings.Contains(table.String(), "0 owned, 4 idle, 0 waiting, 0 stalled") {
		t.Errorf("%d partitions shown idle, want 4:\n%s", n, table.String())
	}

	// Input with no instance running: it waits, within the hand-over
	// time at first, then longer.
	msgs = msgs[:0]
	for i := range 40 {
		msgs = append(msgs, &nats.Msg{Subject: fmt.Sprintf("orders.late%d", i), Data: []byte("x")})
	}
	published := time.Now()
	natstest.PublishAll(t, js, msgs)
	natstest.Poll(t, 30*time.Second, 200*time.Millisecond, "every partition's input waiting", func() (bool, error) {
		var err error
		if r, err = status.Read(ctx, js, stage.StatusTarget(cfg), time.Now()); err != nil {
			return false, err
		}
		for _, p := range r.Partitions {
			if p.Waiting == nil {
				return false, nil
			}
		}
		return true, nil
	})
	for _, p := range r.Partitions {
		w := p.Waiting
		if w.Since.Before(published.Add(-time.Second)) || time.Duration(w.HandOverTime) != status.HandOverTime(stage.StatusTarget(cfg), p.LastHandOver) {
			t.Errorf("partition %d: waiting %+v, want since the publish at %v with hand-over time %v", p.Partition, *w, published, status.HandOverTime(stage.StatusTarget(cfg), p.LastHandOver))
		}
		if (p.State == status.StateStalled) != (w.For > w.HandOverTime) {
			t.Errorf("partition %d: %s after waiting %v of %v", p.Partition, p.State, w.For, w.HandOverTime)
		}
	}
	if err := r.Check(); (err != nil) != (len(r.Stalled) > 0) {
		t.Errorf("Check with %v stalled: %v", r.Stalled, err)
	}
	natstest.Poll(t, 30*time.Second, 200*time.Millisecond, "every partition stalled", func() (bool, error) {
		var err error
		r, err = status.Read(ctx, js, stage.StatusTarget(cfg), time.Now())
		return err == nil && len(r.Stalled) == 4, err
	})
	err = r.Check()
	if !errors.Is(err, status.ErrStalled) || r.Health != status.HealthCritical {
		t.Fatalf("Check with input waiting and a stopped: %v (health %s), want ErrStalled", err, r.Health)
	}
	for p := range 4 {
		if !regexp.MustCompile(fmt.Sprintf(`\b%d \(waiting [\d.]+s, hand-over time [\d.]+s\)`, p)).MatchString(err.Error()) {
			t.Errorf("Check does not name partition %d with its wait: %v", p, err)
		}
	}
	table.Reset()
	_ = r.WriteTable(&table)
	t.Logf("status with input stalled:\n%s", table.String())
	if n := strings.Count(table.String(), "STALLED: waiting "); n != 4 {
		t.Errorf("%d partitions shown stalled, want 4:\n%s", n, table.String())
	}
}

// TestStatusOfASingleInstance reads a single instance's consumer: its
// pending messages, and that it does not exist before the stage ran.
func TestStatusOfASingleInstance(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	cfg := config.Default()
	cfg.NATS.URL = srv.ClientURL()
	ctx := context.Background()

	r, err := status.Read(ctx, js, stage.StatusTarget(cfg), time.Now())
	if err != nil {
		t.Fatalf("Read without streams: %v", err)
	}
	if r.Mode != "single" || r.Single == nil || r.Single.Exists || r.Check() != nil {
		t.Fatalf("Read without streams: %+v", r)
	}

	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Input.Stream, Subjects: cfg.Input.Subjects}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, cfg.Input.Stream, jetstream.ConsumerConfig{Durable: cfg.Input.Consumer, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	var msgs []*nats.Msg
	for i := range 5 {
		msgs = append(msgs, &nats.Msg{Subject: fmt.Sprintf("events.k%d", i), Data: []byte("x")})
	}
	natstest.PublishAll(t, js, msgs)
	// The server counts a consumer's pending messages after it has
	// stored them, on a goroutine of its own: an acked publish can be
	// read as pending a moment later.
	natstest.Poll(t, 10*time.Second, 20*time.Millisecond, "the consumer to count 5 pending", func() (bool, error) {
		var err error
		r, err = status.Read(ctx, js, stage.StatusTarget(cfg), time.Now())
		return err == nil && r.Single.Exists && r.Single.Pending == 5, err
	})
	if r.Single.AckPending != 0 {
		t.Errorf("consumer %+v, want 0 ack pending", *r.Single)
	}
	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`^single instance, consumer dedupe-stage on EVENTS: 5 pending, 0 ack pending; not pulling now: input waiting [\d.]+m?s with no consumer activity \(within hand-over time 1m10s\)\n$`)
	if !want.MatchString(table.String()) || r.State != status.StateWaiting || r.Check() != nil {
		t.Errorf("table %q (state %s, check %v), want %s", table.String(), r.State, r.Check(), want)
	}

	// Later than the hand-over time (input.ack_wait 10s + output.restart_margin
	// 1m), with nobody pulling: critical, saying how long.
	late := time.Now().Add(5 * time.Minute)
	if r, err = status.Read(ctx, js, stage.StatusTarget(cfg), late); err != nil {
		t.Fatal(err)
	}
	err = r.Check()
	if !errors.Is(err, status.ErrStalled) || r.Health != status.HealthCritical || r.State != status.StateStalled ||
		!regexp.MustCompile(`^the input of consumer dedupe-stage on EVENTS has waited 5m[01]s with no consumer activity, longer than the hand-over time 1m10s: the stage is not running`).MatchString(err.Error()) {
		t.Errorf("five minutes later, nobody pulling: state %s, health %s, check %v; want stalled", r.State, r.Health, err)
	}

	// A client that takes the input and keeps pulling, as the stage does
	// while it runs: running, OK however late.
	c, err := js.Consumer(ctx, cfg.Input.Stream, cfg.Input.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	it, err := c.Messages()
	if err != nil {
		t.Fatal(err)
	}
	defer it.Stop()
	for range 5 {
		m, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	natstest.Poll(t, 10*time.Second, 20*time.Millisecond, "status to see a client pulling", func() (bool, error) {
		r, err = status.Read(ctx, js, stage.StatusTarget(cfg), late)
		return err == nil && r.State == status.StateOwned && r.Check() == nil && r.Health == status.HealthOK, fmt.Errorf("state %s, check %v, %v", r.State, r.Check(), err)
	})
	table.Reset()
	_ = r.WriteTable(&table)
	if !strings.Contains(table.String(), "; running (pulling from its consumer)") {
		t.Errorf("table %q does not say it runs", table.String())
	}

	// Stopped, with everything acked: idle, OK however late.
	it.Stop()
	natstest.Poll(t, 30*time.Second, 50*time.Millisecond, "status to see the drained consumer idle", func() (bool, error) {
		r, err = status.Read(ctx, js, stage.StatusTarget(cfg), late.Add(time.Hour))
		return err == nil && r.State == status.StateIdle && r.Check() == nil, fmt.Errorf("state %s, check %v, %v", r.State, r.Check(), err)
	})
}

// TestStatusOfASingleInstanceNeverRun judges the input of a stage that
// never ran (no consumer yet) by its messages' age: waiting, then
// stalled past the hand-over time.
func TestStatusOfASingleInstanceNeverRun(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	cfg := config.Default()
	cfg.NATS.URL = srv.ClientURL()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Input.Stream, Subjects: cfg.Input.Subjects}); err != nil {
		t.Fatal(err)
	}
	r, err := status.Read(ctx, js, stage.StatusTarget(cfg), time.Now().Add(time.Hour))
	if err != nil || r.State != status.StateIdle || r.Check() != nil {
		t.Fatalf("an empty input without a consumer: state %s, check %v, %v; want idle", r.State, r.Check(), err)
	}
	natstest.PublishAll(t, js, []*nats.Msg{{Subject: "events.a", Data: []byte("x")}})
	if r, err = status.Read(ctx, js, stage.StatusTarget(cfg), time.Now()); err != nil || r.State != status.StateWaiting || r.Check() != nil {
		t.Errorf("a message just stored, no consumer: state %s, check %v, %v; want waiting", r.State, r.Check(), err)
	}
	if r, err = status.Read(ctx, js, stage.StatusTarget(cfg), time.Now().Add(time.Hour)); err != nil || r.State != status.StateStalled || !errors.Is(r.Check(), status.ErrStalled) {
		t.Errorf("a message an hour old, no consumer: state %s, check %v, %v; want stalled", r.State, r.Check(), err)
	}
}
