package scaleout

import (
	"context"
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

// TestGoneOwner checks whose silence unpins a partition: its fence
// holder's; but where this instance holds the fence, it released the
// partition for balance, and the instance it went to, gone before it took
// the fence, is the owner (docs/scale-out.md §4.3).
func TestGoneOwner(t *testing.T) {
	heard := time.Now().Add(-5 * time.Second)
	gone := map[string]time.Time{"c": heard}
	for _, c := range []struct {
		name, to, holder, owner string
		gone                    bool
	}{
		{"the fence holder gone", "a", "c", "c", true},
		{"the fence holder alive", "a", "b", "b", false},
		{"released here to a gone instance", "c", "a", "c", true},
		{"released here to a live instance", "b", "a", "b", false},
		{"released here, assigned back here", "a", "a", "a", false},
	} {
		owner, last, ok := goneOwner("a", c.to, c.holder, gone)
		if owner != c.owner || ok != c.gone || ok && !last.Equal(heard) {
			t.Errorf("%s: goneOwner = %s, %v, %v; want %s, gone %v (last heard %v)", c.name, owner, last, ok, c.owner, c.gone, heard)
		}
	}
}

// TestOnPin checks what detection does with the pin of a partition whose
// owner is gone: nobody pinned, it pulls (the server pins the first pull;
// an unpin would do nothing); a pin older than the owner's last put is
// the owner's and is unpinned; a pin given after it is the next owner's,
// until it has held repinAfter without the fence moving.
func TestOnPin(t *testing.T) {
	last := time.Now().Add(-4 * time.Second)
	for _, c := range []struct {
		name string
		pin  string
		at   time.Time
		age  time.Duration
		want pinAction
	}{
		{"nobody pinned", "", time.Time{}, 0, pinPull},
		{"pinned before the owner's last put", "p1", last.Add(-time.Minute), time.Minute, pinUnpin},
		{"pinned within a heartbeat of it", "p1", last.Add(heartbeatEvery / 2), 3 * time.Second, pinUnpin},
		{"pinned after it, lately", "p2", last.Add(3 * time.Second), repinAfter / 2, pinLeave},
		{"pinned after it, held repinAfter", "p2", last.Add(time.Second + time.Millisecond), repinAfter, pinUnpin},
	} {
		if got := onPin(c.pin, c.at, c.age, last); got != c.want {
			t.Errorf("%s: onPin = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestUnpinGoneLeavesATakeAlone: a successor taking a gone owner's
// partition holds its fence before the take ends, while balance still
// assigns the partition to the gone owner; detection must not read that
// as a release to a gone instance and unpin its own pin. The group here
// has no server (js nil): a partition asked about would panic.
func TestUnpinGoneLeavesATakeAlone(t *testing.T) {
	now := time.Now()
	pr := &presence{self: "i1", ttl: 30 * time.Second, watching: true, synced: true,
		heard: map[string]time.Time{"i1": now, "i0": now.Add(-5 * time.Second)},
		seen:  map[string]time.Time{"i1": now, "i0": now.Add(-5 * time.Second)},
	}
	g := &Group{instance: "i1", opts: Options{Partitions: 1}, assigned: []string{"i0"},
		successor: map[int]bool{0: true}, owned: map[int]string{}}
	done := g.startTake(0)
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("detection asked about a partition this instance is taking: %v", r)
			}
		}()
		g.unpinGone(context.Background(), pr, nil, map[int]time.Time{})
	}()
	done()
	if g.takingOver(0) {
		t.Error("a take that ended still counts as in flight")
	}
}
