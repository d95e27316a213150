package faults

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// TestNATSServerRestart stops the nats-server under a running stage while
// inputs are being published and forwarded, twice: a clean shutdown
// (SIGTERM) and a SIGKILL, each followed by a restart on the same port and
// store. The stage reconnects by itself and carries on; at the end every
// key is in the output exactly once and the dead letters are exactly the
// bad inputs.
func TestNATSServerRestart(t *testing.T) {
	t.Parallel()
	seed := testSeed(t)
	srv := startNATS(t)
	cfg := defaultStageConfig(t, srv.URL())
	js := publisherJS(t, srv.URL())
	s := newStage(t, cfg)
	w := newWorkload(seed, "restart", cfg.MaxMessageBytes)
	p := s.startReady()

	events := w.mix(12_000, 0.25, 0.01, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pubErr := make(chan error, 1)
	go func() {
		_, err := publish(ctx, js, events, "main", 1000, 120*time.Second)
		pubErr <- err
	}()

	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		base := streamMsgs(js, outputStream)
		natstest.WaitFor(t, 30*time.Second, "the stage to forward while the server is up", func() bool {
			return streamMsgs(js, outputStream) >= base+1000
		})
		srv.stop(sig)
		time.Sleep(1500 * time.Millisecond) // down for longer than AckWait
		if !p.Running() {
			t.Fatalf("the stage exited while the server was down: %v\n%s", p.Err(), crashReport(p.Log()))
		}
		srv.start()
		if !p.waitLog(`"msg":"nats reconnected"`, 30*time.Second) {
			t.Fatalf("restart %d: the stage did not say it reconnected", i+1)
		}
	}
	if err := <-pubErr; err != nil {
		t.Fatal(err)
	}
	waitDrained(t, js, 90*time.Second)
	if !p.Running() {
		t.Fatalf("the stage exited: %v", p.Err())
	}
	if code, body := s.get("/healthz"); code != 200 {
		t.Errorf("/healthz after the restarts: %d %s", code, body)
	}
	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)
	reconnects := strings.Count(p.Log(), `"msg":"nats reconnected"`)
	t.Logf("%d inputs, %d keys forwarded, %d dead letters; %d reconnects, %.0f publish retries, %.0f re-publishes dropped by the output window",
		len(events), len(w.forward), len(w.dead), reconnects, s.metric("dedupe_publish_retries_total"), s.metric("dedupe_republish_duplicates_total"))
}
