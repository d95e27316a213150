// Package window derives the dedupe window W from the slow paths a repeat
// can take, and judges the age of caught repeats against it.
//
// A dedupe window is not a bare number. A copy that arrives after its key
// expired is not recognised and runs again, so W must exceed the longest
// gap between the first copy and the last one. That gap is set by the
// slowest path a repeat can take, so W is derived from named paths:
//
//	w, err := window.Derive([]window.Path{
//		{Name: "client-retry", Max: 10 * time.Minute},
//		{Name: "webhook-retry", Max: 72 * time.Hour},
//	}, time.Hour)
//	// w.W == 73h, w.SetBy.Name == "webhook-retry"
//
// Time always comes from an injected Clock, so tests and simulations can
// move it.
package window

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
)

// Errors returned by Derive and Window.Validate.
var (
	// ErrNoPaths means no slow path was named, so W cannot be derived.
	ErrNoPaths = errors.New("window: no slow paths named")
	// ErrBadPath means a path has no name, a duplicate name or a non-positive duration.
	ErrBadPath = errors.New("window: bad slow path")
	// ErrOverflow means the paths plus the margin do not fit in a time.Duration.
	ErrOverflow = errors.New("window: window overflows")
	// ErrBadFraction means the near-end fraction is outside (0, 1].
	ErrBadFraction = errors.New("window: near-end fraction must be in (0, 1]")
)

// DefaultNearFraction is the fraction of W past which a caught repeat counts
// as caught near the end of the window.
const DefaultNearFraction = 0.8

// Path is one named way a repeat can reach the stage late, with the longest
// delay it can add between the first copy and the last.
type Path struct {
	// Name identifies the path in logs and errors, e.g. "webhook-retry".
	Name string
	// Max is the latest a copy can arrive on this path after the first copy.
	Max time.Duration
}

// Window is a derived dedupe window. The zero value is not usable: build one
// with Derive.
type Window struct {
	// W is the window: the longest path plus the margin. A key first seen at
	// t is remembered while now < t+W.
	W time.Duration
	// SetBy is the path that set W.
	SetBy Path
	// Margin is added to the longest path.
	Margin time.Duration
	// Paths are the paths W was derived from, in the order given.
	Paths []Path
	// NearFraction is the fraction of W past which a caught repeat is
	// reported as near the end of the window. Default DefaultNearFraction.
	NearFraction float64
}

// Derive returns the window for paths: the longest path plus margin. No
// paths, a path without a name, a duplicate name, a non-positive duration, a
// negative margin or a sum that overflows is an error naming the path.
func Derive(paths []Path, margin time.Duration) (Window, error) {
	if len(paths) == 0 {
		return Window{}, ErrNoPaths
	}
	if margin < 0 {
		return Window{}, fmt.Errorf("%w: margin %v is negative", ErrBadPath, margin)
	}
	seen := make(map[string]bool, len(paths))
	var longest Path
	for i, p := range paths {
		switch {
		case strings.TrimSpace(p.Name) == "":
			return Window{}, fmt.Errorf("%w: path %d has no name", ErrBadPath, i)
		case seen[p.Name]:
			return Window{}, fmt.Errorf("%w: path %q is named twice", ErrBadPath, p.Name)
		case p.Max <= 0:
			return Window{}, fmt.Errorf("%w: path %q has duration %v, want > 0", ErrBadPath, p.Name, p.Max)
		}
		seen[p.Name] = true
		if p.Max > longest.Max {
			longest = p
		}
	}
	if longest.Max > math.MaxInt64-margin {
		return Window{}, fmt.Errorf("%w: path %q (%v) plus margin %v", ErrOverflow, longest.Name, longest.Max, margin)
	}
	return Window{
		W:            longest.Max + margin,
		SetBy:        longest,
		Margin:       margin,
		Paths:        append([]Path(nil), paths...),
		NearFraction: DefaultNearFraction,
	}, nil
}

// Validate reports whether w can be used.
func (w Window) Validate() error {
	if w.W <= 0 {
		return fmt.Errorf("%w: W is %v, want > 0", ErrBadPath, w.W)
	}
	if !(w.NearFraction > 0 && w.NearFraction <= 1) {
		return fmt.Errorf("%w: got %v", ErrBadFraction, w.NearFraction)
	}
	return nil
}

// Age returns how long after firstSeen now is. It is never negative: a
// first-seen time in the future (a clock that stepped back) has age 0.
func (w Window) Age(firstSeen, now time.Time) time.Duration {
	if d := now.Sub(firstSeen); d > 0 {
		return d
	}
	return 0
}

// Inside reports whether a key first seen at firstSeen is still remembered at
// now, i.e. now < firstSeen+W.
func (w Window) Inside(firstSeen, now time.Time) bool {
	return now.Sub(firstSeen) < w.W
}

// ExpiresAt returns when a key first seen at firstSeen leaves the window.
func (w Window) ExpiresAt(firstSeen time.Time) time.Time {
	return firstSeen.Add(w.W)
}

// Near reports whether a repeat of the given age was caught near the end of
// the window: age >= NearFraction*W. Repeats caught near the end predict
// repeats that arrive past it.
func (w Window) Near(age time.Duration) bool {
	return float64(age) >= w.NearFraction*float64(w.W)
}

// String tells how W was derived, e.g.
// "73h0m0s = webhook-retry 72h0m0s + margin 1h0m0s (paths: client-retry 10m0s, webhook-retry 72h0m0s)".
func (w Window) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v = %s %v + margin %v (paths:", w.W, w.SetBy.Name, w.SetBy.Max, w.Margin)
	for i, p := range w.Paths {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, " %s %v", p.Name, p.Max)
	}
	b.WriteByte(')')
	return b.String()
}

// Clock tells the time. Everything that judges age takes one, so tests can
// move time.
type Clock interface {
	Now() time.Time
}

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// ManualClock is a Clock that moves only when told. It is for tests and
// simulations. It is safe for concurrent use.
type ManualClock struct {
	mu sync.Mutex
	t  time.Time
}

// NewManualClock returns a clock that reads t until moved.
func NewManualClock(t time.Time) *ManualClock { return &ManualClock{t: t} }

// Now returns the clock's current time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d (backward if d is negative).
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t.
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}
