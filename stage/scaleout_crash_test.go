package stage_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// TestScaleOutCrashSurvivorsKeepWhatTheyTake runs a group of three
// instances on 4 partitions, settled at 2/1/1, and kills a (no leave: its
// presence key stays until its TTL, 3 × ack_wait). The survivors take a's
// partitions once its pins expire (ack_wait) and settle at 2/2, releasing
// at most one partition between them: one taking both of a's owns 3 and
// gives one to the other. A survivor that still counted a while its key
// lived would be over its quota with what it took and release it; with
// every survivor doing so, the partition waited for their cooldown
// (docs/scale-out.md §10) with its input pending.
func TestScaleOutCrashSurvivorsKeepWhatTheyTake(t *testing.T) {
	e := newScaleOutEnv(t)
	ea, eb, ec := e.as("a"), e.as("b"), e.as("c")
	ea.nc, ea.js = natstest.Connect(t, e.srv.ClientURL())
	payload := map[string][]byte{}
	round := 0
	batch := func() { // keys on every partition: only partitions with traffic count as owned
		round++
		var ks []string
		for i := range 40 {
			k := fmt.Sprintf("r%d-%d", round, i)
			payload[k] = []byte(k)
			ks = append(ks, k)
		}
		e.publishKeys(ks, payload)
	}
	owned := func(rs ...*running) []float64 {
		var o []float64
		for _, r := range rs {
			o = append(o, gauge(t, r.reg, "dedupe_partitions_owned"))
		}
		return o
	}
	a := ea.start()
	batch()
	e.scaleOutDrained(60 * time.Second)
	b, c := eb.start(), ec.start()
	natstest.Poll(t, 90*time.Second, 200*time.Millisecond, "the group to settle at 2/1/1", func() (bool, error) {
		batch()
		o := owned(a, b, c)
		return fmt.Sprint(o) == "[2 1 1]", fmt.Errorf("a, b, c own %v", o)
	})
	released := func() float64 {
		return counter(t, b.reg, "dedupe_partition_releases_total", nil) + counter(t, c.reg, "dedupe_partition_releases_total", nil)
	}
	before := released()

	// The crash: a's connection drops, so it pulls and puts no more and
	// leaves nothing. The input keeps flowing while a's Run winds down
	// (kill, below): a partition is taken on its first delivery.
	ea.nc.Close()
	bucket, _, _ := layout.Presence(e.cfg.ScaleOut.Group, e.cfg.Input.AckWait.D())
	kv, err := e.js.KeyValue(context.Background(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Poll(t, 90*time.Second, 200*time.Millisecond, "a's presence to expire and b and c to own 2 each", func() (bool, error) {
		batch()
		_, err := kv.Get(context.Background(), "a")
		gone := errors.Is(err, jetstream.ErrKeyNotFound)
		o := owned(b, c)
		return gone && fmt.Sprint(o) == "[2 2]", fmt.Errorf("a's presence gone %v (%v); b, c own %v", gone, err, o)
	})
	a.kill(t, ea.nc)
	if got := released() - before; got > 1 {
		t.Errorf("b and c released %v partitions after a's crash, want at most 1 (one of 3 taken, for 2/2)", got)
	}
	e.scaleOutDrained(60 * time.Second)
	e.checkOnce(e.scaleOutOutput(), payload)
}
