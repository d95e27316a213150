package scaleout

import (
	"testing"
	"time"
)

// TestGone checks which instances a standby takes for gone: silent for
// longer than the bound but not past the key's TTL, and only while its own
// puts are heard (a watch that fell behind makes nobody gone).
func TestGone(t *testing.T) {
	now := time.Now()
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	pr := &presence{self: "a", ttl: 30 * time.Second, watching: true, synced: true,
		heard: map[string]time.Time{"a": ago(time.Second), "b": ago(500 * time.Millisecond), "c": ago(4 * time.Second), "d": ago(40 * time.Second)},
		seen:  map[string]time.Time{"a": ago(time.Second), "b": ago(500 * time.Millisecond), "c": ago(4 * time.Second), "d": ago(40 * time.Second)},
	}
	gone := pr.gone(ownerGoneAfter)
	if len(gone) != 1 || !gone["c"].Equal(pr.seen["c"]) {
		t.Errorf("gone = %v; want c alone (b heard lately, d past the key's TTL), at its last put", gone)
	}
	pr.heard["a"] = ago(5 * time.Second)
	if gone := pr.gone(ownerGoneAfter); gone != nil {
		t.Errorf("with this instance's own put not heard for 5 s, gone = %v; want nobody (the watch fell behind)", gone)
	}
	pr.heard["a"] = ago(time.Second)
	pr.synced = false
	if gone := pr.gone(ownerGoneAfter); gone != nil {
		t.Errorf("before the watch synced, gone = %v; want nobody", gone)
	}
}

// TestDetects checks that detection runs only where it beats the pin's
// TTL by a margin: the default input.ack_wait (10 s), not 2 s.
func TestDetects(t *testing.T) {
	for _, c := range []struct {
		ttl  time.Duration
		want bool
	}{{10 * time.Second, true}, {6 * time.Second, true}, {5 * time.Second, false}, {2 * time.Second, false}} {
		if got := detects(c.ttl); got != c.want {
			t.Errorf("detects(%v) = %v, want %v", c.ttl, got, c.want)
		}
	}
}
