package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// policyW is the window of TestPolicyGroupOwnerKilled. The checks after
// the kill must come within W of the copies before it, and the kill's
// hand-over takes the pin's TTL (ack_wait) and a restore: 12s was too
// short on a machine busy with three test lanes (the copies before the
// kill took 11.5s, the hand-over and the copies after it 12s, when the
// test still waited for the killed instance's presence to expire).
const policyW = 24 * time.Second

// TestPolicyGroupOwnerKilled runs version-wins (key.version, from the Ts
// header that every workload input carries), the sliding window
// (window.refresh_on_repeat, W = policyW) and `dedupe-stage forget` in a group
// of three instances on a 3-node cluster, and SIGKILLs the owner of the
// policy keys' partition between the forget and the keys' next copies
// (keys A, B and C hash to that one partition). Before the kill: B is
// forwarded; W/3 later B is repeated, A v1 and v3 and C are forwarded, C
// is forgotten through the CLI (`dedupe-stage forget -s <cluster>
// --scale-out`, whose answer must be the owner's, held), and B is repeated
// again. After it, the instance that takes the partition over judges A v2
// stale and forwards A v4; judges B after its first copy + W a repeat (the
// repeats moved its window); forwards C once, with the id
// `C:v1.forgotten.<applied_at ns>`, and judges the copy after it stale.
// The output holds exactly these forwards and the warm-up's, each once;
// nothing is dead-lettered; the survivors stop cleanly.
//
// A new owner that ignored the versions in the changelog would forward
// A v2 (an id the output must not hold); one that ignored the refresh
// records would forward B again (after the output's duplicate window:
// twice in the output); one that ignored the tombstone would judge C
// stale (its forgotten id missing). Each was checked by breaking the
// restore that way. The keys take the route step's local path too, which
// lost the version of such copies before its fix. It bounds times (the
// copies around the kill must come within W), so it runs alone, not in
// parallel (doc.go).
func TestPolicyGroupOwnerKilled(t *testing.T) {
	w := newWorkload(72, "pol", 4096)
	cl, stages, js := scaleOutGroupWith(t, 3, w, func(c *stageConfig) {
		c.KeyVersion = headerTime
		c.Extra += fmt.Sprintf("window:\n  paths: [{name: test, max: %s}]\n  margin: 0s\n  refresh_on_repeat: true\n", policyW)
	})
	parts := stages[0].cfg.Partitions
	scaleOutDrained(t, js, parts, takeoverWait)
	r := &policyRun{t: t, js: js, stages: stages}
	b := "pol-B"
	p := state.PartitionFNV([]byte(b), parts)
	a, c := keyIn("pol-A", p, parts), keyIn("pol-C", p, parts)
	ownerName, owner := r.owner(p) // the group has settled: the owner stays

	first := r.send(b, 1)
	time.Sleep(time.Until(first.Add(policyW / 3))) // on purpose: B's repeat a third of W later
	r.send(b, 1)
	a1 := r.send(a, 1)
	r.send(a, 3)
	c1 := r.send(c, 1)
	forgot := forgetCLI(t, cl.URLs(), c)
	if forgot.Partition == nil || *forgot.Partition != p || !forgot.Held || !forgot.Owner || forgot.Instance != ownerName {
		t.Fatalf("forget %s = %+v; want held and forgotten by %s, the owner of partition %d", c, forgot, ownerName, p)
	}
	if forgot.Applied.Before(c1) || time.Since(forgot.Applied) > time.Minute {
		t.Errorf("forget %s applied at %v, before its copy or far from now", c, forgot.Applied)
	}
	lastRefresh := r.send(b, 1)

	t.Logf("SIGKILL %s, the owner of partition %d", ownerName, p)
	owner.last().kill(t)
	killed := time.Now()
	before := r.outcomes()
	// Each copy is judged at the time the input stored it (about when it
	// was sent), however long the hand-over takes.
	a2 := r.send(a, 2)
	t.Logf("partition %d taken over and A v2 judged %v after the kill", p, time.Since(killed).Round(time.Millisecond))
	c2 := r.send(c, 1)
	inTime := a2.Before(a1.Add(policyW)) && c2.Before(c1.Add(policyW))
	time.Sleep(time.Until(first.Add(policyW + time.Second))) // on purpose: B's copy after its first + W
	b2 := r.send(b, 1)
	inTime = inTime && b2.Before(lastRefresh.Add(policyW))
	r.send(c, 1)
	r.send(a, 4)
	after := r.outcomes()
	t.Logf("since B's first copy: A and C sent at %v and %v, the kill at %v, the last check at %v (W %v)",
		a1.Sub(first).Round(time.Millisecond), c1.Sub(first).Round(time.Millisecond), killed.Sub(first).Round(time.Millisecond),
		time.Since(first).Round(time.Millisecond), policyW)
	if !inTime {
		t.Fatalf("the copies after the kill were sent past the keys' windows (A v2 %v, C %v, B %v after B's first): too slow to tell",
			a2.Sub(first).Round(time.Millisecond), c2.Sub(first).Round(time.Millisecond), b2.Sub(first).Round(time.Millisecond))
	}

	if n := after["new"] - before["new"]; n != 2 {
		t.Errorf("the survivors judged %v copies new after the kill, want 2 (C after the forget, A v4)", n)
	}
	if n := after["stale"] - before["stale"]; n != 3 {
		t.Errorf("the survivors judged %v copies stale after the kill, want 3 (A v2; B after first-seen + W; C after its forward)", n)
	}
	want := map[string][]byte{}
	for _, k := range w.keys {
		_, ts := totalOf(k)
		want[k+":v"+strconv.FormatInt(ts.Unix(), 10)] = w.forward[k]
	}
	for _, f := range []struct {
		id      string
		key     string
		version int
	}{{a + ":v1", a, 1}, {a + ":v3", a, 3}, {a + ":v4", a, 4}, {b + ":v1", b, 1}, {c + ":v1", c, 1},
		{fmt.Sprintf("%s:v1.forgotten.%d", c, forgot.Applied.UnixNano()), c, 1}} {
		want[f.id] = policyPayload(f.key, f.version)
	}
	scaleOutDrained(t, js, parts, 60*time.Second)
	checkOutput(t, js, want)
	checkDeadLetters(t, js, w.dead)
	for _, s := range stages {
		if s != owner {
			stopClean(t, s.last())
		}
	}
}

// keyIn returns the first key prefix-<i> in partition p of parts.
func keyIn(prefix string, p, parts int) string {
	for i := 0; ; i++ {
		if k := prefix + "-" + strconv.Itoa(i); state.PartitionFNV([]byte(k), parts) == p {
			return k
		}
	}
}

// policyPayload is the payload of every copy of key at version.
func policyPayload(key string, version int) []byte {
	return []byte(fmt.Sprintf(`{"event":%q,"version":%d}`, key, version))
}

// policyRun publishes the copies of TestPolicyGroupOwnerKilled one at a
// time.
type policyRun struct {
	t      *testing.T
	js     jetstream.JetStream
	stages []*stage
	sent   int
}

// send publishes a copy of key whose version (the Ts header) is version,
// waits until a running instance has judged it, and returns when it was
// published.
func (r *policyRun) send(key string, version int) time.Time {
	r.t.Helper()
	base := r.judged()
	at := r.post(key, version)
	natstest.WaitFor(r.t, takeoverWait, fmt.Sprintf("%s v%d to be judged", key, version), func() bool {
		return r.judged() > base
	})
	return at
}

// post publishes a copy of key whose version (the Ts header) is version,
// and returns when it was published.
func (r *policyRun) post(key string, version int) time.Time {
	r.t.Helper()
	r.sent++
	h := nats.Header{}
	h.Set(headerKey, key)
	h.Set(headerTime, strconv.Itoa(version))
	h.Set(jetstream.MsgIDHeader, "policy-"+strconv.Itoa(r.sent))
	at := time.Now()
	natstest.PublishAll(r.t, r.js, []*nats.Msg{{Subject: "events.faults", Header: h, Data: policyPayload(key, version)}})
	return at
}

// judged returns how many messages the running instances have judged.
func (r *policyRun) judged() float64 {
	n := 0.0
	for _, v := range r.outcomes() {
		n += v
	}
	return n
}

// outcomes returns the running instances' judged messages by outcome.
func (r *policyRun) outcomes() map[string]float64 {
	out := map[string]float64{}
	for _, s := range r.stages {
		if !s.last().Running() {
			continue
		}
		for _, o := range []string{"new", "repeat", "stale", "dead_letter", "dropped"} {
			out[o] += s.metric("dedupe_messages_total", "outcome", o)
		}
	}
	return out
}

// owner returns the name of the instance whose status lists partition p
// as owned, and its stage (instance i<n> is stages[n], as scaleOutGroup
// names them).
func (r *policyRun) owner(p int) (string, *stage) {
	r.t.Helper()
	nc, _ := natstest.Connect(r.t, r.stages[0].cfg.NATSURL)
	defer nc.Close()
	st, err := admin.Client{Conn: nc, Subject: "dedupe.admin.dedupe", Timeout: 5 * time.Second}.Status(context.Background())
	if err != nil {
		r.t.Fatalf("status of the group: %v", err)
	}
	for _, s := range st {
		n, err := strconv.Atoi(strings.TrimPrefix(s.Instance, "i"))
		if slices.Contains(s.Owned, p) && err == nil && n >= 0 && n < len(r.stages) {
			return s.Instance, r.stages[n]
		}
	}
	r.t.Fatalf("no instance owns partition %d: %+v", p, st)
	return "", nil
}

// forgetCLI runs `dedupe-stage forget` with the connection flags alone (no
// configuration file) and returns its answer.
func forgetCLI(tb testing.TB, urls, key string) admin.ForgetReply {
	tb.Helper()
	out, err := exec.Command(stageBin, "forget", "-s", urls, "--scale-out", "--timeout", "15s", key).CombinedOutput()
	var f admin.ForgetReply
	if err != nil || json.Unmarshal(out, &f) != nil {
		tb.Fatalf("dedupe-stage forget %s: %v\n%s", key, err, out)
	}
	return f
}
