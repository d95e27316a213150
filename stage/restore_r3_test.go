package stage_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// TestReadBackOnAReplicatedOutput is TestReadBackAfterACrashBetweenPublishAndCommit
// on a 3-node cluster with R3 streams, the output allowing direct gets: a
// replica of the output is stopped while the forwards of the "crashed"
// run are stored, and the next start begins as soon as it is back, while
// it may still be catching up. The start reads back every forward after
// the watermark, up to the last one the stream's leader stores, whichever
// replica its reader sits on, and every key ends in the output once.
func TestReadBackOnAReplicatedOutput(t *testing.T) {
	cl := natstest.StartCluster(t, 3)
	e := newEnvOn(t, cl.Server(0))
	e.nc, e.js = cl.Connect()
	e.cfg.NATS.URL = cl.URLs()
	if err := e.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	streams, err := stage.StreamsToCreate(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range streams {
		s.Config.Replicas = 3
		if s.Config.Name == e.cfg.Output.Stream {
			s.Config.AllowDirect = true
		}
		cl.CreateStream(e.js, s.Config)
	}
	evs, unique := workload(15, 2000, 0.1)
	r, _ := e.startLogged()
	r.stop(t)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := e.js.Stream(ctx, e.cfg.Output.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info := out.CachedInfo()
	if info.Config.Replicas != 3 || info.Cluster == nil {
		t.Fatalf("output stream %+v: want 3 replicas on the cluster", info.Config)
	}
	follower := -1
	for i := range cl.Size() {
		if cl.Server(i).Name() != info.Cluster.Leader {
			follower = i
			break
		}
	}
	cl.Stop(follower)
	before := e.forwardsBefore(unique)
	cl.Restart(follower)

	r, logs := e.startLogged()
	if got := counter(t, r.reg, "dedupe_start_restored_records_total", nil); got != float64(len(before)) {
		t.Errorf("dedupe_start_restored_records_total = %v, want %d (the forwards after the watermark)", got, len(before))
	}
	all := natstest.ReadAll(t, e.js, e.cfg.Output.Stream)
	if l, want := logs.String(), fmt.Sprintf("to_seq=%d", all[len(all)-1].Seq); !strings.Contains(l, want) {
		t.Errorf("the read-back's log line does not say %s:\n%s", want, l)
	}
	e.publish(evs)
	e.drained(60 * time.Second)
	e.assertExactlyOnce(unique)
	if got := counter(t, r.reg, "dedupe_republish_duplicates_total", nil); got != 0 {
		t.Errorf("dedupe_republish_duplicates_total = %v, want 0: the keys read back are repeats", got)
	}
	if got := counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != float64(len(unique)-len(before)) {
		t.Errorf("%v keys judged new, want %d", got, len(unique)-len(before))
	}
	r.stop(t)
}
