package stage_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/stage"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// logBuffer collects a stage's logs; safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startLogged is env.start with the stage's logs kept.
func (e *env) startLogged() (*running, *logBuffer) {
	e.t.Helper()
	logs := &logBuffer{}
	return e.startWith(slog.New(slog.NewTextHandler(logs, nil))), logs
}

// TestAtomicOutputForwardsEachKeyOnce runs the stage with output.publish
// atomic on the output stream it creates (which allows atomic publish) and
// batches split at output.batch_max: every key is forwarded once with its
// payload and headers, no batch is refused.
func TestAtomicOutputForwardsEachKeyOnce(t *testing.T) {
	e := newEnv(t)
	e.cfg.Output.Publish = config.PublishAtomic
	e.cfg.Output.BatchMax = 50 // batches of up to 256 split into several atomic batches
	e.cfg.Output.MaxBatchesInFlight = 2
	_, logs := e.startLogged()
	st, err := e.js.Stream(context.Background(), e.cfg.Output.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if !st.CachedInfo().Config.AllowAtomicPublish {
		t.Error("the output stream the stage created does not allow atomic publish")
	}
	evs, unique := workload(12, 4000, 0.2)
	e.publish(evs)
	e.drained(60 * time.Second)
	e.assertExactlyOnce(unique)
	l := logs.String()
	if !strings.Contains(l, "output published as atomic batches") {
		t.Errorf("the stage did not say it publishes atomic batches:\n%s", l)
	}
	if strings.Contains(l, "output refused an atomic batch") {
		t.Errorf("a batch of new keys was refused:\n%s", l)
	}
}

// forwardsBefore publishes to the output stream a forward of every tenth
// key of unique, as a run that crashed after publishing them and before
// committing their claims leaves it, and returns them.
func (e *env) forwardsBefore(unique map[string][]byte) []*nats.Msg {
	e.t.Helper()
	var before []*nats.Msg
	n := 0
	for k, payload := range unique {
		if n++; n%10 != 0 {
			continue
		}
		m := &nats.Msg{Subject: e.cfg.Output.Subject("events.orders"), Header: nats.Header{}, Data: payload}
		m.Header.Set(jetstream.MsgIDHeader, k)
		m.Header.Set("Event-Id", k)
		m.Header.Set("Trace", "t-"+k)
		before = append(before, m)
	}
	natstest.PublishAll(e.t, e.js, before)
	return before
}

// TestAtomicOutputAfterACrashBetweenPublishAndCommit stores some keys in
// the output stream after the stage's start restored its partitions, as
// an atomic batch of a killed run that the server stores only after the
// next start has read the output leaves it. With atomic publish, the
// batches holding them are refused whole (an id in the duplicate window),
// published one message at a time, and every key ends in the output once:
// the re-published ones dropped by the window, the others stored.
func TestAtomicOutputAfterACrashBetweenPublishAndCommit(t *testing.T) {
	e := newEnv(t)
	e.cfg.Output.Publish = config.PublishAtomic
	evs, unique := workload(13, 2000, 0.1)
	r, logs := e.startLogged()
	before := e.forwardsBefore(unique)
	e.publish(evs)
	e.drained(60 * time.Second)
	e.assertExactlyOnce(unique)
	if got := counter(t, r.reg, "dedupe_republish_duplicates_total", nil); got != float64(len(before)) {
		t.Errorf("dedupe_republish_duplicates_total = %v, want %d (the keys stored before the run)", got, len(before))
	}
	if l := logs.String(); !strings.Contains(l, "output refused an atomic batch") || !strings.Contains(l, "err_code=10201") {
		t.Errorf("no batch was refused for an id in the duplicate window:\n%s", l)
	}
}

// TestReadBackAfterACrashBetweenPublishAndCommit stores some keys in the
// output stream after a run that stopped, as a run that crashed after
// publishing them and before committing their claims leaves it. The next
// start restores them after its partitions' cursors: their copies are
// repeats, none is published again, and every key ends in the output once,
// whatever the output's duplicate window still holds. A start after that
// reads nothing more.
func TestReadBackAfterACrashBetweenPublishAndCommit(t *testing.T) {
	for _, publish := range []string{config.PublishAsync, config.PublishAtomic} {
		t.Run(publish, func(t *testing.T) {
			e := newEnv(t)
			e.cfg.Output.Publish = publish
			evs, unique := workload(14, 2000, 0.1)
			r, _ := e.startLogged()
			r.stop(t)
			before := e.forwardsBefore(unique)

			r, logs := e.startLogged()
			if got := counter(t, r.reg, "dedupe_start_restored_records_total", nil); got != float64(len(before)) {
				t.Errorf("dedupe_start_restored_records_total = %v, want %d (the forwards after the watermark)", got, len(before))
			}
			want := natstest.ReadAll(t, e.js, e.cfg.Output.Stream)[0].Seq // before[0]'s forward
			if in, err := r.st.Inspect(context.Background(), before[0].Header.Get(jetstream.MsgIDHeader)); err != nil || in.OutputSeq == nil || *in.OutputSeq != want {
				t.Errorf("inspect of the first key read back = %+v, %v; want output_seq %d, its forward's", in, err, want)
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
			if l := logs.String(); strings.Contains(l, "output refused an atomic batch") {
				t.Errorf("a batch was refused:\n%s", l)
			}
			r.stop(t)

			r, logs = e.startLogged()
			if got := counter(t, r.reg, "dedupe_start_restored_records_total", nil); got != 0 {
				t.Errorf("after a clean stop, dedupe_start_restored_records_total = %v, want 0", got)
			}
			if l := logs.String(); !strings.Contains(l, "restored the partitions from the output stream after their cursors") {
				t.Errorf("the start does not say it read the output back:\n%s", l)
			}
			r.stop(t)
		})
	}
}

// TestAtomicOutputOnAStreamWithoutAtomicPublish: with output.publish
// atomic, a stage whose output stream does not allow atomic publish refuses
// to start, naming the field and the stream; with auto it starts and
// publishes one message at a time.
func TestAtomicOutputOnAStreamWithoutAtomicPublish(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: e.cfg.Output.Stream, Subjects: e.cfg.OutputStreamSubjects(),
		Duplicates: e.cfg.OutputDuplicateWindow()}); err != nil {
		t.Fatal(err)
	}
	e.cfg.Output.Publish = config.PublishAtomic
	_, err := stage.New(ctx, stage.Options{Config: e.cfg, Conn: e.nc, Registry: prometheus.NewRegistry()})
	if !errors.Is(err, config.ErrAtomicNotAllowed) || !strings.Contains(err.Error(), "output.publish") || !strings.Contains(err.Error(), e.cfg.Output.Stream) {
		t.Fatalf("stage.New with atomic on a stream without atomic publish: %v, want ErrAtomicNotAllowed naming output.publish and the stream", err)
	}

	e.cfg.Output.Publish = config.PublishAuto
	_, logs := e.startLogged()
	evs, unique := workload(14, 500, 0.2)
	e.publish(evs)
	e.drained(60 * time.Second)
	e.assertExactlyOnce(unique)
	if l := logs.String(); !strings.Contains(l, "output published one message at a time") || strings.Contains(l, "output refused an atomic batch") {
		t.Errorf("auto on a stream without atomic publish:\n%s", l)
	}
}

// TestRestoreKeepsAForget: a data dir wiped after an operator forgot a
// key is restored from the output, the forget's tombstone included, with
// the stage's clock a minute behind the server's: the forgotten key's
// next copy is forwarded, as the forget promised, and the other key's copy
// is a repeat.
func TestRestoreKeepsAForget(t *testing.T) {
	e := newEnv(t)
	e.clock = window.NewManualClock(time.Now().Add(-time.Minute))
	r := e.start()
	e.publish([]event{{key: "k1", payload: []byte("one")}, {key: "k2", payload: []byte("two")}})
	e.drained(30 * time.Second)
	if f, err := r.st.Forget(context.Background(), "k1"); err != nil || !f.Held {
		t.Fatalf("Forget(k1) = %+v, %v; want it held", f, err)
	}
	r.stop(t)
	if err := os.RemoveAll(e.cfg.State.DataDir); err != nil {
		t.Fatal(err)
	}

	r = e.start()
	if got := counter(t, r.reg, "dedupe_start_restored_records_total", nil); got != 2 {
		t.Errorf("dedupe_start_restored_records_total = %v, want 2: k1 (forgotten) and k2", got)
	}
	e.publish([]event{{key: "k1", payload: []byte("one")}, {key: "k2", payload: []byte("two")}})
	e.drained(30 * time.Second)
	n := 0
	for id := range e.outputByKey() {
		if strings.HasPrefix(id, "k1.forgotten.") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("k1 forwarded %d times after its forget, want 1", n)
	}
	if got := len(e.outputByKey()["k2"]); got != 1 {
		t.Errorf("k2 forwarded %d times, want once: the restore kept it", got)
	}
}
