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
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/pcgroups"

	"github.com/dedupe-stage/dedupe-stage/internal/ensure"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/layout"
	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/route"
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

// toRelease returns which of the owned partitions self releases when live
// are the live instances out of n partitions: the ones self scores
// lowest, as many as it owns beyond its quota, none when it owns no more.
func toRelease(self string, owned []int, n int, live []string) []int {
	extra := len(owned) - quota(self, live, n)
	if extra <= 0 {
		return nil
	}
	ps := slices.Clone(owned)
	slices.SortFunc(ps, func(a, b int) int {
		sa, sb := rankScore(a, self), rankScore(b, self)
		switch {
		case sa < sb:
			return -1
		case sa > sb:
			return 1
		}
		return a - b
	})
	return ps[:extra]
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
	joined   chan struct{}        // signalled when another instance's key appears, and once synced
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
		forms: map[string][]int{}, joined: make(chan struct{}, 1)}, nil
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
				pr.signalJoined() // balance counts again, and the bundle gate opens now if it may
				continue
			}
			if pr.apply(e) {
				pr.signalJoined()
			}
		}
	}
}

// apply records one key's put or delete, and reports whether it is another
// instance joining.
func (pr *presence) apply(e jetstream.KeyValueEntry) (joined bool) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	_, had := pr.seen[e.Key()]
	if e.Operation() != jetstream.KeyValuePut {
		delete(pr.seen, e.Key())
		delete(pr.heard, e.Key())
		delete(pr.forms, e.Key())
		return false
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

// signalJoined wakes whoever waits on joined, without blocking.
func (pr *presence) signalJoined() {
	select {
	case pr.joined <- struct{}{}:
	default:
	}
}

// refresh puts this instance's key and returns the live instances (with
// this one).
func (pr *presence) refresh(ctx context.Context) ([]string, error) {
	v, err := json.Marshal(ownPresence(time.Now().UTC()))
	if err != nil {
		return nil, err
	}
	if _, err := pr.kv.Put(ctx, pr.self, v); err != nil {
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

// balance runs until ctx is done: at once, then every presence refresh,
// it releases what this instance owns beyond its quota, and stands by
// again for what it released once the cooldown has passed.
func (g *Group) balance(ctx context.Context, pr *presence, m *members) {
	n := g.opts.Partitions
	cooldown := layout.ReleaseCooldown(g.opts.AckWait)
	released := map[int]time.Time{}
	t := time.NewTicker(pr.every)
	defer t.Stop()
	if err := pr.watch(ctx); err != nil {
		g.log.Warn("scale-out: presence watch failed; balance counts what this instance puts only", "err", err)
	}
	first := true
	for {
		if !first {
			select {
			case <-ctx.Done():
				return
			case p := <-g.releaseNow:
				g.releaseForBalance(ctx, m, p, "asked")
				released[p] = time.Now()
				continue
			case <-pr.joined:
			case <-t.C:
			}
		}
		first = false
		now := time.Now()
		for p, at := range released {
			if now.Sub(at) >= cooldown {
				delete(released, p)
				m.join(ctx, p)
			}
		}
		live, err := pr.refresh(ctx)
		if err != nil {
			if ctx.Err() == nil {
				g.log.Warn("scale-out: presence refresh failed; balance waits", "err", err)
			}
			continue
		}
		g.setBundles(pr.commonForm(), len(live))
		owned := g.stillOwned(ctx)
		counted := pr.forRelease(live, g.lastTake())
		for _, p := range toRelease(g.instance, owned, n, counted) {
			g.releaseForBalance(ctx, m, p, "balance")
			released[p] = now
			g.log.Info("scale-out: partition released for balance", "partition", p, "owned", len(owned), "live_instances", len(counted),
				"quota", quota(g.instance, counted, n), "cooldown", cooldown)
		}
	}
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
	if err := pcgroups.StaticMemberStepDown(ctx, g.js, g.inStream, g.name, layout.Member(p)); err != nil {
		g.log.Warn("scale-out: unpin for balance failed; the partition moves after the pin's TTL", "partition", p, "why", why, "err", err)
	}
	g.busy[p].Unlock()
	m.leave(p)
	g.mu.Lock()
	kept := g.diverted[p]
	delete(g.diverted, p)
	g.mu.Unlock()
	for _, msg := range kept {
		pins[msg.Headers().Get(HeaderPinID)] = true
	}
	// The member may have been pinned again before it stopped: unpin it
	// once more, or the partition would wait for the pin's TTL.
	if now, err := g.pinOf(ctx, p); err == nil && now != "" && pins[now] {
		if err := pcgroups.StaticMemberStepDown(ctx, g.js, g.inStream, g.name, layout.Member(p)); err != nil {
			g.log.Warn("scale-out: unpin for balance failed; the partition moves after the pin's TTL", "partition", p, "why", why, "err", err)
		}
	}
	giveBackMsgs(kept)
	g.metrics.stale.WithLabelValues(strconv.Itoa(p)).Add(float64(len(kept)))
	g.metrics.released.WithLabelValues(strconv.Itoa(p)).Inc()
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
