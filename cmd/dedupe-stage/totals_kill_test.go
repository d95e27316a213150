package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
	"github.com/dedupe-stage/dedupe-stage/sink"
)

// TestSIGKILLTotalsEqualGroundTruth runs the binary with totals kept in a
// JetStream KV bucket, kills it with SIGKILL while events (with repeats) are
// being counted and flushed, restarts it on the same data dir, and checks
// that every total ends equal to the number of distinct keys of its group
// and bucket, and that no total the bucket ever held went down.
func TestSIGKILLTotalsEqualGroundTruth(t *testing.T) {
	const (
		events  = 20_000
		groups  = 5
		buckets = 3 // minutes back from now
		kvName  = "totals_kill"
	)
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: kvName})
	if err != nil {
		t.Fatal(err)
	}

	// Every value every total takes, in order, from before the first run.
	var mu sync.Mutex
	history := map[string][]int64{}
	watcher, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Stop()
	go func() {
		for e := range watcher.Updates() {
			if e == nil {
				continue // the end of the initial values
			}
			v, err := strconv.ParseInt(string(e.Value()), 10, 64)
			mu.Lock()
			if err != nil {
				v = -1 // not a number: reported below
			}
			history[e.Key()] = append(history[e.Key()], v)
			mu.Unlock()
		}
	}()

	// The events: key k-i (every fifth event repeats an earlier key), each
	// key with one group and one event time, minutes apart.
	now := time.Now().Truncate(time.Minute)
	truth := map[string]int64{}
	var msgs []*nats.Msg
	var keys []int
	for i := range events {
		k := len(keys)
		if i%5 == 4 && len(keys) > 0 {
			k = keys[(i*7919)%len(keys)]
		} else {
			keys = append(keys, k)
			total := sink.Total{Group: fmt.Sprintf("g%d", k%groups), Bucket: now.Add(-time.Duration(k%buckets) * time.Minute)}
			truth[total.ID()]++
		}
		msgs = append(msgs, &nats.Msg{Subject: "events.totals", Header: nats.Header{
			"Event-Id": {fmt.Sprintf("k-%d", k)},
			"Group":    {fmt.Sprintf("g%d", k%groups)},
			"Ts":       {strconv.FormatInt(now.Add(-time.Duration(k%buckets)*time.Minute).Unix(), 10)},
		}, Data: []byte(fmt.Sprintf("payload-%d", k))})
	}

	dataDir := t.TempDir()
	addr := proctest.Addr(t)
	cfg := stageConfig(srv.ClientURL(), dataDir, addr) + fmt.Sprintf(`totals:
  enabled: true
  group: {source: header, header: Group}
  time: {source: header, header: Ts}
  bucket: 1m
  flush_interval: 100ms
  sinks:
    kv: {bucket: %s}
`, kvName)

	p := startStageWith(t, cfg, addr)
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		natstest.PublishAll(t, js, msgs)
	}()
	natstest.WaitFor(t, 60*time.Second, "totals flushed mid-run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		var sum int64
		for _, h := range history {
			sum += h[len(h)-1]
		}
		return sum > int64(len(keys))/5
	})
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Exited()
	<-pubDone
	mu.Lock()
	var atKill int64
	for _, h := range history {
		atKill += h[len(h)-1]
	}
	mu.Unlock()

	startStageWith(t, cfg, addr)
	drained(t, js, 90*time.Second)
	natstest.WaitFor(t, 30*time.Second, "every total flushed", func() bool {
		for id, want := range truth {
			e, err := kv.Get(ctx, id)
			if err != nil || string(e.Value()) != strconv.FormatInt(want, 10) {
				return false
			}
		}
		return true
	})

	// The bucket holds exactly the truth, and every total only ever grew.
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for id := range lister.Keys() {
		n++
		if _, ok := truth[id]; !ok {
			t.Errorf("the bucket holds a total %s that no event made", id)
		}
	}
	if n != len(truth) {
		t.Errorf("the bucket holds %d totals, want %d", n, len(truth))
	}
	mu.Lock()
	defer mu.Unlock()
	updates := 0
	for id, h := range history {
		updates += len(h)
		for i := range h {
			if h[i] < 0 || h[i] > truth[id] || i > 0 && h[i] < h[i-1] {
				t.Errorf("total %s took the values %v: want them growing to at most the truth %d", id, h, truth[id])
				break
			}
		}
	}
	t.Logf("%d distinct keys in %d totals; %d counted in the bucket at the kill; %d updates watched; stale writes skipped after the restart: %v",
		len(keys), len(truth), atKill, updates, scrape(t, addr, "dedupe_sink_writes_total", `result="stale"`))
}
