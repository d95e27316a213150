package stage_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type syncBuffer struct {
	mu  chan struct{}
	buf bytes.Buffer
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{mu: make(chan struct{}, 1)} }

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.String()
}

func TestCreatedStreamsHaveLimits(t *testing.T) {
	e := newEnv(t)
	e.cfg.Output.Limits.MaxBytes = 64 * config.MiB
	e.cfg.DeadLetter.Limits.MaxAge = config.Duration(30 * 24 * time.Hour)
	logs := newSyncBuffer()
	st, err := stage.New(context.Background(), stage.Options{Config: e.cfg, Conn: e.nc,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })

	want, err := stage.StreamsToCreate(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := e.cfg.Window.Derive()
	week := 7 * 24 * time.Hour
	cases := []struct {
		stream   string
		maxAge   time.Duration
		maxBytes int64
		discard  jetstream.DiscardPolicy
		dup      time.Duration
	}{
		// The default W (1h10m) is far below a week: the week wins.
		{e.cfg.Input.Stream, week, -1, jetstream.DiscardNew, 2 * time.Minute},
		{e.cfg.Output.Stream, week, 64 << 20, jetstream.DiscardOld, e.cfg.OutputDuplicateWindow()},
		{e.cfg.DeadLetter.Stream, 30 * 24 * time.Hour, -1, jetstream.DiscardOld, 2 * time.Minute},
	}
	if w.W*2 > week {
		t.Fatalf("test assumes the default W (%v) is under half a week", w.W)
	}
	for i, c := range cases {
		s, err := e.js.Stream(context.Background(), c.stream)
		if err != nil {
			t.Fatal(err)
		}
		got := s.CachedInfo().Config
		if got.MaxAge != c.maxAge || got.MaxBytes != c.maxBytes || got.Discard != c.discard || got.Duplicates != c.dup {
			t.Errorf("%s created with max_age %v, max_bytes %d, discard %v, duplicates %v; want %v, %d, %v, %v",
				c.stream, got.MaxAge, got.MaxBytes, got.Discard, got.Duplicates, c.maxAge, c.maxBytes, c.discard, c.dup)
		}
		// What check-config prints is what was created.
		if want[i].Config.Name != c.stream || want[i].Config.MaxAge != got.MaxAge || want[i].Config.MaxBytes != got.MaxBytes {
			t.Errorf("StreamsToCreate[%d] = %+v, but %s was created with max_age %v, max_bytes %d",
				i, want[i].Config, c.stream, got.MaxAge, got.MaxBytes)
		}
	}
	// The log says what the server applied: the input's duplicate window
	// was not asked for, the server's 2m default applies.
	var inputLine string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `msg="stream created"`) && strings.Contains(l, "stream="+e.cfg.Input.Stream+" ") {
			inputLine = l
		}
	}
	if !strings.Contains(inputLine, "duplicate_window=2m0s") || !strings.Contains(inputLine, "max_age=168h0m0s") {
		t.Errorf("input stream's creation log %q does not say duplicate_window=2m0s and max_age=168h0m0s", inputLine)
	}
}

func TestStreamMaxAge(t *testing.T) {
	week := 7 * 24 * time.Hour
	cases := []struct {
		configured, w, dup, want time.Duration
	}{
		{0, time.Hour, 0, week},
		{0, 73 * time.Hour, 0, week},
		{0, 7 * 24 * time.Hour, 0, 2 * week}, // a 7-day replay window keeps two weeks
		{24 * time.Hour, 7 * 24 * time.Hour, 0, 24 * time.Hour},
		{time.Minute, time.Hour, 2 * time.Minute, 2 * time.Minute}, // never below the duplicate window
	}
	for _, c := range cases {
		if got := stage.StreamMaxAge(c.configured, c.w, c.dup); got != c.want {
			t.Errorf("StreamMaxAge(%v, %v, %v) = %v, want %v", c.configured, c.w, c.dup, got, c.want)
		}
	}
}

func TestMissingStreamNamesCreateStreams(t *testing.T) {
	e := newEnv(t)
	no := false
	e.cfg.NATS.CreateStreams = &no
	_, err := stage.New(context.Background(), stage.Options{Config: e.cfg, Conn: e.nc})
	if !errors.Is(err, stage.ErrStreamMissing) {
		t.Fatalf("New without streams: %v, want ErrStreamMissing", err)
	}
	for _, want := range []string{`"EVENTS"`, "input.stream", "--create-streams", "nats.create_streams"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	// With the input present, the next missing one is named.
	if _, err := e.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		t.Fatal(err)
	}
	_, err = stage.New(context.Background(), stage.Options{Config: e.cfg, Conn: e.nc})
	if !errors.Is(err, stage.ErrStreamMissing) || !strings.Contains(err.Error(), "output.stream") {
		t.Fatalf("New without the output stream: %v, want ErrStreamMissing naming output.stream", err)
	}
}
