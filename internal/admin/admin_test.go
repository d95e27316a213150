package admin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// fakeStage answers as one instance of a group that owns the keys in
// owned, and holds them, and says it owns the partitions in cover. For
// tests only.
type fakeStage struct {
	mu      sync.Mutex
	owned   map[string]bool
	cover   Coverage
	forgot  []string
	refuse  error // Forget's error
	applied time.Time
}

func (f *fakeStage) Inspect(_ context.Context, key string) (Answer, error) {
	if key == "" {
		return Answer{}, fmt.Errorf("%w: empty", ErrBadInspectKey)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	held := f.owned[key]
	return Answer{Inspection: Inspection{Key: key, Found: held, InsideWindow: held}, Owner: held, Coverage: f.cover}, nil
}

func (f *fakeStage) Forget(_ context.Context, key string) (Forgot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse != nil {
		return Forgot{}, f.refuse
	}
	if !f.owned[key] {
		return Forgot{Key: key, Applied: time.Now(), Coverage: f.cover}, nil
	}
	f.forgot = append(f.forgot, key)
	return Forgot{Key: key, Held: true, Owner: true, Applied: f.applied, Coverage: f.cover}, nil
}

func (f *fakeStage) Status() InstanceStatus { return InstanceStatus{Ready: true} }

// TestClientTakesTheOwnersAnswer serves two instances of one group on a
// real server: inspect and forget return the owner's answer, whichever
// answers first; status collects both; forget returns the applied time,
// and a refusal comes back as the instance's error.
func TestClientTakesTheOwnersAnswer(t *testing.T) {
	srv := natstest.RunServer(t, "")
	nc, _ := natstest.Connect(t, srv.ClientURL())
	const subject = "dedupe.admin.test"
	applied := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a := &fakeStage{owned: map[string]bool{"k-a": true}, applied: applied}
	b := &fakeStage{owned: map[string]bool{"k-b": true}, applied: applied.Add(time.Hour)}
	for name, st := range map[string]*fakeStage{"a": a, "b": b} {
		svc, err := Serve(Options{Conn: nc, Subject: subject, Instance: name, Stage: st})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = svc.Stop() })
	}
	c := Client{Conn: nc, Subject: subject, Timeout: 2 * time.Second}
	ctx := context.Background()
	for range 10 { // whichever instance answers first
		for key, owner := range map[string]string{"k-a": "a", "k-b": "b"} {
			r, err := c.Inspect(ctx, key)
			if err != nil || r.Instance != owner || !r.Owner {
				t.Fatalf("Inspect(%s) = %+v, %v; want the answer of owner %s", key, r, err, owner)
			}
		}
	}
	for range 5 {
		for key, owner := range map[string]string{"k-a": "a", "k-b": "b"} {
			r, err := c.Forget(ctx, key)
			if err != nil || r.Instance != owner || !r.Owner || !r.Held {
				t.Fatalf("Forget(%s) = %+v, %v; want the answer of owner %s", key, r, err, owner)
			}
		}
	}
	if st, err := c.Status(ctx); err != nil || len(st) != 2 {
		t.Errorf("Status = %+v, %v; want both instances", st, err)
	}

	// One instance alone: a forget is applied, or its refusal returned.
	ca := Client{Conn: nc, Subject: subject + ".solo", Timeout: 2 * time.Second}
	svc, err := Serve(Options{Conn: nc, Subject: ca.Subject, Instance: "a", Stage: a})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	if r, err := ca.Forget(ctx, "k-a"); err != nil || !r.Held || !r.Applied.Equal(applied) || r.Instance != "a" {
		t.Errorf("Forget = %+v, %v; want held, applied at %v by a", r, err, applied)
	}
	cb := Client{Conn: nc, Subject: subject + ".refusing", Timeout: 2 * time.Second}
	b.refuse = errors.New("stage: store closed")
	svc, err = Serve(Options{Conn: nc, Subject: cb.Subject, Instance: "b", Stage: b})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	if _, err := cb.Forget(ctx, "k-b"); err == nil || !strings.Contains(err.Error(), "(503)") {
		t.Errorf("Forget refused = %v; want the 503 refusal", err)
	}
	if _, err := cb.Inspect(ctx, ""); err == nil || !strings.Contains(err.Error(), "(400)") {
		t.Errorf("Inspect of an empty key = %v; want 400", err)
	}
}

// TestClientWithNoInstance says at once that nothing serves the subject:
// the server answers that no one subscribes, and the client does not wait
// out its timeout.
func TestClientWithNoInstance(t *testing.T) {
	srv := natstest.RunServer(t, "")
	nc, _ := natstest.Connect(t, srv.ClientURL())
	c := Client{Conn: nc, Subject: "dedupe.admin.nobody", Timeout: 30 * time.Second}
	_, err := c.Inspect(context.Background(), "k")
	if !errors.Is(err, ErrNoAnswer) || !strings.Contains(err.Error(), "nothing subscribes") {
		t.Fatalf("Inspect with no instance = %v, want ErrNoAnswer saying nothing subscribes", err)
	}
}

// serve serves st as instance name on subject until the test ends.
func serve(t *testing.T, nc *nats.Conn, subject, name string, st Stage) {
	t.Helper()
	svc, err := Serve(Options{Conn: nc, Subject: subject, Instance: name, Stage: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
}

// TestClientAnswersOnceEveryPartitionsOwnerHas asks a group of two
// instances, which own two of four partitions each, about a key neither
// holds: inspect and forget answer not found and not held as soon as both
// have answered, long before the client's timeout. A group with an
// instance that does not say which partitions it owns (an older version)
// answers the same once the timeout is up.
func TestClientAnswersOnceEveryPartitionsOwnerHas(t *testing.T) {
	srv := natstest.RunServer(t, "")
	nc, _ := natstest.Connect(t, srv.ClientURL())
	const subject = "dedupe.admin.cover"
	serve(t, nc, subject, "a", &fakeStage{owned: map[string]bool{"k-a": true}, cover: Coverage{Partitions: 4, Owned: []int{0, 2}}})
	serve(t, nc, subject, "b", &fakeStage{owned: map[string]bool{"k-b": true}, cover: Coverage{Partitions: 4, Owned: []int{1, 3}}})
	const timeout = 30 * time.Second
	c := Client{Conn: nc, Subject: subject, Timeout: timeout}
	ctx := context.Background()
	for range 5 {
		start := time.Now()
		r, err := c.Inspect(ctx, "never-seen")
		if err != nil || r.Found || r.Owner {
			t.Fatalf("Inspect(never-seen) = %+v, %v; want not found", r, err)
		}
		f, err := c.Forget(ctx, "never-seen")
		if err != nil || f.Held || f.Owner {
			t.Fatalf("Forget(never-seen) = %+v, %v; want not held", f, err)
		}
		if took := time.Since(start); took >= timeout/2 {
			t.Fatalf("inspect and forget of a key no instance holds took %v; want them answered once both instances have, not at the %v timeout", took, timeout)
		}
		if r, err := c.Inspect(ctx, "k-b"); err != nil || !r.Found || !r.Owner || r.Instance != "b" {
			t.Fatalf("Inspect(k-b) = %+v, %v; want found by its owner b", r, err)
		}
	}

	old := Client{Conn: nc, Subject: subject + ".old", Timeout: 300 * time.Millisecond}
	serve(t, nc, old.Subject, "a", &fakeStage{cover: Coverage{Partitions: 4, Owned: []int{0, 1, 2}}})
	serve(t, nc, old.Subject, "b", &fakeStage{}) // says nothing of partition 3
	start := time.Now()
	r, err := old.Inspect(ctx, "never-seen")
	if err != nil || r.Found {
		t.Fatalf("Inspect(never-seen) of a group with an older instance = %+v, %v; want not found", r, err)
	}
	if took := time.Since(start); took < old.Timeout {
		t.Errorf("Inspect(never-seen) of a group with an older instance answered after %v, before its %v timeout: partition 3 has no answer", took, old.Timeout)
	}
}

// TestCoverage: the union of the partitions the answers own completes
// once it holds every partition with one partition count; a count that
// disagrees keeps it incomplete, and an answer with no count adds nothing.
func TestCoverage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answers []Coverage
		want    bool
	}{
		{"no answer", nil, false},
		{"one instance owns all", []Coverage{{Partitions: 3, Owned: []int{0, 1, 2}}}, true},
		{"union of two", []Coverage{{Partitions: 4, Owned: []int{0, 3}}, {Partitions: 4, Owned: []int{1, 2}}}, true},
		{"and one that owns nothing", []Coverage{{Partitions: 2, Owned: []int{}}, {Partitions: 2, Owned: []int{1}}, {Partitions: 2, Owned: []int{0}}}, true},
		{"a partition nobody owns", []Coverage{{Partitions: 4, Owned: []int{0, 1}}, {Partitions: 4, Owned: []int{3}}}, false},
		{"two claim one partition", []Coverage{{Partitions: 3, Owned: []int{0, 1}}, {Partitions: 3, Owned: []int{1}}}, false},
		{"counts disagree", []Coverage{{Partitions: 2, Owned: []int{0, 1}}, {Partitions: 4, Owned: []int{2, 3}}}, false},
		{"counts disagree after complete", []Coverage{{Partitions: 2, Owned: []int{0}}, {Partitions: 3, Owned: []int{0, 1, 2}}, {Partitions: 2, Owned: []int{1}}}, false},
		{"no list from an older instance", []Coverage{{}, {}}, false},
		{"an older instance beside owners of all", []Coverage{{}, {Partitions: 2, Owned: []int{0, 1}}}, true},
		{"a partition out of range", []Coverage{{Partitions: 2, Owned: []int{0, 2}}}, false},
		{"a partition listed twice", []Coverage{{Partitions: 2, Owned: []int{0, 0}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c coverage
			for _, a := range tc.answers {
				c.add(a)
			}
			if got := c.complete(); got != tc.want {
				t.Errorf("complete after %+v = %v, want %v", tc.answers, got, tc.want)
			}
		})
	}
}
