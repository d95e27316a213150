package status

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
)

// TestClassify: a pinned partition is owned whatever waits; without a pin,
// nothing unacknowledged is idle, and input waits since the later of its
// oldest message and the consumer's last work, stalled only once that is
// longer than the hand-over time.
func TestClassify(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ago := func(d time.Duration) *time.Time { at := now.Add(-d); return &at }
	const handOver = 3 * time.Second
	for _, tc := range []struct {
		name           string
		pinned         bool
		oldest, active *time.Time
		want           string
		waited         time.Duration
	}{
		{"pinned, input waiting", true, ago(time.Hour), ago(time.Hour), StateOwned, 0},
		{"no pin, nothing unacknowledged", false, nil, ago(time.Hour), StateIdle, 0},
		{"no pin, never active", false, nil, nil, StateIdle, 0},
		{"input stored 2s ago", false, ago(2 * time.Second), nil, StateWaiting, 2 * time.Second},
		{"input older than the last owner's last work", false, ago(time.Hour), ago(time.Second), StateWaiting, time.Second},
		{"input newer than the last owner's last work", false, ago(10 * time.Second), ago(time.Hour), StateStalled, 10 * time.Second},
		{"exactly the hand-over time", false, ago(handOver), nil, StateWaiting, handOver},
		{"just over the hand-over time", false, ago(handOver + time.Millisecond), nil, StateStalled, handOver + time.Millisecond},
		{"stored after now (clocks apart)", false, ago(-time.Second), nil, StateWaiting, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, w := classify(tc.pinned, tc.oldest, tc.active, handOver, now)
			if state != tc.want {
				t.Fatalf("state %q, want %q", state, tc.want)
			}
			if (w != nil) != (state == StateWaiting || state == StateStalled) {
				t.Fatalf("state %q with waiting %+v", state, w)
			}
			if w != nil && (time.Duration(w.For) != tc.waited || time.Duration(w.HandOverTime) != handOver || w.Stalled() != (state == StateStalled)) {
				t.Errorf("waiting %+v, want for %v, hand-over time %v", *w, tc.waited, handOver)
			}
		})
	}
}

// TestHandOverTime: input.ack_wait plus the longer of
// output.restart_margin and the partition's last takeover.
func TestHandOverTime(t *testing.T) {
	tg := Target{AckWait: 10 * time.Second, RestartMargin: time.Minute}
	for _, tc := range []struct {
		name string
		last *changelog.HandOver
		want time.Duration
	}{
		{"no takeover recorded", nil, 70 * time.Second},
		{"a quick takeover", &changelog.HandOver{RestoreSeconds: 0.3}, 70 * time.Second},
		{"a takeover longer than the margin", &changelog.HandOver{RestoreSeconds: 90}, 100 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := HandOverTime(tg, tc.last); got != tc.want {
				t.Errorf("HandOverTime = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestCheck: only stalled input fails the check, and the error names each
// stalled partition (or the route step) with its wait and hand-over time.
func TestCheck(t *testing.T) {
	now := time.Now()
	wait := func(d time.Duration) *Waiting {
		return &Waiting{Since: now.Add(-d), For: Duration(d), HandOverTime: Duration(3 * time.Second)}
	}
	healthy := Report{At: now, Partitions: []Partition{
		{Partition: 0, State: StateOwned}, {Partition: 1, State: StateIdle}, {Partition: 2, State: StateWaiting, Waiting: wait(2 * time.Second)},
	}, RouteState: StateIdle}
	if err := healthy.Check(); err != nil {
		t.Errorf("Check of owned, idle and waiting within the hand-over time: %v", err)
	}
	sick := healthy
	sick.Partitions = append([]Partition{}, healthy.Partitions...)
	sick.Partitions = append(sick.Partitions, Partition{Partition: 3, State: StateStalled, Waiting: wait(75 * time.Second)})
	err := sick.Check()
	if !errors.Is(err, ErrStalled) || !strings.Contains(err.Error(), "partitions 3 (waiting 1m15s, hand-over time 3s) of 4") {
		t.Errorf("Check with partition 3 stalled: %v", err)
	}
	if strings.Contains(err.Error(), "route") {
		t.Errorf("Check names the idle route step: %v", err)
	}
	sick.RouteState, sick.RouteWaiting = StateStalled, wait(10*time.Second)
	if err := sick.Check(); !strings.Contains(err.Error(), "the route step, with no live instance (waiting 10s, hand-over time 3s)") {
		t.Errorf("Check with the route step stalled: %v", err)
	}
}

// TestTableStates: the table counts the states in its first line and
// shows each partition's, with the wait of those whose input waits.
func TestTableStates(t *testing.T) {
	now := time.Now()
	wait := func(d time.Duration) *Waiting {
		return &Waiting{Since: now.Add(-d), For: Duration(d), HandOverTime: Duration(3 * time.Second)}
	}
	r := Report{At: now, Mode: "scale-out", Group: "dedupe", Partitions: []Partition{
		{Partition: 0, State: StateOwned, PinID: "x", Owner: "a", OwnerConfirmed: true, LastOwner: "a"},
		{Partition: 1, State: StateIdle, LastOwner: "b"},
		{Partition: 2, State: StateWaiting, Waiting: wait(2 * time.Second)},
		{Partition: 3, State: StateStalled, Waiting: wait(75 * time.Second), LastOwner: "a"},
	}}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`(?m)^group dedupe: 4 partitions: 1 owned, 1 idle, 1 waiting, 1 stalled; live instances: none$`,
		`(?m)^0 +owned +a +-`,
		`(?m)^1 +idle +none \(last b\) +-`,
		`(?m)^2 +waiting 2s \(within hand-over time 3s\) +none +-`,
		`(?m)^3 +STALLED: waiting 1m15s, hand-over time 3s +none \(last a\) +-`,
	} {
		if !regexp.MustCompile(want).MatchString(b.String()) {
			t.Errorf("table has no line %s:\n%s", want, b.String())
		}
	}
}
