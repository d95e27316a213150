package scaleout

import (
	"slices"
	"testing"
)

// TestStandbysOf checks the warm standbys of each partition: the same for
// the same live set, k = min(standbys, live-1) of them, never the owner,
// distinct, and a membership change moves the standbys of few partitions.
func TestStandbysOf(t *testing.T) {
	const n = 64
	live := []string{"a", "b", "c", "d", "e"}
	want := assign(live, n)
	for _, standbys := range []int{0, 1, 2, 4, 6} {
		sb := standbysOf(live, want, standbys)
		if again := standbysOf(slices.Clone(live), slices.Clone(want), standbys); !slices.EqualFunc(sb, again, slices.Equal[[]string]) {
			t.Fatalf("standbys %d: not deterministic: %v then %v", standbys, sb, again)
		}
		k := min(standbys, len(live)-1)
		for p, s := range sb {
			if len(s) != k {
				t.Errorf("standbys %d: partition %d has %d standbys %v, want %d", standbys, p, len(s), s, k)
			}
			if slices.Contains(s, want[p]) {
				t.Errorf("standbys %d: partition %d's owner %s is its own standby: %v", standbys, p, want[p], s)
			}
			c := slices.Clone(s)
			slices.Sort(c)
			if len(slices.Compact(c)) != len(s) {
				t.Errorf("standbys %d: partition %d has a standby twice: %v", standbys, p, s)
			}
		}
	}
	// One instance alone has none; two have one each, the other one.
	if sb := standbysOf([]string{"a"}, assign([]string{"a"}, n), 2); slices.ContainsFunc(sb, func(s []string) bool { return len(s) > 0 }) {
		t.Errorf("one instance: standbys %v, want none", sb)
	}
	two := []string{"a", "b"}
	for p, s := range standbysOf(two, assign(two, n), 3) {
		if o := assign(two, n)[p]; len(s) != 1 || s[0] == o {
			t.Errorf("two instances: partition %d owned by %s has standbys %v, want the other one", p, o, s)
		}
	}
	// A partition without an owner gets no standby.
	if sb := standbysOf(live, make([]string, 3), 1); sb[0] != nil {
		t.Errorf("no owner: standbys %v, want none", sb[0])
	}
	// Membership: an instance joining takes a share of the standbys and
	// leaves the others' ranking alone: with the owners unchanged, a
	// partition's standby changes only to the newcomer.
	sb := standbysOf(live, want, 1)
	more := append(slices.Clone(live), "f")
	slices.Sort(more)
	after := standbysOf(more, want, 1)
	moved := 0
	for p := range n {
		if after[p][0] != sb[p][0] {
			moved++
			if after[p][0] != "f" {
				t.Errorf("partition %d: standby moved from %s to %s, not to the newcomer", p, sb[p][0], after[p][0])
			}
		}
	}
	if moved == 0 || moved > n/2 {
		t.Errorf("a sixth instance moved %d of %d standbys; want some, about 1/5", moved, n)
	}
	// An instance leaving moves only the standbys it was.
	fewer := slices.DeleteFunc(slices.Clone(live), func(s string) bool { return s == "e" })
	owners := slices.Clone(want)
	for p, o := range owners {
		if o == "e" {
			owners[p] = "" // its partitions are reassigned; left out here
		}
	}
	left := standbysOf(fewer, owners, 1)
	for p := range n {
		if owners[p] == "" {
			continue
		}
		if sb[p][0] != "e" && left[p][0] != sb[p][0] {
			t.Errorf("partition %d: standby %s moved to %s though %s stays", p, sb[p][0], left[p][0], sb[p][0])
		}
	}
	t.Logf("standbys moved by a join: %d of %d", moved, n)
}
