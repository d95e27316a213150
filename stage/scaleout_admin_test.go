package stage_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// TestScaleOutAdminAnswersAKeyNoInstanceHolds runs a group of two
// instances that own two partitions each, with the admin service on each:
// inspect and forget of a key never seen answer not found and not held as
// soon as both instances have answered (their owned partitions cover all
// four), not at the client's timeout; a key one of them holds is still
// answered by its owner.
func TestScaleOutAdminAnswersAKeyNoInstanceHolds(t *testing.T) {
	e := newScaleOutEnv(t)
	ea, eb := e.as("a"), e.as("b")
	payload := map[string][]byte{}
	round := 0
	batch := func() {
		var ks []string
		for i := range 20 {
			k := fmt.Sprintf("r%d-%d", round, i)
			payload[k] = []byte(k)
			ks = append(ks, k)
		}
		round++
		e.publishKeys(ks, payload)
	}
	a := ea.start()
	batch()
	e.scaleOutDrained(60 * time.Second)
	b := eb.start()
	natstest.Poll(t, 60*time.Second, 200*time.Millisecond, "a and b to own 2 partitions each", func() (bool, error) {
		batch()
		owned := [2]int{len(a.st.Status().Owned), len(b.st.Status().Owned)}
		return owned == [2]int{2, 2}, fmt.Errorf("a owns %v, b owns %v", a.st.Status().Owned, b.st.Status().Owned)
	})
	e.scaleOutDrained(60 * time.Second)

	const subject = "dedupe.admin.test"
	for name, r := range map[string]*running{"a": a, "b": b} {
		nc, _ := natstest.Connect(t, e.srv.ClientURL())
		svc, err := admin.Serve(admin.Options{Conn: nc, Subject: subject, Instance: name, Stage: r.st})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = svc.Stop() })
		if err := nc.Flush(); err != nil { // the server has the service's subscriptions
			t.Fatal(err)
		}
	}
	const timeout = 30 * time.Second
	c := admin.Client{Conn: e.nc, Subject: subject, Timeout: timeout}
	ctx := context.Background()

	start := time.Now()
	in, err := c.Inspect(ctx, "never-seen")
	if err != nil || in.Found || in.Owner {
		t.Fatalf("inspect never-seen = %+v, %v; want not found", in, err)
	}
	f, err := c.Forget(ctx, "never-seen")
	if err != nil || f.Held || f.Owner {
		t.Fatalf("forget never-seen = %+v, %v; want nothing held", f, err)
	}
	if took := time.Since(start); took >= timeout/2 {
		t.Errorf("inspect and forget of a key no instance holds took %v; want them answered once both instances have, not at the %v timeout", took, timeout)
	}

	key := "r0-0"
	p := partitionOf(key, 4)
	owner := "b"
	if slices.Contains(a.st.Status().Owned, p) {
		owner = "a"
	}
	in, err = c.Inspect(ctx, key)
	if err != nil || !in.Found || !in.Owner || in.Instance != owner {
		t.Errorf("inspect %s = %+v, %v; want found by %s, the owner of partition %d", key, in, err, owner, p)
	}
}
