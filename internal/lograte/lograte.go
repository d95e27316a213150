// Package lograte rate-limits log lines by reason, so that an event that
// can happen once per message (a fingerprint mismatch, a refused dead
// letter, a retried publish) cannot flood the logs.
//
// A Limiter lets at most Options.Lines lines of one reason through per
// Options.Interval. The lines past that are counted, not written. Once the
// interval has passed, one line carries the count suppressed: the next line
// of that reason that is let through (attribute "suppressed"), or, when
// none comes, the line Flush writes for it (Run calls Flush every
// interval). Every call, written or not, is counted in
// dedupe_log_events_total{reason}, and the suppressed ones also in
// dedupe_log_lines_suppressed_total{reason}: the counters carry every
// event, the logs a sample.
//
// A reason names a kind of event, such as "fingerprint_mismatch", never a
// value of one message: the limiter keeps one entry per reason.
//
// Use:
//
//	lim := lograte.New(logger, lograte.DefaultOptions(), reg)
//	go lim.Run(ctx)
//	lim.Warn("fingerprint_mismatch", "fingerprint mismatch treated as a repeat", "key", k)
package lograte

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Options.
const (
	// DefaultLines is how many lines of one reason are written per
	// interval.
	DefaultLines = 5
	// DefaultInterval is the interval over which DefaultLines are written.
	DefaultInterval = 10 * time.Second
)

// SuppressedKey is the attribute carrying how many lines of the reason
// were suppressed since the last line written.
const SuppressedKey = "suppressed"

// Options configure a Limiter.
type Options struct {
	// Lines is how many lines of one reason are written per Interval; at
	// least 1. Default DefaultLines.
	Lines int
	// Interval is the period over which Lines are allowed; the count of
	// the lines suppressed in it is written once it has passed. Default
	// DefaultInterval.
	Interval time.Duration
	// Now tells the time. Default time.Now; tests inject their own clock.
	Now func() time.Time
}

// DefaultOptions returns DefaultLines per DefaultInterval on the system
// clock.
func DefaultOptions() Options {
	return Options{Lines: DefaultLines, Interval: DefaultInterval, Now: time.Now}
}

// Validate reports a field out of range, naming it and its value.
func (o Options) Validate() error {
	if o.Lines < 1 {
		return fmt.Errorf("lograte: Options.Lines is %d, want at least 1", o.Lines)
	}
	if o.Interval <= 0 {
		return fmt.Errorf("lograte: Options.Interval is %s, want more than 0", o.Interval)
	}
	return nil
}

// Limiter writes at most Options.Lines lines per reason per
// Options.Interval to a slog.Logger. It is safe for concurrent use. The
// zero value is not usable; build one with New. A nil *Limiter writes
// every line, unlimited and uncounted.
type Limiter struct {
	log *slog.Logger
	*limits
}

// limits are what the Limiters made by With share: the options, the
// counters and each reason's interval.
type limits struct {
	lines    int
	interval time.Duration
	now      func() time.Time

	events     *prometheus.CounterVec
	suppressed *prometheus.CounterVec

	mu      sync.Mutex
	reasons map[string]*period
}

// period is one reason's current interval.
type period struct {
	start      time.Time
	written    int
	suppressed int
	// log, level and msg of the last line suppressed, for the line
	// Flush writes in its place.
	log   *slog.Logger
	level slog.Level
	msg   string
}

// New returns a Limiter writing to log (default slog.Default()) with the
// options o; zero fields take their defaults. Its counters are registered
// on reg; nil registers them on a new registry that is not served.
// Registering twice on one registry panics (a programming error). It
// panics on options out of range (Validate), a programming error.
func New(log *slog.Logger, o Options, reg prometheus.Registerer) *Limiter {
	d := DefaultOptions()
	if o.Lines == 0 {
		o.Lines = d.Lines
	}
	if o.Interval == 0 {
		o.Interval = d.Interval
	}
	if o.Now == nil {
		o.Now = d.Now
	}
	if err := o.Validate(); err != nil {
		panic(err)
	}
	if log == nil {
		log = slog.Default()
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	l := &Limiter{log: log, limits: &limits{
		lines: o.Lines, interval: o.Interval, now: o.Now,
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_log_events_total",
			Help: "Events that log a rate-limited line, by reason, counted whether the line was written or suppressed.",
		}, []string{"reason"}),
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedupe_log_lines_suppressed_total",
			Help: "Log lines not written because their reason had used its lines for the interval, by reason; a later line carries the count.",
		}, []string{"reason"}),
		reasons: make(map[string]*period),
	}}
	reg.MustRegister(l.events, l.suppressed)
	return l
}

// With returns a Limiter that writes to log.With(args...) and shares l's
// intervals and counters: a reason is limited across both.
func (l *Limiter) With(args ...any) *Limiter {
	if l == nil {
		return nil
	}
	return &Limiter{log: l.log.With(args...), limits: l.limits}
}

// Log writes msg with args (slog key-value pairs or slog.Attr) at level
// unless reason has used its lines in the current interval; then it only
// counts it. A line written after lines of its reason were suppressed
// carries their count as SuppressedKey.
func (l *Limiter) Log(ctx context.Context, level slog.Level, reason, msg string, args ...any) {
	if l == nil {
		slog.Default().Log(ctx, level, msg, args...)
		return
	}
	l.events.WithLabelValues(reason).Inc()
	if !l.log.Enabled(ctx, level) {
		return
	}
	ok, n := l.allow(l.log, reason, level, msg)
	if !ok {
		l.suppressed.WithLabelValues(reason).Inc()
		return
	}
	if n > 0 {
		args = append(args, SuppressedKey, n)
	}
	l.log.Log(ctx, level, msg, args...)
}

// Debug is Log at slog.LevelDebug.
func (l *Limiter) Debug(reason, msg string, args ...any) {
	l.Log(context.Background(), slog.LevelDebug, reason, msg, args...)
}

// Info is Log at slog.LevelInfo.
func (l *Limiter) Info(reason, msg string, args ...any) {
	l.Log(context.Background(), slog.LevelInfo, reason, msg, args...)
}

// Warn is Log at slog.LevelWarn.
func (l *Limiter) Warn(reason, msg string, args ...any) {
	l.Log(context.Background(), slog.LevelWarn, reason, msg, args...)
}

// Error is Log at slog.LevelError.
func (l *Limiter) Error(reason, msg string, args ...any) {
	l.Log(context.Background(), slog.LevelError, reason, msg, args...)
}

// allow reports whether a line of reason is written now and, if so, how
// many lines of it were suppressed before it.
func (l *limits) allow(log *slog.Logger, reason string, level slog.Level, msg string) (bool, int) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.reasons[reason]
	if p == nil {
		p = &period{start: now}
		l.reasons[reason] = p
	}
	n := 0
	if now.Sub(p.start) >= l.interval {
		n = p.suppressed
		*p = period{start: now}
	}
	if p.written < l.lines {
		p.written++
		return true, n
	}
	p.suppressed++
	p.log, p.level, p.msg = log, level, msg
	return false, 0
}

// Flush writes, for each reason whose interval has passed with lines
// suppressed, one line: the last suppressed message at its level, to the
// logger it was meant for, with the reason and the count as
// SuppressedKey. Limiters made by With share what Flush reports. With all, it does so for every reason with
// lines suppressed, interval passed or not (at shutdown).
func (l *Limiter) Flush(all bool) {
	if l == nil {
		return
	}
	type line struct {
		reason string
		p      period
	}
	var out []line
	now := l.now()
	l.mu.Lock()
	for reason, p := range l.reasons {
		if !all && now.Sub(p.start) < l.interval {
			continue
		}
		if p.suppressed > 0 {
			out = append(out, line{reason, *p})
		}
		// An interval that passed, or was reported at shutdown, starts
		// again with its next line.
		delete(l.reasons, reason)
	}
	l.mu.Unlock()
	for _, x := range out {
		x.p.log.Log(context.Background(), x.p.level, x.p.msg, "reason", x.reason, SuppressedKey, x.p.suppressed,
			"interval", l.interval.String())
	}
}

// Run calls Flush every interval until ctx ends, then Flush(true), so
// that every suppressed count is written even when no later line of its
// reason comes.
func (l *Limiter) Run(ctx context.Context) {
	if l == nil {
		return
	}
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			l.Flush(true)
			return
		case <-t.C:
			l.Flush(false)
		}
	}
}
