package stage

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/pcgroups"

	"github.com/dedupe-stage/dedupe-stage/config"
)

// Balance (docs/scale-out.md §4.2). The server pins a partition to
// whichever instance asks first, so without a rule the first instance up
// owns every partition. Each instance keeps a key in the presence bucket;
// K is the number of live keys, and an instance owning more than its fair
// share ⌈N/K⌉ releases the partitions it ranks lowest: it stops consuming
// them, unpins them, and stands by for them again only after a cooldown,
// so that an instance waiting on them gets them. The rank is a rendezvous
// hash of (partition, instance), so partitions tend to go back to the same
// instance and its local store. Balance decides who asks first, never who
// may write: the fence does that, so a wrong count costs a move, never a
// duplicate.

// fairShare is the most partitions of n one of k live instances should own.
func fairShare(n, k int) int {
	k = max(k, 1)
	return (n + k - 1) / k
}

// rankScore is how much instance wants partition p: the highest score
// among the live instances is the partition's preferred owner.
func rankScore(p int, instance string) uint64 {
	return xxhash.Sum64String(strconv.Itoa(p) + "/" + instance)
}

// toRelease returns which of the owned partitions self releases when k
// instances are live out of n partitions: the ones self scores lowest, as
// many as it owns beyond the fair share, none when it owns no more.
func toRelease(self string, owned []int, n, k int) []int {
	extra := len(owned) - fairShare(n, k)
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

// presence is this instance's key in the presence bucket.
type presence struct {
	kv    jetstream.KeyValue
	self  string
	every time.Duration
}

// openPresence opens (creating it when missing) the presence bucket.
func openPresence(ctx context.Context, js jetstream.JetStream, cfg config.Config, self string) (*presence, error) {
	bucket, every, ttl := cfg.ScaleOutPresence()
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, TTL: ttl, Replicas: cfg.ScaleOut.Replicas,
			Description: "dedupe-stage: the live instances of group " + cfg.ScaleOut.Group + ", for balance only"})
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			kv, err = js.KeyValue(ctx, bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("scale-out: presence bucket %s: %w", bucket, err)
	}
	return &presence{kv: kv, self: self, every: every}, nil
}

// refresh puts this instance's key and returns the live instances (with
// this one).
func (pr *presence) refresh(ctx context.Context) ([]string, error) {
	if _, err := pr.kv.Put(ctx, pr.self, []byte(time.Now().UTC().Format(time.RFC3339Nano))); err != nil {
		return nil, err
	}
	live, err := pr.kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		live, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !slices.Contains(live, pr.self) {
		live = append(live, pr.self)
	}
	slices.Sort(live)
	return live, nil
}

// leave deletes this instance's key, so the others count one less at
// once.
func (pr *presence) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = pr.kv.Delete(ctx, pr.self)
}

// balance runs until ctx is done: every presence refresh it releases what
// this instance owns beyond its fair share, and stands by again for what
// it released once the cooldown has passed.
func (s *Stage) balance(ctx context.Context, pr *presence, m *members) {
	so := s.so
	n := s.cfg.State.Partitions
	cooldown := s.cfg.ScaleOutReleaseCooldown()
	released := map[int]time.Time{}
	t := time.NewTicker(pr.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
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
				s.log.Warn("scale-out: presence refresh failed; balance waits", "err", err)
			}
			continue
		}
		owned := s.stillOwned(ctx)
		for _, p := range toRelease(so.instance, owned, n, len(live)) {
			m.leave(p)
			so.release(p)
			if err := pcgroups.StaticMemberStepDown(ctx, s.js, so.inStream, so.group, config.ScaleOutMember(p)); err != nil {
				s.log.Warn("scale-out: unpin for balance failed; the partition moves after the pin's TTL", "partition", p, "err", err)
			}
			released[p] = now
			so.metrics.released.WithLabelValues(strconv.Itoa(p)).Inc()
			s.log.Info("scale-out: partition released for balance", "partition", p, "owned", len(owned), "live_instances", len(live),
				"fair_share", fairShare(n, len(live)), "cooldown", cooldown)
		}
	}
}

// stillOwned returns the partitions this instance owns after asking the
// server, for each, whether the pin it owns it under is still the pinned
// one. A partition whose pin moved (it expired, or another instance was
// pinned after an unpin) sends its old owner nothing more, so only the
// server can tell: its tenure ends here, as after a release, and balance
// counts only what the server still pins to this instance. A partition
// whose check fails, or that is pinned to nobody for the moment, is
// counted as owned.
func (s *Stage) stillOwned(ctx context.Context) []int {
	so := s.so
	so.mu.Lock()
	owned := maps.Clone(so.owned)
	so.mu.Unlock()
	var still []int
	for p, pin := range owned {
		now, err := s.pinOf(ctx, p)
		if err == nil && now != "" && now != pin {
			so.lose(p, pin)
			s.log.Info("scale-out: partition's pin moved to another client; its tenure here ends", "partition", p)
			continue
		}
		still = append(still, p)
	}
	return still
}

// release ends this instance's tenure of partition p for balance: the
// worker treats what it still receives under the pin it owned p with as
// delivered under a lost pin.
func (so *scaleOut) release(p int) {
	so.mu.Lock()
	pin, ok := so.owned[p]
	so.mu.Unlock()
	if ok {
		so.lose(p, pin)
	}
}

// lose ends this instance's tenure of partition p under pin, unless the
// worker owns it under another pin by now: the worker treats what it
// still receives under pin as delivered under a lost pin.
func (so *scaleOut) lose(p int, pin string) {
	so.mu.Lock()
	defer so.mu.Unlock()
	if so.owned[p] == pin {
		so.lost[p] = pin
		delete(so.owned, p)
		so.metrics.owned.Set(float64(len(so.owned)))
	}
}

// takeLost returns the pin partition p was released under, once, or "".
func (so *scaleOut) takeLost(p int) string {
	so.mu.Lock()
	defer so.mu.Unlock()
	pin := so.lost[p]
	delete(so.lost, p)
	return pin
}
