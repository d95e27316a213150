package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/boot"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// Headers the harness puts on input events.
const (
	// headerKey carries the key when the key source is a header. It is not
	// Nats-Msg-Id, so the input stream does not dedupe on its own.
	headerKey = "Event-Id"
	// headerAge carries the event's intended age class.
	headerAge = "Bench-Age"
	// headerSent carries the wall-clock publish time (Unix ns) of a
	// latency-phase event.
	headerSent = "Bench-Sent"
)

// natsEnv is the compare mode's server: an in-process nats-server with
// JetStream, as dedupe-stage run embeds it.
type natsEnv struct {
	srv  *server.Server
	cfg  config.NATS
	quit func()
}

// startNATS starts the embedded default with its store in dir/nats, on a
// free loopback port.
func startNATS(dir string, syncAlways bool) (*natsEnv, error) {
	full := config.Default()
	full.NATS.Embedded.Port = -1
	full.NATS.Embedded.SyncAlways = syncAlways
	full.NATS.Embedded.StoreDir = filepath.Join(dir, "nats")
	srv, err := boot.StartEmbedded(full.EmbeddedServer(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, err
	}
	return &natsEnv{srv: srv, cfg: full.NATS, quit: func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	}}, nil
}

// connect opens a connection the way the stage does (in process to the
// embedded server). Its disconnect on Close is not logged.
func (e *natsEnv) connect() (*nats.Conn, error) {
	return boot.Connect(e.cfg.Dial(), e.srv, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// streamNames are the streams, subjects and group of one configuration of
// the compare mode, or of one group of the modes that run processes.
type streamNames struct {
	token                          string // lower case, for subjects
	input, output, dlq, routed     string // stream names
	inSubjects, outPrefix, dlqSubj string
	routedSubj, group              string
}

// namesOf names the streams prefix_IN_suffix and so on, the subjects by
// token and the group lower(prefix)+suffix.
func namesOf(prefix, suffix, token string) streamNames {
	return streamNames{token: token, input: prefix + "_IN_" + suffix, output: prefix + "_OUT_" + suffix, dlq: prefix + "_DLQ_" + suffix,
		routed: prefix + "_ROUTED_" + suffix, inSubjects: "in." + token + ".*", outPrefix: "out_" + token, dlqSubj: "dlq." + token,
		routedSubj: "routed." + token, group: strings.ToLower(prefix) + suffix}
}

// stageConfig returns the stage's configuration on nc for the streams n:
// the defaults with n's streams, --window (and refresh_on_repeat as
// refresh), the state's partitions and sync_writes, and the filter sized
// for expectedKeys (never below the default).
func (f *flags) stageConfig(nc config.NATS, n streamNames, refresh bool, expectedKeys int) config.Config {
	cfg := config.Default()
	yes := true
	cfg.NATS = nc
	cfg.NATS.CreateStreams = &yes
	cfg.Input.Stream, cfg.Input.Subjects = n.input, []string{n.inSubjects}
	cfg.Output.Stream, cfg.Output.SubjectPrefix = n.output, n.outPrefix
	cfg.DeadLetter.Stream, cfg.DeadLetter.Subject = n.dlq, n.dlqSubj
	setWindow(&cfg, f.window)
	cfg.Window.RefreshOnRepeat = refresh
	cfg.State.Partitions, cfg.State.SyncWrites = f.partitions, &f.syncWrites
	cfg.Filter.ExpectedKeys = max(cfg.Filter.ExpectedKeys, uint64(expectedKeys))
	return cfg
}

// namesFor names the streams of a configuration of the compare mode.
func namesFor(kind Kind) streamNames {
	t, _ := kind.info()
	return namesOf("BENCH", strings.ToUpper(t), t)
}

// deleteStreams deletes the streams that exist of names.
func deleteStreams(js jetstream.JetStream, names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range names {
		if err := js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			fmt.Fprintf(logOut, "warning: delete stream %s: %v\n", s, err)
		}
	}
}

// publisher publishes workload events to the input stream.
type publisher struct {
	js               jetstream.JetStream
	subject, keyMode string // keyMode: "header" or "json"
}

// publish publishes events of wl in order. With rate > 0 it paces them at
// rate events per second and stamps each with its wall-clock send time;
// otherwise it publishes as fast as the server acknowledges (4096 in
// flight). It returns when every publish is acknowledged, and fails if any
// was not: the workload must reach the stream whole and in order.
func (p *publisher) publish(ctx context.Context, wl *Workload, events []Event, rate float64, prog *progress) (time.Duration, error) {
	start := time.Now()
	return publishAll(ctx, p.js, len(events), func(i int) *nats.Msg {
		e := events[i]
		key := wl.Key(int(e.Key))
		m := &nats.Msg{Subject: p.subject, Header: nats.Header{headerAge: {e.Class.String()}}, Data: Payload(key, int(e.Key), wl.PayloadSize)}
		if p.keyMode == "header" {
			m.Header[headerKey] = []string{key}
		}
		if rate > 0 {
			pace(start, i, rate)
			m.Header[headerSent] = []string{strconv.FormatInt(time.Now().UnixNano(), 10)}
		}
		return m
	}, prog)
}

// waitDrained polls the consumer every `every` until it has acknowledged
// every message up to stream sequence last, calling onPoll with each
// answer. It fails after timeout.
func waitDrained(ctx context.Context, cons jetstream.Consumer, last uint64, every, timeout time.Duration, onPoll func(*jetstream.ConsumerInfo)) error {
	return waitUntil(ctx, timeout, every, fmt.Sprintf("consumer acknowledging up to sequence %d", last), nil, func() (bool, string) {
		ci, err := cons.Info(ctx)
		if err != nil {
			return false, err.Error()
		}
		if onPoll != nil {
			onPoll(ci)
		}
		return ci.AckFloor.Stream >= last && ci.NumAckPending == 0, fmt.Sprintf("ack floor %d, %d unacknowledged", ci.AckFloor.Stream, ci.NumAckPending)
	})
}

// waitUntil polls cond every interval until it holds, for at most
// timeout. It fails when an instance of insts exits (with the tail of its
// log), or when ctx ends or the timeout passes, naming what it waited for
// and the last reason cond gave for not holding yet.
func waitUntil(ctx context.Context, timeout, interval time.Duration, what string, insts []*instance, cond func() (bool, string)) error {
	last := "no answer"
	var failed error
	ok := natstest.Until(timeout, interval, func() bool {
		for _, in := range insts {
			if in.proc != nil && !in.proc.Running() {
				failed = fmt.Errorf("%s exited: %v\n%s", in.name, in.proc.Err(), in.proc.LogTail(3000))
				return true
			}
		}
		if err := ctx.Err(); err != nil {
			failed = fmt.Errorf("%s: %w (%s)", what, err, last)
			return true
		}
		done, why := cond()
		if why != "" {
			last = why
		}
		return done
	})
	switch {
	case failed != nil:
		return failed
	case !ok:
		return fmt.Errorf("%s: not within %v (%s)", what, timeout, last)
	}
	return nil
}

// progress prints one line to stderr every interval while a long phase
// works: what is done, how fast, and how long is left.
type progress struct {
	label     string
	total     uint64
	done      atomic.Uint64
	forwarded func() uint64 // optional
	start     time.Time
	end       func() // stops the lines; safe to call more than once
}

// logOut receives progress lines and warnings.
var logOut io.Writer = os.Stderr

func startProgress(label string, total uint64, every time.Duration, forwarded func() uint64) *progress {
	p := &progress{label: label, total: total, forwarded: forwarded, start: time.Now(), end: func() {}}
	if every <= 0 {
		return p
	}
	t, quit, done := time.NewTicker(every), make(chan struct{}), make(chan struct{})
	p.end = sync.OnceFunc(func() { close(quit); <-done; t.Stop() })
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				p.print()
			}
		}
	}()
	return p
}

func (p *progress) print() {
	done := p.done.Load()
	el := time.Since(p.start)
	rate := float64(done) / el.Seconds()
	left := "?"
	if rate > 0 && done <= p.total {
		left = time.Duration(float64(p.total-done) / rate * float64(time.Second)).Round(time.Second).String()
	}
	fwd := ""
	if p.forwarded != nil {
		fwd = fmt.Sprintf(", %d forwarded", p.forwarded())
	}
	fmt.Fprintf(logOut, "  %s: %d/%d%s, %.0f ev/s, %s elapsed, ~%s left\n", p.label, done, p.total, fwd, rate, el.Round(time.Second), left)
}

// pace sleeps until message i of a publish paced at rate messages a second
// from start is due.
func pace(start time.Time, i int, rate float64) {
	time.Sleep(time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))))
}

// publishAll publishes count messages, msg(i) for i in order, as fast as
// the server acknowledges them (natstest.Publish), counting them in prog,
// and returns how long it took.
func publishAll(ctx context.Context, js jetstream.JetStream, count int, msg func(i int) *nats.Msg, prog *progress) (time.Duration, error) {
	start := time.Now()
	err := natstest.Publish(ctx, js, count, msg, func(n int) { prog.done.Store(uint64(n)) })
	return time.Since(start), err
}
