package main

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func testSpec() Spec {
	mix, err := ParseMix("burst=0.2,immediate=0.3,seconds=0.3,near=0.1,past=0.1")
	if err != nil {
		panic(err)
	}
	w := 70 * time.Minute
	return Spec{Prefix: "thr", Seed: 1, Events: 20_000, Keys: 18_000, Mix: mix, BurstSize: 3, PayloadSize: 256, W: w, Span: w * 9 / 10}
}

// TestGenerate checks that a spec gives the same events each time and
// another seed others, and the workload's shape: the events per class,
// the main phase in order inside the span with each burst after its key's
// copy, the late copies at their class's age after the span.
func TestGenerate(t *testing.T) {
	s := testSpec()
	wl, err := Generate(s)
	if err != nil {
		t.Fatal(err)
	}
	other := s
	other.Seed = 2
	for _, spec := range []Spec{s, other} {
		again, err := Generate(spec)
		if err != nil {
			t.Fatal(err)
		}
		if same := slices.Equal(wl.Main, again.Main) && slices.Equal(wl.Late, again.Late); same != (spec.Seed == s.Seed) {
			t.Fatalf("seed %d gave the same events as seed %d: %v", spec.Seed, s.Seed, same)
		}
	}
	if got := wl.Events(); got != s.Events {
		t.Fatalf("events = %d, want %d", got, s.Events)
	}
	if wl.ByClass[ClassFirst] != s.Keys {
		t.Fatalf("first copies = %d, want %d", wl.ByClass[ClassFirst], s.Keys)
	}
	repeats := s.Events - s.Keys
	for c := ClassBurst; c < numClasses; c++ {
		want := float64(repeats) * s.Mix[c]
		if math.Abs(float64(wl.ByClass[c])-want) > 5 {
			t.Errorf("%s copies = %d, want about %.0f", c, wl.ByClass[c], want)
		}
	}
	firstSeen := make([]bool, s.Keys)
	for i, e := range wl.Main {
		if i > 0 && e.At < wl.Main[i-1].At {
			t.Fatalf("main event %d at %v before event %d at %v", i, e.At, i-1, wl.Main[i-1].At)
		}
		if e.At >= s.Span {
			t.Fatalf("main event %d at %v, not inside the span %v", i, e.At, s.Span)
		}
		switch e.Class {
		case ClassFirst:
			firstSeen[e.Key] = true
		case ClassBurst:
			prev := wl.Main[i-1]
			if prev.Key != e.Key || prev.At != e.At {
				t.Fatalf("burst copy %d does not follow its key's copy: %+v after %+v", i, e, prev)
			}
		}
		if !firstSeen[e.Key] {
			t.Fatalf("event %d (%s) comes before its key's first copy", i, e.Class)
		}
		if e.Class == ClassNear || e.Class == ClassPast {
			t.Fatalf("main event %d is %s", i, e.Class)
		}
	}
	for _, e := range wl.Late {
		lo, hi := ageRange(e.Class, s.W)
		if age := wl.Age(e); age < lo || age > hi {
			t.Fatalf("late %s copy has age %v, want %v..%v", e.Class, age, lo, hi)
		}
		if e.At < s.Span {
			t.Fatalf("late copy at %v, before the span ends at %v", e.At, s.Span)
		}
	}
}

func TestKeyRoundTrip(t *testing.T) {
	for _, i := range []int{0, 1, 899_999, 1 << 30} {
		k := KeyString("thr", 9, i)
		if len(k) != keyLen {
			t.Fatalf("key %q has %d bytes, want %d", k, len(k), keyLen)
		}
		p, j, ok := ParseKey(k)
		if !ok || p != "thr" || j != i {
			t.Fatalf("ParseKey(%q) = %q, %d, %v; want thr, %d, true", k, p, j, ok, i)
		}
	}
	if KeyString("thr", 1, 5) == KeyString("thr", 2, 5) {
		t.Fatal("keys do not depend on the seed")
	}
	if !strings.Contains(string(Payload("abc", 3, 256)), `"id":"abc"`) || len(Payload("abc", 3, 256)) != 256 {
		t.Fatalf("payload %q", Payload("abc", 3, 256))
	}
}

// TestLateGroundTruth checks the late phase's grouping and judgement,
// with and without window.refresh_on_repeat, on the same copies: the
// groups are judged at the store's first-seen time (recorded 2m late)
// plus the intended age, never before notBefore; a past copy is forwarded
// again and becomes its key's last forward, so a later copy is judged
// from it; a near copy is a repeat caught near the end; and a repeat
// moves its key's window only with refresh, so a past copy after a near
// one, or after a main-phase repeat the store recorded, is a repeat then
// (key 1's, caught near the end of the moved window).
func TestLateGroundTruth(t *testing.T) {
	w := time.Hour
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// Key 0: a near copy, then a past one. Key 1: a past copy only, whose
	// window a main-phase repeat moved 2m on. Key 2: a past copy, then a
	// near copy of the re-forward.
	wl := &Workload{Spec: Spec{W: w}, First: []time.Duration{0, 0, 0}}
	wl.Late = []Event{
		{Key: 0, Class: ClassNear, At: 50 * time.Minute},
		{Key: 1, Class: ClassPast, At: 61 * time.Minute},
		{Key: 2, Class: ClassPast, At: 62 * time.Minute},
		{Key: 0, Class: ClassPast, At: 70 * time.Minute},
		{Key: 2, Class: ClassNear, At: 112 * time.Minute},
	}
	lag := 2 * time.Minute // the stage recorded the first copies 2m late
	first := func(int32) time.Time { return t0.Add(lag) }
	groups := GroupLate(wl, first, 30*time.Second, t0)
	if len(groups) != 5 || !groups[0].At.Equal(t0.Add(lag+50*time.Minute)) {
		t.Fatalf("%d groups, the first at %v; want 5, at %v", len(groups), groups[0].At, t0.Add(lag+50*time.Minute))
	}
	for _, g := range GroupLate(wl, first, 30*time.Second, t0.Add(3*time.Hour)) {
		if g.At.Before(t0.Add(3 * time.Hour)) {
			t.Fatalf("group at %v before notBefore", g.At)
		}
	}
	cases := []struct {
		refresh     bool
		again, near int
		forwards    []uint8
		start       []time.Duration // each key's window start afterwards, from t0 + lag
	}{
		{refresh: false, again: 3, near: 2, forwards: []uint8{2, 2, 2}, start: []time.Duration{70 * time.Minute, 61 * time.Minute, 62 * time.Minute}},
		{refresh: true, again: 1, near: 3, forwards: []uint8{1, 1, 2}, start: []time.Duration{70 * time.Minute, 61 * time.Minute, 112 * time.Minute}},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("refresh=%v", tc.refresh), func(t *testing.T) {
			start := map[int32]time.Time{0: first(0), 1: first(1), 2: first(2)}
			if tc.refresh {
				start[1] = first(1).Add(2 * time.Minute)
			}
			forwards := []uint8{1, 1, 1}
			again, near := JudgeLate(groups, w, 0.8, tc.refresh, start, forwards)
			if again != tc.again || near != tc.near || !slices.Equal(forwards, tc.forwards) {
				t.Fatalf("again %d, near %d, forwards %v; want %d, %d, %v", again, near, forwards, tc.again, tc.near, tc.forwards)
			}
			for k, d := range tc.start {
				if want := t0.Add(lag + d); !start[int32(k)].Equal(want) {
					t.Errorf("key %d window start %v, want %v", k, start[int32(k)], want)
				}
			}
		})
	}
}

// TestStageRefreshIsStageBloomWithRefresh checks that stage-refresh differs
// from stage-bloom by window.refresh_on_repeat alone, and that the default
// --configs leaves it out.
func TestStageRefreshIsStageBloomWithRefresh(t *testing.T) {
	r := &runner{f: &flags{partitions: 4, publish: "async", workDir: t.TempDir()}, nats: &natsEnv{}, thr: &Workload{Spec: Spec{Keys: 10}}, lat: &Workload{}}
	bloom, refresh := r.stageConfig(KindStageBloom), r.stageConfig(KindStageRefresh)
	if bloom.Window.RefreshOnRepeat || !refresh.Window.RefreshOnRepeat {
		t.Fatalf("refresh_on_repeat: stage-bloom %v, stage-refresh %v; want false, true", bloom.Window.RefreshOnRepeat, refresh.Window.RefreshOnRepeat)
	}
	refresh.Window.RefreshOnRepeat = false
	refresh.State.DataDir = bloom.State.DataDir
	// The streams and the consumer are each configuration's own.
	refresh.Input.Stream, refresh.Input.Subjects, refresh.Input.Consumer = bloom.Input.Stream, bloom.Input.Subjects, bloom.Input.Consumer
	refresh.Output.Stream, refresh.Output.SubjectPrefix = bloom.Output.Stream, bloom.Output.SubjectPrefix
	refresh.DeadLetter.Stream, refresh.DeadLetter.Subject = bloom.DeadLetter.Stream, bloom.DeadLetter.Subject
	if !reflect.DeepEqual(bloom, refresh) {
		t.Fatalf("stage-refresh differs from stage-bloom beyond refresh_on_repeat:\n%+v\n%+v", refresh, bloom)
	}
	if namesFor(KindStageRefresh) == namesFor(KindStageBloom) {
		t.Fatal("stage-refresh shares stage-bloom's streams")
	}

	def, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(def.kinds, KindStageRefresh) {
		t.Fatalf("default --configs runs %v; want no stage-refresh", def.kinds)
	}
	f, err := parseFlags([]string{"--configs", "stage-bloom,stage-refresh"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.kinds, []Kind{KindStageBloom, KindStageRefresh}) {
		t.Fatalf("--configs stage-bloom,stage-refresh runs %v", f.kinds)
	}
}

// TestRefreshRatio checks the cost of window.refresh_on_repeat as the
// ratios state it, and that ratios of configurations not run are left
// out.
func TestRefreshRatio(t *testing.T) {
	got := compareRatios([]*Result{
		{Config: "stage-bloom", EventsPerSec: 5000, CPUMicrosPerEvent: 100},
		{Config: "stage-refresh", EventsPerSec: 4000, CPUMicrosPerEvent: 110},
	}, &WorkloadInfo{MainEvents: 20_000, Keys: 10_000})
	// 10 µs more per event, 20,000 events, 10,000 of them repeats.
	if len(got) != 2 || math.Abs(got["stage-refresh/stage-bloom"]-0.8) > 1e-9 || math.Abs(got["stage-refresh cpu µs/repeat"]-20) > 1e-9 {
		t.Fatalf("ratios %v; want stage-refresh/stage-bloom 0.8 and 20 cpu µs/repeat only", got)
	}
}

func TestPercentiles(t *testing.T) {
	var ds []time.Duration
	for i := 1000; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	p := percentiles(ds, 0.5, 0.99, 0.999, 1)
	want := []time.Duration{500 * time.Millisecond, 990 * time.Millisecond, 999 * time.Millisecond, time.Second}
	if !slices.Equal(p, want) {
		t.Fatalf("percentiles = %v, want %v", p, want)
	}
	if got := percentiles(nil, 0.5); got[0] != 0 {
		t.Fatalf("percentiles of nothing = %v", got)
	}
}
