package faults

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/netfault"
)

// The slow link of TestSlowNetwork: each way, every chunk delayed by
// 200 ms +- 100 ms (order kept, as TCP keeps it) and at most 256 KiB/s.
const (
	slowLatency   = 200 * time.Millisecond
	slowJitter    = 100 * time.Millisecond
	slowBandwidth = 256 << 10
)

// TestSlowNetwork runs one instance through a slow link to its nats-server
// for a whole run (slowLatency +- slowJitter each way, slowBandwidth), and
// SIGKILLs it twice, at a third and at two thirds of the output: every key
// is in the output once and every bad input dead-lettered once. It logs the
// throughput: the keys the first run forwarded per second, and the inputs
// judged per second from the publish to the input drained (which the
// kills' ack_wait dominates). DEDUPE_FAULTS_NET_CLEAN=1 runs the same with the
// proxy and no delay or limit, for the comparison in docs/faults.md.
func TestSlowNetwork(t *testing.T) {
	t.Parallel()
	c := newClock(t)
	clean := os.Getenv("DEDUPE_FAULTS_NET_CLEAN") == "1"
	srv := startNATSUnsynced(t)
	px := netfault.Start(t, strings.TrimPrefix(srv.URL(), "nats://"))
	if !clean {
		px.SetLatency(slowLatency, slowJitter)
		px.SetBandwidth(slowBandwidth)
	}
	cfg := defaultStageConfig(t, px.URL())
	cfg.AckWait = 5 * time.Second // a few round trips of the slow link
	js := publisherJS(t, srv.URL())
	s := newStage(t, cfg)
	w := newWorkload(testSeed(t), "slow", cfg.MaxMessageBytes)
	events := w.mix(4000, 0.25, 0.02, 0)
	p := s.startReady() // it creates the streams
	c.logf("the stage is ready through a link of latency %v +- %v, %d KiB/s each way (clean %v)", slowLatency, slowJitter, slowBandwidth>>10, clean)
	start := time.Now()
	mustPublish(t, js, events, "main")
	c.logf("%d inputs published", len(events))
	want := uint64(len(w.forward))
	var rate float64 // keys forwarded per second by the first run
	for range 2 {
		base := streamMsgs(js, outputStream)
		outputGrows(t, js, (want-base)/3, "the stage through the slow link")
		if rate == 0 {
			rate = float64(streamMsgs(js, outputStream)) / time.Since(start).Seconds()
		}
		c.logf("SIGKILL run %d", len(s.runs))
		p.kill(t)
		p = s.startReady()
		c.logf("run %d ready", len(s.runs))
	}
	waitDrained(t, js, 120*time.Second)
	ran := time.Since(start)
	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)
	if !p.Running() {
		t.Errorf("the stage exited: %v", p.Err())
	}
	st := px.Stats()
	c.logf("clean %v: the first run forwarded %.0f keys/s; all %d inputs judged in %v over %d runs (%.0f inputs/s, each kill's batches back after ack_wait); %v bytes through the proxy, %d connections",
		clean, rate, len(events), ran.Round(time.Millisecond), len(s.runs), float64(len(events))/ran.Seconds(), st.Bytes, st.Accepted)
}
