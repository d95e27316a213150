package faults

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/netfault"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// logRestoring is the line an instance logs when it starts restoring a
// partition from the output stream (no snapshot is usable in these tests).
const logRestoring = `"msg":"scale-out: restoring the partition without its snapshot"`

// cuts returns how many connections the proxies have cut and reset.
func cuts(ps []*netfault.Proxy) (cut, reset int) {
	for _, p := range ps {
		s := p.Stats()
		cut, reset = cut+s.Cut, reset+s.Reset
	}
	return cut, reset
}

// armCut arms a cut of a's next connection to carry n more bytes in
// direction d, on every proxy (a uses one node at a time), and waits up to
// timeout until one proxy cut; it reports whether one did.
func armCut(ps []*netfault.Proxy, d netfault.Direction, n int64, reset bool, timeout time.Duration) bool {
	before, _ := cuts(ps)
	for _, p := range ps {
		p.CutAfter(d, n, reset)
	}
	ok := natstest.Until(timeout, 2*time.Millisecond, func() bool { c, _ := cuts(ps); return c > before })
	for _, p := range ps {
		p.CutAfter(d, -1, false) // disarm the others
	}
	return ok
}

var takenLine = regexp.MustCompile(`"msg":"scale-out: partition taken","partition":(\d+).*"readers_replaced":(\d+),"took":"([^"]+)"`)

// TestConnectionsDieMidWrite breaks an instance's connections in the
// middle of what it writes and reads: two instances of a group on a
// 3-node cluster, a behind proxies, output published as atomic batches.
// While inputs arrive, a's connection is cut eight times a random number
// of bytes (1 to 64 KiB) into what it sends, half with a reset and half
// with a close: mostly in the middle of an atomic batch of forwards or
// routed copies. Then b is SIGKILLed, and as a starts restoring b's
// partitions from the output stream, a's connection is cut 0.5 to 2.5 KiB
// into what the server sends it: during the restore's reads, or just after. Every
// key is in the output once and every bad input dead-lettered once.
func TestConnectionsDieMidWrite(t *testing.T) {
	t.Parallel()
	c := newClock(t)
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 4))
	w := newWorkload(seed, "midwrite", 4096)
	cl := natstest.StartClusterWith(t, 3, noClientAdvertise)
	proxies, proxied := clientProxies(t, cl)
	a := newStage(t, scaleOutConfig(t, proxied, "a"))
	b := newStage(t, scaleOutConfig(t, cl.URLs(), "b"))
	stages := []*stage{a, b}
	for _, s := range stages {
		s.startReady()
	}
	js := publisherJS(t, cl.URLs())
	warmUp(t, js, stages, w)
	parts := a.cfg.Partitions
	if !strings.Contains(a.last().Log(), `"msg":"output published as atomic batches"`) {
		t.Fatalf("a does not publish its output as atomic batches:\n%s", proctest.Tail(a.last().Log(), 3000))
	}

	wait := publishBehind(t, js, w.mix(6000, 0.3, 0.02, 0), "run", 400)
	outputGrows(t, js, 300, "the group at work")
	landed := 0
	for i := range 8 {
		n, reset := int64(1+rng.IntN(64<<10)), i%2 == 0
		if armCut(proxies, netfault.Up, n, reset, 5*time.Second) {
			landed++
			c.logf("a's connection cut %d bytes into what it sends (reset %v)", n, reset)
		} else {
			c.logf("a sent fewer than %d bytes in 5s: no cut", n)
		}
		time.Sleep(time.Duration(200+rng.IntN(300)) * time.Millisecond) // on purpose: the stage reconnects and gets going
	}
	if landed < 4 {
		t.Errorf("%d of 8 cuts of a's writes landed, want at least 4", landed)
	}

	outputGrows(t, js, 100, "the group after the cuts")
	from := len(a.last().Log())
	c.logf("SIGKILL b")
	b.last().kill(t)
	if !natstest.Until(takeoverWait, 2*time.Millisecond, func() bool { return strings.Contains(a.last().Log()[from:], logRestoring) }) {
		t.Fatalf("a never began restoring b's partitions")
	}
	n := int64(512 + rng.IntN(2<<10))
	if armCut(proxies, netfault.Down, n, false, 10*time.Second) {
		c.logf("a is restoring: its connection cut %d bytes into what the server sends it", n)
	} else {
		t.Errorf("the server sent a fewer than %d bytes in 10s after its restore began", n)
	}
	if !natstest.Until(takeoverWait, 50*time.Millisecond, func() bool { return a.owned() == parts }) {
		// SIGQUIT: the stacks say what the takeover waits for.
		a.last().Signal(syscall.SIGQUIT)
		a.last().Wait(5 * time.Second)
		t.Fatalf("a owns %d of %d partitions %v after b was killed; its log since:\n%s\nits goroutines:\n%s",
			a.owned(), parts, takeoverWait, proctest.Tail(a.last().Log()[from:], 6000), goroutines(a.last().Log()))
	}
	for _, m := range takenLine.FindAllStringSubmatch(a.last().Log()[from:], -1) {
		c.logf("a took partition %s, %s readers replaced, in %s", m[1], m[2], m[3])
	}
	wait()
	scaleOutDrained(t, js, parts, 90*time.Second)
	c.logf("starting b again")
	b.startReady()
	waitSpread(t, js, w, stages, takeoverWait)
	scaleOutDrained(t, js, parts, 60*time.Second)
	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)
	if t.Failed() {
		logDoubled(t, js, stages) // which batches wrote a key twice, and the hand-overs around them
	}
	cut, _ := cuts(proxies)
	c.logf("%d connections cut; a: %s; warnings %v", cut, a.groupReport(), warnings(a.last().Log(), 0))
}
