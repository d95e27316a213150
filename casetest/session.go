package casetest

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
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
	"github.com/dedupe-stage/dedupe-stage/stage"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// JudgeTimeout bounds how long a session waits for the stage to judge one
// message.
const JudgeTimeout = 20 * time.Second

// Limits a session sizes its stage with: they change how much memory and
// disk the stage takes, never a verdict.
const (
	sessionExpectedKeys = 10_000   // filter.expected_keys, at most: the filter only spares store reads
	sessionMemoryBudget = 64 << 20 // state.memory_budget, at most
)

// noneStream is a stream the input and output streams source from, only
// so that the server gives them no duplicate window of their own. A
// duplicate window runs on the servers' clock, on which a case's messages
// come milliseconds apart whatever their case times: the input's would
// drop a copy with the same Nats-Msg-Id that its case sends hours after
// the first (the stage judges every copy instead), and the output's a
// forward of a key whose window ended hours before by the case's clock
// (the stage would give it a Dedupe-After id, as it does when it judges a
// backlog). With none, both behave as when the case's times are real.
const noneStream = "DEDUPE_TEST_NONE"

// Outcome is what the stage did with one message.
type Outcome struct {
	// Verdict is what happened.
	Verdict Verdict
	// Subject, MsgID and Headers are the forward's (Forwarded).
	Subject string
	MsgID   string
	Headers nats.Header
	// Forwards counts the forwards of the message (1 when Forwarded).
	Forwards int
	// Reason and Detail are the dead letter's (DeadLetter).
	Reason, Detail string
	// Partition is the partition that judged it; -1 when it was
	// dead-lettered before it reached one.
	Partition int
}

// session is one stage, fresh, on an in-process nats-server that listens
// on no port, with its JetStream store and the stage's data dir in a
// temporary directory removed at close.
type session struct {
	cfg    config.Config
	dir    string
	srv    *server.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	st     *stage.Stage
	reg    *prometheus.Registry
	clock  *window.ManualClock
	start  time.Time
	cancel context.CancelFunc
	done   chan error

	input            jetstream.Consumer
	lastOut, lastDL  uint64
	counts           map[[2]string]float64 // dedupe_messages_total by (partition, outcome), as last read
	unpartitionedDLs float64
}

// Isolate returns cfg as a session runs it: on an in-process server
// (nats.url, nats.context and the credentials left out, streams created),
// its state in dataDir without fsync, no HTTP server, one instance
// (scale_out off), an output stream without a duplicate window
// (noneStream), no PostgreSQL totals sink, and the filter and memory
// budget sized for a few messages. Nothing of it reaches outside the
// process; the key, window, version, totals and pipeline settings are
// the configuration's.
func Isolate(cfg config.Config, dataDir string) config.Config {
	yes, no := true, false
	n := config.Default().NATS
	n.CreateStreams = &yes
	n.Embedded.SyncAlways = cfg.NATS.Embedded.SyncAlways
	cfg.NATS = n
	cfg.State.DataDir = dataDir
	cfg.State.SyncWrites = &no
	cfg.State.MemoryBudget = min(cfg.State.MemoryBudget, sessionMemoryBudget)
	cfg.Filter.ExpectedKeys = min(cfg.Filter.ExpectedKeys, sessionExpectedKeys)
	cfg.HTTP.Addr, cfg.HTTP.InspectAddr = "", ""
	cfg.ScaleOut.Enabled = false
	cfg.Output.AllowShortDuplicateWindow = true // the output stream has no duplicate window (noneStream)
	cfg.Totals.Sinks.Postgres = config.Default().Totals.Sinks.Postgres
	cfg.Log.Level = "error"
	return cfg
}

// open starts a session for cfg (as Isolate makes it, in a new
// temporary directory) whose offset 0 is start.
func open(ctx context.Context, cfg config.Config, start time.Time) (_ *session, err error) {
	s := &session{start: start, clock: window.NewManualClock(start), reg: prometheus.NewRegistry(), counts: map[[2]string]float64{}}
	if s.dir, err = os.MkdirTemp("", "dedupe-stage-test-"); err != nil {
		return nil, fmt.Errorf("temporary directory: %w", err)
	}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	s.cfg = Isolate(cfg, filepath.Join(s.dir, "data"))
	if err := s.cfg.Validate(); err != nil {
		return nil, fmt.Errorf("the configuration as a test runs it: %w", err)
	}
	s.srv, err = server.NewServer(&server.Options{ServerName: "dedupe-stage-test", DontListen: true, JetStream: true,
		StoreDir: filepath.Join(s.dir, "nats"), NoLog: true, NoSigs: true})
	if err != nil {
		return nil, fmt.Errorf("in-process nats-server: %w", err)
	}
	s.srv.Start()
	if !s.srv.ReadyForConnections(10 * time.Second) {
		return nil, errors.New("in-process nats-server: not ready within 10s")
	}
	if s.nc, err = nats.Connect("", nats.InProcessServer(s.srv), nats.Name("dedupe-stage test")); err != nil {
		return nil, fmt.Errorf("connect in process: %w", err)
	}
	if s.js, err = jetstream.New(s.nc); err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if err := s.createStreams(ctx); err != nil {
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s.st, err = stage.New(ctx, stage.Options{Config: s.cfg, Conn: s.nc, Registry: s.reg, Logger: log, Clock: s.clock,
		InputTime: func(jetstream.Msg, time.Time) time.Time { return s.clock.Now() }})
	if err != nil {
		return nil, fmt.Errorf("start the stage: %w", err)
	}
	if s.input, err = s.js.Consumer(ctx, s.cfg.Input.Stream, s.cfg.Input.Consumer); err != nil {
		return nil, fmt.Errorf("input consumer: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan error, 1)
	go func() { s.done <- s.st.Run(runCtx) }()
	return s, nil
}

// createStreams creates the input and output streams as the stage would
// (their subjects and limits), but without a duplicate window
// (noneStream). The stage creates the dead-letter stream.
func (s *session) createStreams(ctx context.Context) error {
	if _, err := s.js.CreateStream(ctx, jetstream.StreamConfig{Name: noneStream, Subjects: []string{"_dedupe_test.none"},
		Storage: jetstream.MemoryStorage}); err != nil {
		return fmt.Errorf("create stream %s: %w", noneStream, err)
	}
	streams, err := stage.StreamsToCreate(s.cfg)
	if err != nil {
		return err
	}
	for _, w := range streams {
		if w.Field != "input" && w.Field != "output" {
			continue
		}
		sc := w.Config
		sc.Duplicates = 0
		sc.Sources = []*jetstream.StreamSource{{Name: noneStream}}
		if _, err := s.js.CreateStream(ctx, sc); err != nil {
			return fmt.Errorf("create the %s stream %s: %w", w.Field, sc.Name, err)
		}
	}
	return nil
}

// judge publishes msg at its case time, waits until the stage has acked
// it, and reads what it did.
func (s *session) judge(ctx context.Context, msg Message) (Outcome, error) {
	s.clock.Set(s.start.Add(msg.At))
	m := &nats.Msg{Subject: msg.Subject, Header: nats.Header{}, Data: msg.Payload}
	for k, v := range msg.Headers {
		m.Header.Set(k, v)
	}
	ack, err := s.js.PublishMsg(ctx, m)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
			return Outcome{}, fmt.Errorf("subject %q is not in the input stream's subjects %v (input.subjects)", msg.Subject, s.cfg.Input.Subjects)
		}
		return Outcome{}, fmt.Errorf("publish to the input stream: %w", err)
	}
	if ack.Stream != s.cfg.Input.Stream {
		return Outcome{}, fmt.Errorf("subject %q is stored by stream %s, not the input stream %s", msg.Subject, ack.Stream, s.cfg.Input.Stream)
	}
	if err := s.waitAcked(ctx, ack.Sequence); err != nil {
		return Outcome{}, err
	}
	return s.read(ctx)
}

// waitAcked waits until the input consumer's ack floor reaches seq.
func (s *session) waitAcked(ctx context.Context, seq uint64) error {
	deadline := time.Now().Add(JudgeTimeout)
	for {
		info, err := s.input.Info(ctx)
		if err == nil && info.AckFloor.Stream >= seq {
			return nil
		}
		if time.Now().After(deadline) {
			why := "input.filter_subject may leave its subject out"
			if err != nil {
				why = err.Error()
			}
			return fmt.Errorf("the stage did not judge the message within %v (%s)", JudgeTimeout, why)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// read returns what the stage did with the message it acked last: its
// forwards on the output stream, its dead letter, or else the outcome
// dedupe_messages_total counted.
func (s *session) read(ctx context.Context) (Outcome, error) {
	o := Outcome{Partition: -1}
	fwds, err := s.newMessages(ctx, s.cfg.Output.Stream, &s.lastOut, s.cfg.Output.SubjectPrefix+".")
	if err != nil {
		return o, err
	}
	dls, err := s.newMessages(ctx, s.cfg.DeadLetter.Stream, &s.lastDL, s.cfg.DeadLetter.Subject+".")
	if err != nil {
		return o, err
	}
	partition, outcome, unpartitioned, err := s.counted()
	if err != nil {
		return o, err
	}
	if partition != "" {
		o.Partition, _ = strconv.Atoi(partition)
	}
	switch {
	case len(fwds) > 0:
		f := fwds[0]
		o.Verdict, o.Subject, o.MsgID, o.Headers, o.Forwards = Forwarded, f.Subject, f.Header.Get(jetstream.MsgIDHeader), f.Header, len(fwds)
	case len(dls) > 0:
		d := dls[0]
		o.Verdict, o.Reason, o.Detail = DeadLetter, d.Header.Get(deadletter.HeaderReason), d.Header.Get(deadletter.HeaderDetail)
	case outcome == "repeat" || outcome == "stale" || outcome == "dropped":
		o.Verdict = Verdict(outcome)
	default:
		return o, fmt.Errorf("the stage acked the message but neither forwarded it, dead-lettered it nor counted it (outcome %q, unpartitioned dead letters %v)", outcome, unpartitioned)
	}
	return o, nil
}

// newMessages returns the messages stream stored after *last on subjects
// under prefix, and moves *last to its last sequence.
func (s *session) newMessages(ctx context.Context, name string, last *uint64, prefix string) ([]*jetstream.RawStreamMsg, error) {
	st, err := s.js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := *last + 1; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("stream %s, message %d: %w", name, seq, err)
		}
		if strings.HasPrefix(m.Subject, prefix) {
			out = append(out, m)
		}
	}
	*last = max(*last, info.State.LastSeq)
	return out, nil
}

// counted returns the partition and outcome dedupe_messages_total counted
// since the last call ("" when none), and how many dead letters were
// counted before a partition.
func (s *session) counted() (partition, outcome string, unpartitioned float64, err error) {
	families, err := s.reg.Gather()
	if err != nil {
		return "", "", 0, fmt.Errorf("read the stage's metrics: %w", err)
	}
	for _, f := range families {
		switch f.GetName() {
		case "dedupe_messages_total":
			for _, m := range f.GetMetric() {
				var k [2]string
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "partition":
						k[0] = l.GetValue()
					case "outcome":
						k[1] = l.GetValue()
					}
				}
				if v := m.GetCounter().GetValue(); v > s.counts[k] {
					partition, outcome = k[0], k[1]
					s.counts[k] = v
				}
			}
		case "dedupe_unpartitioned_dead_letters_total":
			for _, m := range f.GetMetric() {
				v := m.GetCounter().GetValue()
				unpartitioned = v - s.unpartitionedDLs
				s.unpartitionedDLs = v
			}
		}
	}
	return partition, outcome, unpartitioned, nil
}

// close stops the stage, the connection and the server, and removes the
// temporary directory.
func (s *session) close() {
	if s.cancel != nil {
		s.cancel()
		select {
		case <-s.done:
		case <-time.After(60 * time.Second):
		}
	}
	if s.st != nil {
		_ = s.st.Close()
	}
	if s.nc != nil {
		s.nc.Close()
	}
	if s.srv != nil {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}
