package window

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestDerive(t *testing.T) {
	tests := []struct {
		name    string
		paths   []Path
		margin  time.Duration
		wantW   time.Duration
		wantBy  string
		wantErr error
		errHas  string
	}{
		{name: "longest path sets W", paths: []Path{{"client-retry", 10 * time.Minute}, {"webhook-retry", 72 * time.Hour}, {"redrive", time.Hour}}, margin: time.Hour, wantW: 73 * time.Hour, wantBy: "webhook-retry"},
		{name: "zero margin", paths: []Path{{"stream-replay", 168 * time.Hour}}, wantW: 168 * time.Hour, wantBy: "stream-replay"},
		{name: "no paths", wantErr: ErrNoPaths},
		{name: "unnamed", paths: []Path{{" ", time.Minute}}, wantErr: ErrBadPath, errHas: "path 0 has no name"},
		{name: "duplicate", paths: []Path{{"a", time.Minute}, {"a", time.Hour}}, wantErr: ErrBadPath, errHas: `"a" is named twice`},
		{name: "zero duration", paths: []Path{{"webhook-retry", 0}}, wantErr: ErrBadPath, errHas: `"webhook-retry" has duration 0s`},
		{name: "negative duration", paths: []Path{{"x", -time.Second}}, wantErr: ErrBadPath, errHas: `"x"`},
		{name: "negative margin", paths: []Path{{"x", time.Second}}, margin: -1, wantErr: ErrBadPath, errHas: "margin"},
		{name: "overflow", paths: []Path{{"forever", math.MaxInt64 - 10}}, margin: time.Hour, wantErr: ErrOverflow, errHas: `"forever"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := Derive(tt.paths, tt.margin)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.errHas) {
					t.Fatalf("Derive: err %v, want %v containing %q", err, tt.wantErr, tt.errHas)
				}
				return
			}
			if err != nil {
				t.Fatalf("Derive: %v", err)
			}
			if w.W != tt.wantW || w.SetBy.Name != tt.wantBy {
				t.Fatalf("W=%v set by %q, want %v by %q", w.W, w.SetBy.Name, tt.wantW, tt.wantBy)
			}
			if err := w.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if s := w.String(); !strings.Contains(s, tt.wantBy) || !strings.Contains(s, tt.wantW.String()) {
				t.Fatalf("String() = %q does not say how W was derived", s)
			}
		})
	}
}

func TestAgeInsideNear(t *testing.T) {
	w, err := Derive([]Path{{"client-retry", 100 * time.Second}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	first := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewManualClock(first)
	for _, step := range []struct {
		advance      time.Duration
		inside, near bool
	}{
		{0, true, false},
		{79 * time.Second, true, false},
		{time.Second, true, true}, // age 80s = 0.8 W
		{19 * time.Second, true, true},
		{time.Second, false, true}, // age 100s = W: gone
	} {
		c.Advance(step.advance)
		now := c.Now()
		age := w.Age(first, now)
		if got := w.Inside(first, now); got != step.inside {
			t.Errorf("age %v: Inside = %v, want %v", age, got, step.inside)
		}
		if got := w.Near(age); got != step.near {
			t.Errorf("age %v: Near = %v, want %v", age, got, step.near)
		}
	}
	if got := w.ExpiresAt(first); !got.Equal(first.Add(100 * time.Second)) {
		t.Errorf("ExpiresAt = %v", got)
	}
	if got := w.Age(first, first.Add(-time.Hour)); got != 0 {
		t.Errorf("age of a future first-seen = %v, want 0", got)
	}
	w.NearFraction = 0
	if err := w.Validate(); !errors.Is(err, ErrBadFraction) {
		t.Errorf("Validate with fraction 0: %v", err)
	}
}
