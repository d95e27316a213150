package main

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Class is the intended age of a copy relative to the first copy of its
// key. Every published event carries its class in the Bench-Age header.
type Class uint8

// The classes of an event.
const (
	// ClassFirst is the first copy of a key.
	ClassFirst Class = iota
	// ClassBurst copies follow their first copy back to back in the
	// stream (age 0): they arrive in the same pull, in the same batch.
	ClassBurst
	// ClassImmediate copies come up to 1s (logical) after the first.
	ClassImmediate
	// ClassSeconds copies come 2s to 60s after the first.
	ClassSeconds
	// ClassNear copies come 0.82W to 0.88W after the first: inside the
	// window, past its near-end fraction (0.8 by default).
	ClassNear
	// ClassPast copies come 1.12W to 1.20W after the first: past the
	// window, so the stage must forward them again (with
	// window.refresh_on_repeat, unless a repeat moved the window).
	ClassPast
	numClasses
)

var classNames = [numClasses]string{"first", "burst", "immediate", "seconds", "near", "past"}

// String returns the class name used in headers and flags.
func (c Class) String() string {
	if c < numClasses {
		return classNames[c]
	}
	return "class" + strconv.Itoa(int(c))
}

// ageRange returns the range of intended ages of class c for window w.
func ageRange(c Class, w time.Duration) (lo, hi time.Duration) {
	switch c {
	case ClassImmediate:
		return time.Millisecond, time.Second
	case ClassSeconds:
		return 2 * time.Second, time.Minute
	case ClassNear:
		return time.Duration(0.82 * float64(w)), time.Duration(0.88 * float64(w))
	case ClassPast:
		return time.Duration(1.12 * float64(w)), time.Duration(1.20 * float64(w))
	}
	return 0, 0
}

// Mix is the share of repeats in each class (normalised to sum 1).
type Mix [numClasses]float64

// ParseMix parses "burst=0.2,immediate=0.3,seconds=0.3,near=0.1,past=0.1".
// Classes not named get 0; the shares are normalised.
func ParseMix(s string) (Mix, error) {
	var m Mix
	sum := 0.0
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, val, ok := strings.Cut(part, "=")
		if !ok {
			return m, fmt.Errorf("--ages: %q: want class=share", part)
		}
		f, err := strconv.ParseFloat(val, 64)
		if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
			return m, fmt.Errorf("--ages: %q: share must be a number >= 0", part)
		}
		i := slices.Index(classNames[:], name)
		if i <= int(ClassFirst) {
			return m, fmt.Errorf("--ages: unknown class %q (want burst, immediate, seconds, near, past)", name)
		}
		m[i] = f
		sum += f
	}
	if sum == 0 {
		return m, errors.New("--ages: all shares are 0")
	}
	for i := range m {
		m[i] /= sum
	}
	return m, nil
}

// String formats m like ParseMix accepts.
func (m Mix) String() string {
	var parts []string
	for c := ClassBurst; c < numClasses; c++ {
		if m[c] > 0 {
			parts = append(parts, fmt.Sprintf("%s=%.3g", c, m[c]))
		}
	}
	return strings.Join(parts, ",")
}

// Spec describes a workload. The same Spec and Seed give the same events.
type Spec struct {
	// Prefix starts every key of the workload (3 letters).
	Prefix string
	// Seed seeds the generator.
	Seed uint64
	// Events is the number of events.
	Events int
	// Keys is the number of distinct keys (first copies); the other
	// Events-Keys events are repeats.
	Keys int
	// Mix is the share of repeats per class.
	Mix Mix
	// BurstSize is the number of extra copies in one burst.
	BurstSize int
	// PayloadSize is the payload size in bytes (at least what the JSON
	// envelope needs).
	PayloadSize int
	// W is the dedupe window.
	W time.Duration
	// Span is the logical time the first copies spread over, uniformly.
	// It is less than W, so that every copy of the main phase is inside
	// the window however the stage's clock lags.
	Span time.Duration
}

// Event is one event of a workload.
type Event struct {
	// Key is the key's index in the workload.
	Key int32
	// Class is the intended age class.
	Class Class
	// At is the intended logical time, from the workload's start.
	At time.Duration
}

// Workload is a generated workload in two phases. Main holds every first
// copy and the burst, immediate and seconds copies in publish order, each
// key forwarded once whatever the stage's clock reads (Span < W). Late
// holds the near and past copies, which the harness publishes in small
// groups with the stage's clock stopped at each group's time (runner.runLate).
type Workload struct {
	Spec
	// Main holds the main phase's events in publish order.
	Main []Event
	// Late holds the near and past copies by intended time.
	Late []Event
	// First is each key's intended first-seen time.
	First []time.Duration
	// Copies is how many events carry each key.
	Copies []uint16
	// ByClass counts events per class.
	ByClass [numClasses]int
}

// keyLen is the length of every key: a UUID without dashes.
const keyLen = 32

// KeyString returns key i of a workload: prefix, '-', 19 hex digits of a
// hash of (prefix, seed, i) and i as 9 hex digits (32 bytes). Keys look
// random, so that on disk they compress like real ids do.
func KeyString(prefix string, seed uint64, i int) string {
	var buf [24]byte
	copy(buf[:8], prefix)
	binary.LittleEndian.PutUint64(buf[8:], seed)
	binary.LittleEndian.PutUint64(buf[16:], uint64(i))
	h1 := xxhash.Sum64(buf[:])
	binary.LittleEndian.PutUint64(buf[:8], h1)
	h2 := xxhash.Sum64(buf[:])
	return fmt.Sprintf("%.3s-%016x%03x%09x", prefix, h1, h2&0xfff, uint64(i)&0xfffffffff)
}

// ParseKey returns the prefix and index of a key made by KeyString.
func ParseKey(key string) (prefix string, i int, ok bool) {
	if len(key) != keyLen || key[3] != '-' {
		return "", 0, false
	}
	n, err := strconv.ParseUint(key[keyLen-9:], 16, 64)
	if err != nil {
		return "", 0, false
	}
	return key[:3], int(n), true
}

// Payload returns the payload of key i: a JSON object carrying the key as
// "id", padded to size bytes. Every copy of a key has the same payload, so
// the same fingerprint.
func Payload(key string, i, size int) []byte {
	b := fmt.Appendf(nil, `{"id":%q,"n":%d,"pad":"`, key, i)
	for len(b) < size-2 {
		b = append(b, 'a'+byte(len(b)%26))
	}
	return append(b, '"', '}')
}

// Generate builds the workload of s.
func Generate(s Spec) (*Workload, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(s.Seed, 0x5eed))
	wl := &Workload{Spec: s, Copies: make([]uint16, s.Keys), First: make([]time.Duration, s.Keys)}
	main := make([]Event, 0, s.Events)

	// First copies, spread uniformly over Span in key order.
	step := float64(s.Span) / float64(s.Keys)
	for i := range wl.First {
		wl.First[i] = time.Duration((float64(i) + rng.Float64()) * step)
		main = append(main, Event{Key: int32(i), Class: ClassFirst, At: wl.First[i]})
	}

	n := s.repeatsPerClass()

	for left := n[ClassBurst]; left > 0; {
		k := rng.IntN(s.Keys)
		for range min(s.BurstSize, left) {
			main = append(main, Event{Key: int32(k), Class: ClassBurst, At: wl.First[k]})
			left--
		}
	}
	var late []Event
	for c := ClassImmediate; c < numClasses; c++ {
		lo, hi := ageRange(c, s.W)
		for range n[c] {
			age := lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
			// Main copies stay inside Span; late copies come after it
			// (the stage's clock only moves forward).
			from, to := 0, s.Keys
			if c == ClassNear || c == ClassPast {
				from = sortSearch(wl.First, s.Span-lo)
			} else {
				to = sortSearch(wl.First, s.Span-age)
			}
			if from >= to {
				return nil, fmt.Errorf("no key can take a %s copy (age %v) with span %v and window %v: change --span-factor", c, age.Round(time.Second), s.Span, s.W)
			}
			k := from + rng.IntN(to-from)
			e := Event{Key: int32(k), Class: c, At: wl.First[k] + age}
			if c == ClassNear || c == ClassPast {
				late = append(late, e)
			} else {
				main = append(main, e)
			}
		}
	}
	order := func(a, b Event) int {
		return cmp.Or(cmp.Compare(a.At, b.At), cmp.Compare(a.Key, b.Key), cmp.Compare(a.Class, b.Class))
	}
	slices.SortStableFunc(main, order)
	slices.SortStableFunc(late, order)
	wl.Main, wl.Late = main, late
	for _, e := range main {
		wl.Copies[e.Key]++
		wl.ByClass[e.Class]++
	}
	for _, e := range late {
		wl.Copies[e.Key]++
		wl.ByClass[e.Class]++
	}
	return wl, nil
}

// check reports the first setting of s that Generate cannot work with.
func (s Spec) check() error {
	switch {
	case s.Events < 1:
		return fmt.Errorf("events is %d, want >= 1", s.Events)
	case s.Keys < 1 || s.Keys > s.Events:
		return fmt.Errorf("keys is %d, want 1..events (%d)", s.Keys, s.Events)
	case s.Keys > 1<<31-1:
		return fmt.Errorf("keys is %d, too many", s.Keys)
	case s.W <= 0 || s.Span <= 0 || s.Span >= s.W:
		return fmt.Errorf("window %v and span %v: want 0 < span < window", s.W, s.Span)
	case s.BurstSize < 1:
		return fmt.Errorf("burst size is %d, want >= 1", s.BurstSize)
	}
	return nil
}

// repeatsPerClass splits the events beyond the first copies by Mix;
// rounding leftovers go to the largest class.
func (s Spec) repeatsPerClass() [numClasses]int {
	repeats := s.Events - s.Keys
	var n [numClasses]int
	assigned, largest := 0, ClassBurst
	for c := ClassBurst; c < numClasses; c++ {
		n[c] = int(float64(repeats) * s.Mix[c])
		assigned += n[c]
		if s.Mix[c] > s.Mix[largest] {
			largest = c
		}
	}
	n[largest] += repeats - assigned
	return n
}

// sortSearch returns how many of the sorted times are < limit.
func sortSearch(ts []time.Duration, limit time.Duration) int {
	i, _ := slices.BinarySearch(ts, limit)
	return i
}

// Age returns the intended age of e: its time minus its key's first copy.
func (wl *Workload) Age(e Event) time.Duration { return e.At - wl.First[e.Key] }

// Key returns key i of the workload.
func (wl *Workload) Key(i int) string { return KeyString(wl.Prefix, wl.Seed, i) }

// Events returns the number of events in both phases.
func (wl *Workload) Events() int { return len(wl.Main) + len(wl.Late) }

// LateGroup is a group of late copies judged at one clock reading.
type LateGroup struct {
	// At is the stage clock's reading while the group is judged.
	At time.Time
	// Events of the group, in publish order.
	Events []Event
}

// GroupLate orders the late copies by their target time, firstSeen[key] +
// intended age, and cuts them into groups no wider than width; each group
// is judged at max(its earliest target, the previous group's time,
// notBefore). With firstSeen the first-seen times the store recorded, the
// age each copy is judged at is its intended age minus at most width (or
// more, if notBefore pushed the group later).
func GroupLate(wl *Workload, firstSeen func(key int32) time.Time, width time.Duration, notBefore time.Time) []LateGroup {
	type target struct {
		e Event
		t time.Time
	}
	ts := make([]target, len(wl.Late))
	for i, e := range wl.Late {
		ts[i] = target{e: e, t: firstSeen(e.Key).Add(wl.Age(e))}
	}
	slices.SortStableFunc(ts, func(a, b target) int { return a.t.Compare(b.t) })
	var groups []LateGroup
	at := notBefore
	for i := 0; i < len(ts); {
		start := ts[i].t
		if start.After(at) {
			at = start
		}
		g := LateGroup{At: at}
		for ; i < len(ts) && !ts[i].t.After(start.Add(width)); i++ {
			g.Events = append(g.Events, ts[i].e)
		}
		groups = append(groups, g)
	}
	return groups
}

// JudgeLate is the ground truth for the late groups: a copy is forwarded
// when its key's window start is at least W before the group's time (the
// stage's window.Inside), and the group's time then becomes the key's
// window start; with refresh (window.refresh_on_repeat) a repeat moves it
// there too. windowStart starts at the window starts the store recorded
// after the main phase and is updated. It returns the forwards per key of
// the late phase (added to forwards), how many copies were forwarded
// again, and how many repeats were caught at an age of at least
// nearFraction*W. With refresh the stage may count more of those: repeats
// of one key in one batch are each aged from the window as it was before
// the batch, here from the first one's move.
func JudgeLate(groups []LateGroup, w time.Duration, nearFraction float64, refresh bool, windowStart map[int32]time.Time, forwards []uint8) (again, near int) {
	for _, g := range groups {
		for _, e := range g.Events {
			age := g.At.Sub(windowStart[e.Key])
			if age >= w {
				forwards[e.Key]++
				windowStart[e.Key] = g.At
				again++
				continue
			}
			if float64(age) >= nearFraction*float64(w) {
				near++
			}
			if refresh && g.At.After(windowStart[e.Key]) {
				windowStart[e.Key] = g.At
			}
		}
	}
	return again, near
}
