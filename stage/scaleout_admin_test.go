package stage_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// TestScaleOutAdminAnswersAKeyNoInstanceHolds runs a group of two
// instances that own two partitions each, with the admin service on each:
// inspect and forget of a key never seen answer not found and not held as
// soon as both instances have answered (their owned partitions cover all
// four), not at the client's timeout; a key one of them holds is still
// answered by its owner. Once another instance takes a partition's fence,
// its former owner's answers no longer cover that partition, though it
// has not yet noticed the loss: the client waits for the new owner, which
// holds the partition's keys, instead of answering "not held" for them.
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

	// The owner of the key's partition loses it to "other", which takes
	// the fence as a takeover does; the former owner has no batch to be
	// refused yet, so it still counts the partition as its own.
	r := a
	if owner == "b" {
		r = b
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := changelog.Take(fctx, e.js, e.cfg.Output.Stream, changelog.FenceSubject(e.cfg.Output.SubjectPrefix, p), "other"); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(r.st.Status().Owned, p) {
		t.Fatalf("%s no longer counts partition %d as its own: the loss is noticed before the answer, nothing to test", owner, p)
	}
	for _, what := range []string{"inspect", "forget"} {
		var c admin.Coverage
		switch what {
		case "inspect":
			ans, err := r.st.Inspect(fctx, "never-seen")
			if err != nil {
				t.Fatal(err)
			}
			c = ans.Coverage
		default:
			f, err := r.st.Forget(fctx, "never-seen")
			if err != nil {
				t.Fatal(err)
			}
			c = f.Coverage
		}
		if slices.Contains(c.Owned, p) {
			t.Errorf("%s of a key by %s, whose partition %d another instance took: covers %v; want it left out", what, owner, p, c.Owned)
		}
	}
}
