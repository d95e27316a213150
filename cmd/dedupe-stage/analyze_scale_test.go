package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/history"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// TestAnalyzeScale measures analyze over a history of
// $DEDUPE_ANALYZE_MESSAGES messages (skipped when unset): it publishes
// them into a JetStream, 30 % of them repeats of one of the last million
// keys, then runs the binary's analyze on them and logs its seconds and
// peak RSS (bench/RESULTS.md). It is a measurement, not a check: it fails
// only when analyze fails or miscounts the messages.
func TestAnalyzeScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("DEDUPE_ANALYZE_MESSAGES"))
	if n <= 0 {
		t.Skip("set DEDUPE_ANALYZE_MESSAGES to measure analyze over that many messages")
	}
	srv := natstest.RunServer(t, "")
	url := srv.ClientURL()
	_, js := natstest.Connect(t, url)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(10, 10))
	newKeys := 0
	payload := make([]byte, 64)
	started := time.Now()
	err := natstest.Publish(ctx, js, n, func(int) *nats.Msg {
		k := newKeys
		if newKeys > 0 && r.IntN(10) < 3 {
			k = newKeys - 1 - r.IntN(min(newKeys, 1_000_000))
		} else {
			newKeys++
		}
		return &nats.Msg{Subject: "events.orders", Header: nats.Header{"Order-Id": {fmt.Sprintf("order-%012d", k)}}, Data: payload}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("published %d messages (%d keys) in %v", n, newKeys, time.Since(started).Round(time.Second))

	cmd := exec.Command(binary, "analyze", "--json", "-s", url, "--key-header", "Order-Id", "--temp-dir", t.TempDir())
	cmd.Stderr = os.Stderr
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	started = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var anon, file int64 // the largest RssAnon and RssFile sampled, in kB
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			a, f := rssKB(cmd.Process.Pid)
			anon, file = max(anon, a), max(file, f)
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	err = cmd.Wait()
	took := time.Since(started)
	close(done)
	<-sampled
	out := stdout.Bytes()
	if err != nil {
		t.Fatalf("analyze: %v", err)
	}
	var rep history.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Messages != uint64(n) || rep.Keys != uint64(newKeys) {
		t.Errorf("analyze read %d messages and %d keys, want %d and %d", rep.Messages, rep.Keys, n, newKeys)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	t.Logf("analyze: %d messages, %d keys, %d repeats in %.1f s (%.0f messages/s), peak RSS %.1f MiB (sampled every 100 ms: anonymous %.1f MiB, file-backed %.1f MiB), CPU %.1f s user + %.1f s system; %s",
		rep.Messages, rep.Keys, rep.Repeats, took.Seconds(), float64(n)/took.Seconds(), float64(ru.Maxrss)/1024, float64(anon)/1024, float64(file)/1024,
		time.Duration(ru.Utime.Nano()).Seconds(), time.Duration(ru.Stime.Nano()).Seconds(), rep.Recommendation)
}

// rssKB reads RssAnon and RssFile of process pid, in kB (0 when gone).
func rssKB(pid int) (anon, file int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch name {
		case "RssAnon":
			anon = n
		case "RssFile":
			file = n
		}
	}
	return anon, file
}
