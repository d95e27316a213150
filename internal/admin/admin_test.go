package admin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/stage"
)

// fakeStage answers as one instance of a group that owns the keys in
// owned, and holds them. For tests only.
type fakeStage struct {
	mu      sync.Mutex
	owned   map[string]bool
	forgot  []string
	refuse  error // Forget's error
	applied time.Time
}

func (f *fakeStage) Inspect(key string) (stage.Answer, error) {
	if key == "" {
		return stage.Answer{}, fmt.Errorf("%w: empty", stage.ErrBadInspectKey)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return stage.Answer{Inspection: stage.Inspection{Key: key, Found: true, InsideWindow: true}, Owner: f.owned[key]}, nil
}

func (f *fakeStage) Forget(_ context.Context, key string) (stage.Forgot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse != nil {
		return stage.Forgot{}, f.refuse
	}
	if !f.owned[key] {
		return stage.Forgot{Key: key, Applied: time.Now()}, nil
	}
	f.forgot = append(f.forgot, key)
	return stage.Forgot{Key: key, Held: true, Owner: true, Applied: f.applied}, nil
}

func (f *fakeStage) Status() stage.InstanceStatus { return stage.InstanceStatus{Ready: true} }

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
