package faults

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Sizes of the lost-writes tests: inputs (a tenth repeats) judged before
// the copy of the servers' stores is taken, inputs judged after it (which
// the servers then lose), and messages another writer stores in the output after the
// loss, at sequences the lost forwards had.
const (
	lostBefore  = 1_000
	lostAfter   = 1_500
	lostForeign = 10
)

// lostCase is what the lost-writes tests vary: one instance on one server,
// or a group on a cluster. servers stops every server with sig, runs
// between while they are down (a copy of their stores, or putting one
// back) and starts them again; drained waits until every input published
// was judged.
type lostCase struct {
	stages  []*stage
	js      jetstream.JetStream
	wl      *workload
	stores  []string // each server's JetStream store directory
	servers func(sig syscall.Signal, between func())
	drained func()
}

// stopStages stops every stage cleanly.
func (c *lostCase) stopStages(t *testing.T) {
	t.Helper()
	for _, s := range c.stages {
		s.last().signal(t, syscall.SIGTERM, 30*time.Second)
	}
}

// startStages starts every stage and waits until each is ready.
func (c *lostCase) startStages() {
	for _, s := range c.stages {
		s.startReady()
	}
}

// run has lostBefore inputs judged, stops the stages and the servers,
// copies the servers' stores, starts them all again and has lostAfter more
// judged; then stops the stages, SIGKILLs the servers and puts the copies
// back (a server that loses the writes it acknowledged since its last
// sync, on a power failure), has foreign messages stored in the output
// (with foreign), starts everything again and publishes a copy of every
// key forwarded after the copy and of some before it. The output then
// holds every key once: the stages found their stores ahead of the output,
// said so, and forwarded again the keys the output had lost, whose number
// run returns.
func (c *lostCase) run(t *testing.T, foreign bool) (lost int) {
	t.Helper()
	mustPublish(t, c.js, c.wl.mix(lostBefore, 0.1, 0, 0), "before")
	c.drained()
	before := len(c.wl.keys)

	c.stopStages(t)
	saved := make([]string, len(c.stores))
	c.servers(syscall.SIGTERM, func() {
		for i, dir := range c.stores {
			saved[i] = t.TempDir()
			if err := os.CopyFS(saved[i], os.DirFS(dir)); err != nil {
				t.Fatalf("copy the store %s: %v", dir, err)
			}
		}
	})
	c.startStages()
	mustPublish(t, c.js, c.wl.mix(lostAfter, 0.1, 0, 0), "after")
	c.drained()
	lostKeys := c.wl.keys[before:]

	c.stopStages(t)
	c.servers(syscall.SIGKILL, func() {
		for i, dir := range c.stores {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.CopyFS(dir, os.DirFS(saved[i])); err != nil {
				t.Fatalf("put back the store %s: %v", dir, err)
			}
		}
	})
	want := map[string][]byte{}
	if foreign {
		// Another writer stores messages at sequences the lost forwards
		// had: the stage must not take them for its own.
		for i := range lostForeign {
			id := fmt.Sprintf("foreign-%d", i)
			m := &nats.Msg{Subject: "deduped.events.foreign", Header: nats.Header{jetstream.MsgIDHeader: []string{id}}, Data: []byte(id)}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := c.js.PublishMsg(ctx, m)
			cancel()
			if err != nil {
				t.Fatalf("publish foreign output message %s: %v", id, err)
			}
			want[id] = m.Data
		}
	}
	c.startStages()
	var copies []event
	for _, k := range lostKeys {
		copies = append(copies, c.wl.copyOf(k))
	}
	for _, k := range c.wl.keys[:200] {
		copies = append(copies, c.wl.copyOf(k))
	}
	mustPublish(t, c.js, copies, "copies")
	c.drained()

	var ahead, dropped, news float64
	said := 0
	for _, s := range c.stages {
		ahead += s.metric("dedupe_store_ahead_of_output_total")
		dropped += s.metric("dedupe_store_ahead_dropped_records_total")
		news += s.metric("dedupe_messages_total", "outcome", "new")
		if strings.Contains(s.last().Log(), "the store is ahead of the output stream") {
			said++
		}
	}
	t.Logf("after the loss: %d partitions found ahead, %d records dropped, %d keys judged new, of %d keys lost", int(ahead), int(dropped), int(news), len(lostKeys))
	if ahead == 0 || said == 0 {
		t.Errorf("no stage said its store was ahead of the output (dedupe_store_ahead_of_output_total %v, %d logs)", ahead, said)
	}
	if int(news) != len(lostKeys) {
		t.Errorf("the stages judged %v copies new after the loss, want the %d keys the output lost (and the earlier keys' copies repeats)", news, len(lostKeys))
	}
	for k, d := range c.wl.forward {
		want[k] = d
	}
	checkOutput(t, c.js, want)
	checkDeadLetters(t, c.js, c.wl.dead)
	return len(lostKeys)
}

// TestLostWritesOneInstance has the nats-server of one instance lose
// the writes it acknowledged after a copy of its store (as a server that
// syncs lazily does on a power failure), and another writer store
// messages in the output at some of the lost sequences: at start the
// stage finds every partition's store ahead of the output, drops the
// keys whose forwards the output lost, and forwards their copies again.
func TestLostWritesOneInstance(t *testing.T) {
	t.Parallel()
	srv := startNATSUnsynced(t)
	cfg := defaultStageConfig(t, srv.URL())
	s := newStage(t, cfg)
	s.startReady()
	js := publisherJS(t, srv.URL())
	c := &lostCase{
		stages: []*stage{s}, js: js, wl: newWorkload(5301, "lost1", cfg.MaxMessageBytes),
		stores:  []string{srv.storeDir},
		drained: func() { waitDrained(t, js, 60*time.Second) },
		servers: func(sig syscall.Signal, between func()) {
			srv.stop(sig)
			between()
			srv.start()
		},
	}
	lost := c.run(t, true)
	// Every partition forwarded keys after the copy, and each drops them.
	if a, d := s.metric("dedupe_store_ahead_of_output_total"), s.metric("dedupe_store_ahead_dropped_records_total"); int(a) != cfg.Partitions || int(d) != lost {
		t.Errorf("dedupe_store_ahead_of_output_total %v, dedupe_store_ahead_dropped_records_total %v; want %d partitions, %d records", a, d, cfg.Partitions, lost)
	}
	if !strings.Contains(s.last().Log(), `"output_rewritten":true`) {
		t.Errorf("no partition found the output rewritten at a sequence of a lost forward")
	}
}

// TestLostWritesGroup is TestLostWritesOneInstance for a group of two on a
// 3-node cluster whose every node loses the same writes: each partition's
// new owner finds its store ahead at its takeover.
func TestLostWritesGroup(t *testing.T) {
	t.Parallel()
	cl := startNATSClusterWith(t, 3, false)
	wl := newWorkload(5302, "lostg", 4096)
	stages, js := scaleOutGroupAt(t, cl.URLs(), 2, wl, func(*stageConfig) {})
	parts := stages[0].cfg.Partitions
	var stores []string
	for _, n := range cl.Nodes {
		stores = append(stores, n.StoreDir())
	}
	c := &lostCase{
		stages: stages, js: js, wl: wl, stores: stores,
		drained: func() { scaleOutDrained(t, js, parts, takeoverWait) },
		servers: func(sig syscall.Signal, between func()) {
			for i := range cl.Nodes {
				cl.stop(i, sig)
			}
			between()
			var wg sync.WaitGroup
			errs := make([]error, len(cl.Nodes))
			for i, n := range cl.Nodes {
				wg.Go(func() { errs[i] = n.Start(context.Background(), 60*time.Second) })
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			waitQuorum(t, js, parts, 60*time.Second)
		},
	}
	c.run(t, false)
}
