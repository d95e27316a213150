package faults

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// TestKillBetweenPublishAndCommitPastDuplicateWindow kills one instance
// (kill -9) while its forwards are in the output stream and their claims
// are not committed: the data dir's file system is full, so every commit
// fails and is retried, and the batches stay unacked. The next start comes
// only after the output stream's duplicate window has passed, so the
// stream no longer drops the redelivered copies by their Nats-Msg-Id. The
// stage must read its forwards back from the output at start and take the
// copies as repeats: every key ends in the output exactly once. A message
// another producer stored on the output stream under a subject that is not
// this pipeline's, with a Nats-Msg-Id equal to a key not yet seen, must
// not make that key a repeat.
func TestKillBetweenPublishAndCommitPastDuplicateWindow(t *testing.T) {
	t.Parallel()
	seed := testSeed(t)
	disk := smallDisk(t, "128m")
	srv := startNATSUnsynced(t)
	cfg := defaultStageConfig(t, srv.URL())
	cfg.DataDir = filepath.Join(disk, "data")
	cfg.AckWait = time.Second
	cfg.RestartMargin = time.Second
	cfg.DuplicateWindow = 4 * time.Second // covers ack_wait + restart_margin, and no restart that takes longer
	js := publisherJS(t, srv.URL())
	s := newStage(t, cfg)
	w := newWorkload(seed, "rb", cfg.MaxMessageBytes)

	p := s.startReady()
	mustPublish(t, js, w.mix(500, 0.2, 0, 0), "before")
	waitDrained(t, js, 60*time.Second)

	// Another producer's message on the output stream, outside the
	// pipeline's output subjects, carrying as its id a key that reaches the
	// input only at the end.
	foreign := w.fresh()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fm := &nats.Msg{Subject: "deduped.audit", Header: nats.Header{}, Data: []byte("another producer")}
	fm.Header.Set(jetstream.MsgIDHeader, foreign.key)
	if _, err := js.PublishMsg(ctx, fm); err != nil {
		t.Fatal(err)
	}

	filler := filepath.Join(disk, "filler")
	fillDisk(t, filler)
	base := streamMsgs(js, outputStream)
	events := w.mix(300, 0, 0, 0)
	mustPublish(t, js, events, "full")
	// Each partition's first batch is published, and its commit retried
	// while the batches behind it wait.
	if !p.waitLog(`"msg":"state commit failed, retrying; nothing is acked meanwhile"`, 30*time.Second) {
		t.Fatalf("no commit failed on the full disk\n%s", crashReport(p.Log()))
	}
	uncommitted := settledMsgs(js, outputStream) - base
	if uncommitted == 0 {
		t.Fatal("nothing forwarded while the disk is full")
	}
	p.kill(t)
	if n := consumerInfo(t, js).AckFloor.Stream; n >= acksOf(t, js) {
		t.Fatalf("every input acknowledged (ack floor %d) although no claim could be committed", n)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// On purpose: the restart must take longer than the output's
	// duplicate window, so that only the stage's own state can recognise
	// the redelivered copies.
	time.Sleep(cfg.DuplicateWindow + 2*time.Second)

	p = s.startReady()
	waitDrained(t, js, 60*time.Second)
	mustPublish(t, js, []event{foreign}, "last")
	waitDrained(t, js, 60*time.Second)

	got := map[string]int{}
	for _, m := range natstest.ReadAll(t, js, outputStream) {
		if m.Subject == fm.Subject {
			continue
		}
		got[m.Header.Get(jetstream.MsgIDHeader)]++
	}
	lost, doubled := 0, 0
	for k := range w.forward {
		switch n := got[k]; {
		case n == 0:
			if lost++; lost <= 5 {
				t.Errorf("key %s lost: not in the output", k)
			}
		case n > 1:
			if doubled++; doubled <= 5 {
				t.Errorf("key %s forwarded %d times", k, n)
			}
		}
	}
	if lost+doubled > 0 || len(got) != len(w.forward) {
		t.Errorf("output: %d keys lost, %d doubled, %d keys held, want %d", lost, doubled, len(got), len(w.forward))
	}
	restored := s.metric("dedupe_start_restored_records_total")
	if restored != float64(uncommitted) {
		t.Errorf("dedupe_start_restored_records_total = %v, want the %d forwards left uncommitted", restored, uncommitted)
	}
	if !strings.Contains(p.Log(), logReadBack) {
		t.Error("the log does not say the output was read back")
	}
	t.Logf("%d forwards left uncommitted, %d restored at start; %d keys forwarded once", uncommitted, int(restored), len(got))
}

// acksOf returns the input stream's last sequence: every input is
// acknowledged when the consumer's ack floor reaches it.
func acksOf(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, inputStream)
	if err != nil {
		t.Fatal(err)
	}
	return st.CachedInfo().State.LastSeq
}

// logReadBack is the log line of a start that restored its partitions
// from the output after their cursors.
const logReadBack = `"msg":"restored the partitions from the output stream after their cursors"`

// restoredIn returns how many forwards the starts of runs read back from
// the output and stored (their log's records_stored).
func restoredIn(runs []*process) int {
	n := 0
	for _, r := range runs {
		for line := range strings.SplitSeq(r.Log(), "\n") {
			if !strings.Contains(line, logReadBack) {
				continue
			}
			var l struct {
				Restored int `json:"records_stored"`
			}
			if json.Unmarshal([]byte(line), &l) == nil {
				n += l.Restored
			}
		}
	}
	return n
}
