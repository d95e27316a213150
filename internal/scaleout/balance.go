package scaleout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/pcgroups"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/ensure"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/route"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// Balance (docs/scale-out.md §4.2): an instance owning more than its quota
// of the live instances' share releases the partitions it ranks lowest.
// Balance decides who asks first, never who may write: the fence does that,
// so a wrong count costs a move, never a duplicate.

// quota is how many of n partitions instance self may own when live
// (sorted by name) are the live instances: the first n mod k of them
// ⌊n/k⌋+1, the others ⌊n/k⌋, so that the quotas add up to n and the group
// settles at ⌈n/k⌉ or ⌊n/k⌋ partitions each. An instance not in live (its
// key not seen yet) gets ⌈n/k⌉.
func quota(self string, live []string, n int) int {
	k := max(len(live), 1)
	i, found := slices.BinarySearch(live, self)
	if !found {
		return (n + k - 1) / k
	}
	q := n / k
	if i < n%k {
		q++
	}
	return q
}

// rankScore is how much instance wants partition p: the highest score
// among the live instances is the partition's preferred owner.
func rankScore(p int, instance string) uint64 {
	return xxhash.Sum64String(strconv.Itoa(p) + "/" + instance)
}

// assign returns each of n partitions' assigned owner among live (sorted
// by name): every (partition, instance) pair is taken in descending
// rankScore, and a partition goes to the first instance of its pairs that
// is still under its quota. Every instance computes the same assignment
// from the same live set, so the group agrees on it without talking; the
// quotas add up to n, so every partition is assigned.
func assign(live []string, n int) []string {
	type pair struct {
		p     int
		inst  string
		score uint64
	}
	pairs := make([]pair, 0, n*len(live))
	for p := range n {
		for _, inst := range live {
			pairs = append(pairs, pair{p, inst, rankScore(p, inst)})
		}
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		case a.p != b.p:
			return a.p - b.p
		}
		return strings.Compare(a.inst, b.inst)
	})
	owner := make([]string, n)
	count := map[string]int{}
	for _, pr := range pairs {
		if owner[pr.p] == "" && count[pr.inst] < quota(pr.inst, live, n) {
			owner[pr.p] = pr.inst
			count[pr.inst]++
		}
	}
	return owner
}

// presence is this instance's key in the presence bucket, and what a
// watch of the bucket saw of the others'.
type presence struct {
	kv    jetstream.KeyValue
	self  string
	every time.Duration
	ttl   time.Duration

	mu       sync.Mutex
	watching bool                 // the watch runs: seen is the count
	synced   bool                 // the watch has delivered every key the bucket held
	seen     map[string]time.Time // instance -> when its key was last put (the server's time)
	heard    map[string]time.Time // instance -> when the watch delivered its last put (this clock)
	forms    map[string][]int     // instance -> the bundle forms its key says it reads
	changed  chan struct{}        // signalled when another instance's key appears or is deleted, and once synced
}

// presenceValue is what an instance puts under its key: when, and the
// bundle forms it reads. BundleForms lists them (route.BundleForm1 and
// route.BundleForm2); BundleForm says "1", which is what a version that
// reads form 1 alone puts and looks for, so that such a version keeps
// writing form-1 bundles to this one. An instance of a version before
// bundles puts the time alone, as RFC 3339 text, which reads as no form.
type presenceValue struct {
	At          time.Time `json:"at"`
	BundleForm  string    `json:"reads_bundle_form,omitempty"`
	BundleForms []int     `json:"reads_bundle_forms,omitempty"`
}

// ownPresence is this version's presence value at at.
func ownPresence(at time.Time) presenceValue {
	return presenceValue{At: at, BundleForm: "1", BundleForms: []int{route.BundleForm1, route.BundleForm2}}
}

// readsForms returns the bundle forms a presence value says its instance
// reads; none for a version before bundles.
func readsForms(v []byte) []int {
	var pv presenceValue
	if json.Unmarshal(v, &pv) != nil {
		return nil
	}
	if len(pv.BundleForms) > 0 {
		return pv.BundleForms
	}
	if pv.BundleForm == "1" {
		return []int{route.BundleForm1}
	}
	return nil
}

// ready reports whether the live instances are known: the watch has
// delivered every key the bucket held, or it does not run (then the
// bucket's keys are read at each refresh).
func (pr *presence) ready() bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return !pr.watching || pr.synced
}

// commonForm returns the newest bundle form every live instance's key
// says it reads, 0 for none: 0 until the watch has seen every key the
// bucket held, and 0 without the watch (the keys alone do not say).
func (pr *presence) commonForm() int {
	for _, form := range []int{route.BundleForm2, route.BundleForm1} {
		if pr.allRead(form) {
			return form
		}
	}
	return 0
}

// allRead reports whether every live instance's key says it reads bundle
// form: false until the watch has seen every key the bucket held, and
// false without the watch.
func (pr *presence) allRead(form int) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if !pr.watching || !pr.synced {
		return false
	}
	now := time.Now()
	for k, at := range pr.seen {
		if now.Sub(at) < pr.ttl && !slices.Contains(pr.forms[k], form) {
			return false
		}
	}
	return len(pr.seen) > 0
}

// openPresence opens (creating it when missing) the presence bucket; the
// instances of a group starting together all open it at once
// (ensure.Open).
func openPresence(ctx context.Context, js jetstream.JetStream, o Options, self string, log *slog.Logger) (*presence, error) {
	bucket, every, ttl := layout.Presence(o.Group, o.AckWait)
	kv, _, err := ensure.Open(ctx, "scale-out: presence bucket "+bucket, func(ctx context.Context) (jetstream.KeyValue, error) {
		return js.KeyValue(ctx, bucket)
	}, func(ctx context.Context) (jetstream.KeyValue, error) {
		return js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, TTL: ttl, Replicas: o.Replicas,
			Description: "dedupe-stage: the live instances of group " + o.Group + ", for balance only"})
	}, ensure.Options{Logger: log})
	if err != nil {
		return nil, err
	}
	return &presence{kv: kv, self: self, every: every, ttl: ttl, seen: map[string]time.Time{}, heard: map[string]time.Time{},
		forms: map[string][]int{}, changed: make(chan struct{}, 1)}, nil
}

// watch follows the bucket's keys until ctx is done, so that the count
// follows a join or a leave at once instead of at the next refresh. A
// key that expired (its instance stopped refreshing) makes no event: live
// counts it until ttl after its last put, a release for two refreshes at
// most (releaseCount).
func (pr *presence) watch(ctx context.Context) error {
	w, err := pr.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("scale-out: watch the presence bucket: %w", err)
	}
	pr.mu.Lock()
	pr.watching = true
	pr.mu.Unlock()
	go pr.follow(ctx, w)
	return nil
}

// follow applies the watch's updates until ctx is done or the watch ends.
func (pr *presence) follow(ctx context.Context, w jetstream.KeyWatcher) {
	defer func() {
		_ = w.Stop()
		pr.mu.Lock()
		pr.watching = false
		pr.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil { // the initial values are all in
				pr.mu.Lock()
				pr.synced = true
				pr.mu.Unlock()
				pr.signalChanged() // balance counts again, and the bundle gate opens now if it may
				continue
			}
			if pr.apply(e) {
				pr.signalChanged()
			}
		}
	}
}

// apply records one key's put or delete, and reports whether it is another
// instance joining or leaving (a clean stop deletes its key): balance
// then runs at once, not at its next refresh, so that the instance
// assigned a leaving one's partitions pulls on them before they are
// unpinned.
func (pr *presence) apply(e jetstream.KeyValueEntry) (changed bool) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	_, had := pr.seen[e.Key()]
	if e.Operation() != jetstream.KeyValuePut {
		delete(pr.seen, e.Key())
		delete(pr.heard, e.Key())
		delete(pr.forms, e.Key())
		return had && e.Key() != pr.self
	}
	pr.seen[e.Key()] = e.Created()
	heard := time.Now()
	if !pr.synced && e.Created().Before(heard) { // a value the bucket held before the watch: put then, not now
		heard = e.Created()
	}
	pr.heard[e.Key()] = heard
	pr.forms[e.Key()] = readsForms(e.Value())
	return !had && e.Key() != pr.self
}

// signalChanged wakes whoever waits on changed, without blocking.
func (pr *presence) signalChanged() {
	select {
	case pr.changed <- struct{}{}:
	default:
	}
}

// refresh puts this instance's key and returns the live instances (with
// this one).
func (pr *presence) refresh(ctx context.Context) ([]string, error) {
	if err := pr.put(ctx); err != nil {
		return nil, err
	}
	live, err := pr.live(ctx)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(live, pr.self) {
		live = append(live, pr.self)
	}
	slices.Sort(live)
	return live, nil
}

// live returns the instances the watch saw put a key within its TTL, or
// the bucket's keys when the watch does not run.
func (pr *presence) live(ctx context.Context) ([]string, error) {
	pr.mu.Lock()
	if pr.watching {
		live := []string{}
		now := time.Now()
		for k, at := range pr.seen {
			if now.Sub(at) < pr.ttl {
				live = append(live, k)
			}
		}
		pr.mu.Unlock()
		return live, nil
	}
	pr.mu.Unlock()
	live, err := pr.kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		live, err = nil, nil
	}
	return live, err
}

// releaseCount returns the instances (sorted, with self) that a release
// for balance counts (docs/scale-out.md §4.2): self, and each other
// instance whose put was heard (heard: instance -> when) within fresh
// before now and after took, when this instance last took a partition.
// A crashed instance puts no more, and the partitions it held come to a
// survivor only after its pins expired, so the survivor does not count it
// and keeps what it took; a live instance puts every presence refresh, so
// it counts again within one. Leaving an instance out only makes self's
// quota larger: a release waits, none is added.
func releaseCount(self string, heard map[string]time.Time, now, took time.Time, fresh time.Duration) []string {
	live := []string{self}
	for k, at := range heard {
		if k != self && now.Sub(at) < fresh && at.After(took) {
			live = append(live, k)
		}
	}
	slices.Sort(live)
	return live
}

// forRelease returns the instances a release for balance counts when this
// instance last took a partition at took (releaseCount, within two
// presence refreshes), or live when the watch does not run.
func (pr *presence) forRelease(live []string, took time.Time) []string {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if !pr.watching {
		return live
	}
	return releaseCount(pr.self, pr.heard, time.Now(), took, 2*pr.every)
}

// leave deletes this instance's key, so the others count one less at
// once.
func (pr *presence) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = pr.kv.Delete(ctx, pr.self)
}

// balanceSettle is how long after a change of the live instances an owner
// waits before it releases a partition the change assigns to another: the
// others have stopped standing by for it by then (they leave at once), so
// the one it is assigned to gets it.
const balanceSettle = 500 * time.Millisecond

// balance runs until ctx is done (docs/scale-out.md §4.2): once the
// presence watch knows the live instances, then at every change of them
// and every presence refresh, it assigns the partitions among the live
// instances (assign), takes the unpinned ones assigned to this instance
// before any message comes (pretake), releases what it owns that is
// assigned to another instance it counts, and consumes the members it is
// assigned, owns, or stands by for.
func (g *Group) balance(ctx context.Context, pr *presence, m *members, store *state.Store) {
	n := g.opts.Partitions
	t := time.NewTicker(pr.every)
	defer t.Stop()
	settle := time.NewTimer(0)
	defer settle.Stop()
	if err := pr.watch(ctx); err != nil {
		g.log.Warn("scale-out: presence watch failed; balance counts what this instance puts only", "err", err)
	}
	var beats sync.WaitGroup
	defer beats.Wait()
	beats.Go(func() { g.heartbeat(ctx, pr, m) })
	asked := map[int]bool{} // released on request (Release): left to the others until one is pinned
	// Partitions released for balance that this instance succeeds but
	// does not pull on yet, with when: they are asked about every
	// rejoinEvery until it does (rejoin), so that it stands by once the
	// new owner holds the fence rather than at the next refresh (a kill
	// right after a move).
	released := map[int]time.Time{}
	follow := time.NewTimer(time.Hour)
	follow.Stop()
	defer follow.Stop()
	var last []string
	var changed time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-g.releaseNow:
			asked[p] = true
			g.releaseForBalance(ctx, m, p, "asked")
			continue
		case <-pr.changed:
		case <-t.C:
		case <-settle.C:
		case <-follow.C:
			if g.rejoin(ctx, m, released, pr.every, true) {
				follow.Reset(rejoinEvery)
			}
			continue
		}
		if !pr.ready() {
			continue
		}
		live, err := pr.refresh(ctx)
		if err != nil {
			if ctx.Err() == nil {
				g.log.Warn("scale-out: presence refresh failed; balance waits", "err", err)
			}
			continue
		}
		g.setBundles(pr.commonForm(), len(live))
		now := time.Now()
		if !slices.Equal(live, last) {
			if last != nil {
				g.log.Info("scale-out: the live instances changed; partitions assigned again", "live_instances", live)
			}
			last, changed = live, now
			settle.Reset(balanceSettle)
		}
		want := assign(live, n)
		g.setAssigned(want)
		g.standBy(live, want, now.Sub(changed))
		g.setSuccessors(live, want)
		settled := now.Sub(changed) >= balanceSettle
		owned := g.stillOwned(ctx)
		if settled {
			for _, p := range g.releaseAssigned(ctx, m, pr.forRelease(live, g.lastTake()), want, owned, len(live)) {
				released[p] = now
			}
		}
		g.consume(ctx, m, store, want, asked, settled)
		if g.rejoin(ctx, m, released, pr.every, false) {
			follow.Reset(rejoinEvery)
		}
	}
}

// rejoin forgets the partitions of released (released for balance, with
// when) that this instance pulls on, no longer succeeds, or released
// longer than within ago; with ask, it first pulls on each other one whose
// assigned owner is pinned and holds its fence, as consume does for a
// settled successor. It reports whether any is left.
func (g *Group) rejoin(ctx context.Context, m *members, released map[int]time.Time, within time.Duration, ask bool) bool {
	for p, at := range released {
		if ask && g.successorOf(p) && !m.consuming(p) {
			to := g.assignedTo(p)
			if pin, err := g.pinOf(ctx, p); err == nil && pin != "" && to != "" && to != g.instance && g.fenceHeldBy(ctx, p, to) {
				m.ensure(ctx, p)
			}
		}
		if m.consuming(p) || !g.successorOf(p) || time.Since(at) > within {
			delete(released, p)
		}
	}
	return len(released) > 0
}

// releaseAssigned releases for balance each partition of owned that want
// assigns to another instance counted (presence.forRelease), side by
// side, since each release watches its hand-off for a moment
// (awaitHandOff), and returns the partitions released.
func (g *Group) releaseAssigned(ctx context.Context, m *members, counted, want []string, owned []int, live int) []int {
	var released []int
	var releases sync.WaitGroup
	for _, p := range owned {
		if to := want[p]; to != g.instance && slices.Contains(counted, to) {
			released = append(released, p)
			releases.Go(func() {
				g.releaseForBalance(ctx, m, p, "balance")
				g.log.Info("scale-out: partition released for balance", "partition", p, "to", to, "owned", len(owned), "live_instances", live)
			})
		}
	}
	releases.Wait()
	return released
}

// rejoinEvery is how often balance asks about a partition it released
// for balance while this instance, one of its successors, does not pull
// on it yet (rejoin; for at most a presence refresh): only those
// partitions, not a whole pass.
const rejoinEvery = time.Second

// fenceHeldBy reports whether instance holds partition p's fence, as the
// output stream's leader has it.
func (g *Group) fenceHeldBy(ctx context.Context, p int, instance string) bool {
	holder, err := changelog.FenceHolder(ctx, g.js, g.outStream, changelog.FenceSubject(g.prefix, p))
	return err == nil && holder == instance
}

// consume makes this instance consume the members it should, given want
// (each partition's assigned owner): a partition assigned here, unless
// it was released on request and nobody is pinned to it yet (asked), and
// one it owns; it takes an assigned one that nobody is pinned to before
// any message comes (pretake). It stands by for another instance's
// partition only as one of its successors (setSuccessors), and only once
// the live instances have settled, the partition is
// pinned, and the instance it is assigned to holds its fence: so its pulls
// never take a partition from the instance it is assigned to (one nobody
// is pinned to, or one its owner is releasing to that instance), yet take
// one whose owner died once the pin's TTL has passed.
func (g *Group) consume(ctx context.Context, m *members, store *state.Store, want []string, asked map[int]bool, settled bool) {
	var joins sync.WaitGroup
	// First what this instance owns or is assigned, so that it pulls on
	// them before the standbys' checks ask the server anything.
	var others []int
	for p, to := range want {
		owns, mine := g.holds(p), to == g.instance && !asked[p]
		if !owns && !mine {
			others = append(others, p)
			continue
		}
		joins.Go(func() { m.ensure(ctx, p) })
		if !owns {
			g.pretake(ctx, store, p)
		}
	}
	for _, p := range others {
		if want[p] != g.instance && !g.successorOf(p) {
			// Neither assigned here nor a successor: nothing to ask.
			if !g.holds(p) {
				m.leave(p)
			}
			continue
		}
		pin, err := g.pinOf(ctx, p)
		pinned := err == nil && pin != ""
		if pinned {
			delete(asked, p)
		}
		switch {
		case settled && pinned && want[p] != g.instance && g.fenceHeldBy(ctx, p, want[p]):
			joins.Go(func() { m.ensure(ctx, p) })
		case !g.holds(p): // a takeover since the check keeps its member
			m.leave(p)
		}
	}
	joins.Wait()
}

// releaseForBalance gives partition p up (docs/scale-out.md §7). What
// p's member delivers from now on is kept aside; the batch in flight
// finishes (the worker's busy token), the tenure ends, and p is unpinned
// while its member still consumes, so that nothing the client buffered is
// dropped. Then it stops consuming p and gives back (nak) what it kept
// aside, and its worker gives back what it still holds of p: the next
// owner gets all of it at once instead of after input.ack_wait.
func (g *Group) releaseForBalance(ctx context.Context, m *members, p int, why string) {
	g.mu.Lock()
	if g.diverted == nil {
		g.diverted = make(map[int][]jetstream.Msg)
	}
	g.diverted[p] = nil
	g.mu.Unlock()
	g.busy[p].Lock()
	g.mu.Lock()
	pins := map[string]bool{g.owned[p]: true}
	g.mu.Unlock()
	g.release(p)
	// A partition taken before traffic may be pinned here by now, its
	// first messages not judged yet: it is unpinned all the same, and an
	// unpin of a partition nobody is pinned to is no failure.
	if err := pcgroups.StaticMemberStepDown(ctx, g.js, g.inStream, g.name, layout.Member(p)); err != nil && !pins[pretakePin] {
		g.log.Warn("scale-out: unpin for balance failed; the partition moves after the pin's TTL", "partition", p, "why", why, "err", err)
	}
	g.busy[p].Unlock()
	// A successor whose partition went to another pin keeps pulling on
	// it, as it would from its next balance pass on: should the new
	// owner die now, its pull is the one the server pins after the
	// detection's unpin (docs/scale-out.md §4.3), not one it joins then.
	if held := g.awaitHandOff(ctx, p, pins, why); held == "" || why != "balance" || !g.successorOf(p) {
		m.leave(p)
	}
	g.mu.Lock()
	kept := g.diverted[p]
	delete(g.diverted, p)
	g.mu.Unlock()
	giveBackMsgs(kept)
	g.metrics.stale.WithLabelValues(strconv.Itoa(p)).Add(float64(len(kept)))
	g.metrics.released.WithLabelValues(strconv.Itoa(p)).Inc()
}

// handOffQuiet is how long a releasing instance watches the pin its
// partition's step-down gave before it stops consuming: a pin of its own
// member's shows within it, as the messages the server sends under it
// (kept aside); one that shows none is another instance's, or nobody
// pulls. handOffWait bounds the watch.
const (
	handOffQuiet = 150 * time.Millisecond
	handOffWait  = 2 * time.Second
)

// awaitHandOff watches partition p after its step-down, while this
// instance's member still consumes it (its messages kept aside, pins
// holding the pins seen): when the server pinned this instance's member
// again (messages kept aside came under the new pin), it unpins p once
// more; it returns once another pin, or none, has held for handOffQuiet
// with no message of this instance's under it, or after handOffWait.
// Stopping the member first would leave its pull waiting on the server,
// which may pin it after it stopped: the partition would then wait for
// the pin's TTL. Unpinning a pin that is another instance's would cost
// that instance its pull's expiry, so a pin is unpinned only on evidence.
// It returns the other instance's pin that held, "" when none did.
func (g *Group) awaitHandOff(ctx context.Context, p int, pins map[string]bool, why string) (held string) {
	deadline := time.Now().Add(handOffWait)
	var since time.Time
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(handOffQuiet / 3)
		g.mu.Lock()
		for _, msg := range g.diverted[p] {
			pins[msg.Headers().Get(HeaderPinID)] = true
		}
		g.mu.Unlock()
		now, err := g.pinOf(ctx, p)
		switch {
		case err != nil:
			continue
		case now != "" && pins[now]:
			if err := pcgroups.StaticMemberStepDown(ctx, g.js, g.inStream, g.name, layout.Member(p)); err != nil {
				g.log.Warn("scale-out: unpin failed; the partition moves after the pin's TTL", "partition", p, "why", why, "err", err)
				return ""
			}
			held, since = "", time.Time{}
		case since.IsZero() || now != held:
			held, since = now, time.Now()
		case time.Since(since) >= handOffQuiet:
			return held
		}
	}
	return ""
}

// stillOwned returns the partitions this instance owns after asking the
// server, for each, whether the pin it owns it under is still the pinned
// one. A partition whose pin moved (it expired, or another instance was
// pinned after an unpin) sends its old owner nothing more, so only the
// server can tell: its tenure ends here, as after a release, and balance
// counts only what the server still pins to this instance. A partition
// whose check fails, or that is pinned to nobody for the moment, is
// counted as owned.
func (g *Group) stillOwned(ctx context.Context) []int {
	g.mu.Lock()
	owned := maps.Clone(g.owned)
	g.mu.Unlock()
	var still []int
	for p, pin := range owned {
		if pin == pretakePin {
			// Taken before any message: no pin to ask about, so the
			// fence says whether another instance took it since.
			holder, err := changelog.FenceHolder(ctx, g.js, g.outStream, changelog.FenceSubject(g.prefix, p))
			if err == nil && holder != g.instance {
				g.lose(p, pin)
				g.log.Info("scale-out: partition taken before traffic was taken by another instance since", "partition", p, "by", holder)
				continue
			}
			still = append(still, p)
			continue
		}
		now, err := g.pinOf(ctx, p)
		if err == nil && now != "" && now != pin {
			g.lose(p, pin)
			g.log.Info("scale-out: partition's pin moved to another client; its tenure here ends", "partition", p)
			continue
		}
		still = append(still, p)
	}
	return still
}

// release ends this instance's tenure of partition p for balance: the
// worker treats what it still receives under the pin it owned p with as
// delivered under a lost pin.
func (g *Group) release(p int) {
	g.mu.Lock()
	pin, ok := g.owned[p]
	g.mu.Unlock()
	if ok {
		g.lose(p, pin)
	}
}

// lose ends this instance's tenure of partition p under pin, unless the
// worker owns it under another pin by now: the worker treats what it
// still receives under pin as delivered under a lost pin.
func (g *Group) lose(p int, pin string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.owned[p] == pin {
		g.lost[p] = pin
		delete(g.owned, p)
		delete(g.pre, p)
		g.metrics.owned.Set(float64(len(g.owned)))
	}
}

// takeLost returns the pin partition p was released under, once, or "".
func (g *Group) takeLost(p int) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	pin := g.lost[p]
	delete(g.lost, p)
	return pin
}

// setBundles sets the bundle form the route step writes: the newest that
// every live instance's presence says it reads (presence.commonForm), or
// 0 to route every copy alone; a change is logged once. A group with an
// instance of a version before bundles, or without presence, routes
// every copy alone.
func (g *Group) setBundles(form, live int) {
	if g.opts.BundleMax <= 1 {
		form = 0
	}
	if form > 0 {
		g.metrics.bundlesOn.Set(1)
	} else {
		g.metrics.bundlesOn.Set(0)
	}
	if g.bundles.Swap(int32(form)) == int32(form) {
		return
	}
	if form > 0 {
		g.log.Info("scale-out: the route step writes bundles: every live instance reads their form", "form", form, "live_instances", live)
	} else {
		g.log.Info("scale-out: the route step routes every copy alone: a live instance does not say it reads bundles", "live_instances", live)
	}
}
