package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/boot"
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

// natsEnv is the server the harness runs against and how to reach it.
type natsEnv struct {
	srv  *server.Server // the in-process server; nil with --nats-url
	cfg  config.NATS
	log  *slog.Logger
	quit func()
}

// startNATS starts the embedded default (an in-process nats-server with
// JetStream in dir, on a free loopback port) or points at url.
func startNATS(url, dir string, syncAlways bool, log *slog.Logger) (*natsEnv, error) {
	cfg := config.Default().NATS
	if url != "" {
		cfg.URL = url
		return &natsEnv{cfg: cfg, log: log, quit: func() {}}, nil
	}
	cfg.Embedded.Port = -1
	cfg.Embedded.SyncAlways = syncAlways
	cfg.Embedded.StoreDir = dir
	full := config.Default()
	full.NATS = cfg
	srv, err := boot.StartEmbedded(full, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, err
	}
	return &natsEnv{srv: srv, cfg: cfg, log: log, quit: func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	}}, nil
}

// connect opens a connection the way the stage does (in process to the
// embedded server). Its disconnect on Close is not logged.
func (e *natsEnv) connect() (*nats.Conn, error) {
	return boot.Connect(e.cfg, e.srv, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// embedded reports whether the server runs in this process.
func (e *natsEnv) embedded() bool { return e.srv != nil }

// streamNames are the streams and subjects of one configuration.
type streamNames struct {
	token                         string // lower case, for subjects
	input, output, dlq            string // stream names
	inSubject, outPrefix, dlqSubj string
}

func namesFor(kind Kind) streamNames {
	t := kind.token()
	u := upper(t)
	return streamNames{
		token:     t,
		input:     "BENCH_IN_" + u,
		output:    "BENCH_OUT_" + u,
		dlq:       "BENCH_DLQ_" + u,
		inSubject: "in." + t + ".orders",
		outPrefix: "out_" + t,
		dlqSubj:   "dlq." + t,
	}
}

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// deleteStreams removes the streams of n that exist.
func deleteStreams(ctx context.Context, js jetstream.JetStream, n streamNames) {
	for _, s := range []string{n.input, n.output, n.dlq} {
		if err := js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			fmt.Fprintf(logOut, "warning: delete stream %s: %v\n", s, err)
		}
	}
}

// publisher publishes workload events to the input stream.
type publisher struct {
	js      jetstream.JetStream
	subject string
	keyMode string // "header" or "json"
}

func newPublisher(nc *nats.Conn, subject, keyMode string) (*publisher, error) {
	p := &publisher{subject: subject, keyMode: keyMode}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		return nil, err
	}
	p.js = js
	return p, nil
}

// msg builds the input message of event e of wl.
func (p *publisher) msg(wl *Workload, e Event, payloadSize int) *nats.Msg {
	key := wl.Key(int(e.Key))
	m := &nats.Msg{Subject: p.subject, Header: nats.Header{}, Data: Payload(key, int(e.Key), payloadSize)}
	if p.keyMode == "header" {
		m.Header[headerKey] = []string{key}
	}
	m.Header[headerAge] = []string{e.Class.String()}
	return m
}

// publish publishes events of wl in order. With rate > 0 it paces them at
// rate events per second and stamps each with its wall-clock send time;
// otherwise it publishes as fast as the server acknowledges (4096 in
// flight). It returns when every publish is acknowledged, and fails if any
// was not: the workload must reach the stream whole and in order.
func (p *publisher) publish(ctx context.Context, wl *Workload, events []Event, rate float64, prog *progress) (time.Duration, error) {
	start := time.Now()
	return publishAll(ctx, p.js, len(events), func(i int) *nats.Msg {
		m := p.msg(wl, events[i], wl.PayloadSize)
		if rate > 0 {
			due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
			m.Header[headerSent] = []string{strconv.FormatInt(time.Now().UnixNano(), 10)}
		}
		return m
	}, prog)
}

// waitDrained polls the consumer every `every` until it has acknowledged
// every message up to stream sequence last, calling onPoll with each
// answer. It fails after timeout.
func waitDrained(ctx context.Context, cons jetstream.Consumer, last uint64, every, timeout time.Duration, onPoll func(*jetstream.ConsumerInfo)) error {
	return pollDrained(ctx, every, timeout, func() (bool, string, error) {
		ci, err := cons.Info(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		if onPoll != nil {
			onPoll(ci)
		}
		return ci.AckFloor.Stream >= last && ci.NumAckPending == 0, "<nil>", nil
	}, func(answer string) error {
		return fmt.Errorf("consumer did not acknowledge up to sequence %d within %v (last answer: %s)", last, timeout, answer)
	})
}

// pollDrained calls check every `every` until it reports the input drained
// or fails; after timeout it returns late of check's last word. It is the
// drain wait of both modes.
func pollDrained(ctx context.Context, every, timeout time.Duration, check func() (done bool, last string, err error), late func(last string) error) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		done, last, err := check()
		if err != nil || done {
			return err
		}
		if time.Now().After(deadline) {
			return late(last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// consumerConfig is the durable pull consumer the stage would create with
// the default configuration.
func consumerConfig(cfg config.Input) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait.D(),
		MaxAckPending: cfg.MaxAckPending,
		MaxDeliver:    cfg.MaxDeliver,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// progress prints one line to stderr every interval while a long phase
// works: what is done, how fast, and how long is left.
type progress struct {
	label     string
	total     uint64
	done      atomic.Uint64
	forwarded func() uint64 // optional
	start     time.Time
	stop      chan struct{}
	wg        sync.WaitGroup
}

// logOut receives progress lines and warnings.
var logOut io.Writer = os.Stderr

func startProgress(label string, total uint64, every time.Duration, forwarded func() uint64) *progress {
	p := &progress{label: label, total: total, forwarded: forwarded, start: time.Now(), stop: make(chan struct{})}
	if every <= 0 {
		return p
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
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

func (p *progress) end() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.wg.Wait()
}
