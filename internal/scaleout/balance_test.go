package scaleout

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/scaleout/route"
)

// TestQuotaAddsUp checks that the quotas of the live instances add up to
// the partitions, each ⌈n/k⌉ or ⌊n/k⌋: a group whose instances all keep
// to their quota owns every partition and settles.
func TestQuotaAddsUp(t *testing.T) {
	for n := 1; n <= 17; n++ {
		for k := 1; k <= 5; k++ {
			var live []string
			for i := range k {
				live = append(live, fmt.Sprintf("i%d", i))
			}
			sum := 0
			for _, self := range live {
				q := quota(self, live, n)
				if q != n/k && q != (n+k-1)/k {
					t.Errorf("n=%d k=%d: quota(%s) = %d, want %d or %d", n, k, self, q, n/k, (n+k-1)/k)
				}
				sum += q
			}
			if sum != n {
				t.Errorf("n=%d k=%d: quotas add up to %d, want %d", n, k, sum, n)
			}
		}
	}
	if got := quota("z", []string{"a", "b", "c"}, 8); got != 3 {
		t.Errorf("quota of an instance not seen yet = %d, want ⌈8/3⌉ = 3", got)
	}
}

// TestAssign: every partition is assigned, each instance gets its quota
// (so shares differ by at most one), the assignment does not depend on the
// order the live instances are listed in beyond their names, and a join
// moves few partitions besides those to the newcomer.
func TestAssign(t *testing.T) {
	for n := 1; n <= 17; n++ {
		for k := 1; k <= 5; k++ {
			var live []string
			for i := range k {
				live = append(live, fmt.Sprintf("i%d", i))
			}
			got := assign(live, n)
			count := map[string]int{}
			for p, to := range got {
				if !slices.Contains(live, to) {
					t.Fatalf("n=%d k=%d: partition %d assigned to %q, not a live instance", n, k, p, to)
				}
				count[to]++
			}
			for _, self := range live {
				if count[self] != quota(self, live, n) {
					t.Errorf("n=%d k=%d: %s assigned %d partitions, want its quota %d", n, k, self, count[self], quota(self, live, n))
				}
			}
			if !slices.Equal(assign(slices.Clone(live), n), got) {
				t.Errorf("n=%d k=%d: two assignments of the same live instances differ", n, k)
			}
		}
	}
	// From one instance to two, of 16: a keeps 8 of its 16 and moves 8 to
	// b; from two to three, what moves goes to c, and a and b keep the rest.
	one, two, three := assign([]string{"a"}, 16), assign([]string{"a", "b"}, 16), assign([]string{"a", "b", "c"}, 16)
	moved := 0
	for p := range 16 {
		if one[p] != two[p] {
			moved++
		}
	}
	if moved != 8 {
		t.Errorf("a join of b to a moves %d of 16 partitions, want 8", moved)
	}
	moved, toC := 0, 0
	for p := range 16 {
		if two[p] != three[p] {
			moved++
		}
		if three[p] == "c" {
			toC++
		}
	}
	// The greedy assignment is not the fewest moves: a join may also move
	// a partition between the instances there before (a bound, not zero).
	if moved > toC+2 {
		t.Errorf("the join of c moves %d of 16 partitions, %d of them to c: more than 2 between a and b", moved, toC)
	}
	t.Logf("the join of c moves %d of 16 partitions (quota 5 or 6)", moved)
}

// TestRankSpreads checks that the preferred owners of 16 partitions spread
// over 3 instances, for many sets of instance names.
func TestRankSpreads(t *testing.T) {
	for set := range 200 {
		names := []string{fmt.Sprintf("a%d", set), fmt.Sprintf("b%d", set), fmt.Sprintf("c%d", set)}
		count := map[string]int{}
		for p := range 16 {
			best := names[0]
			for _, n := range names[1:] {
				if rankScore(p, n) > rankScore(p, best) {
					best = n
				}
			}
			count[best]++
		}
		for _, n := range names {
			if count[n] > 11 {
				t.Errorf("set %d: %s preferred for %d of 16 partitions: %v", set, n, count[n], count)
			}
		}
	}
}

// TestBundleFormOfAMixedGroup: the route step writes the newest bundle
// form every live instance's presence says it reads. A version that reads
// form 1 alone puts reads_bundle_form "1", one before bundles the time
// alone; this version lists both forms and still says "1", so that a
// form-1 version keeps writing bundles it can read. An instance whose key
// expired does not count, and nothing is written before the watch synced.
func TestBundleFormOfAMixedGroup(t *testing.T) {
	own, err := json.Marshal(ownPresence(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	var asOld struct {
		Form string `json:"reads_bundle_form"`
	}
	if err := json.Unmarshal(own, &asOld); err != nil || asOld.Form != "1" {
		t.Errorf("this version's presence %s reads, to a form-1 version, as form %q, %v; want \"1\"", own, asOld.Form, err)
	}
	values := map[string][]byte{
		"this":   own,
		"form1":  []byte(`{"at":"2026-12-04T10:00:00Z","reads_bundle_form":"1"}`),
		"before": []byte(`"2026-12-04T10:00:00Z"`),
	}
	now := time.Now()
	cases := []struct {
		live []string
		want int
	}{
		{[]string{"this"}, route.BundleForm2},
		{[]string{"this", "form1"}, route.BundleForm1},
		{[]string{"this", "form1", "before"}, 0},
		{[]string{"this", "before"}, 0},
	}
	for _, c := range cases {
		pr := &presence{ttl: time.Minute, watching: true, synced: true, seen: map[string]time.Time{}, forms: map[string][]int{}}
		for _, k := range c.live {
			pr.seen[k], pr.forms[k] = now, readsForms(values[k])
		}
		if got := pr.commonForm(); got != c.want {
			t.Errorf("live %v: form %d, want %d", c.live, got, c.want)
		}
		pr.seen["expired"], pr.forms["expired"] = now.Add(-2*time.Minute), nil
		if got := pr.commonForm(); got != c.want {
			t.Errorf("live %v and an expired key: form %d, want %d", c.live, got, c.want)
		}
		pr.synced = false
		if got := pr.commonForm(); got != 0 {
			t.Errorf("live %v, watch not synced: form %d, want 0", c.live, got)
		}
	}
}

// TestReleaseCount checks which instances a release for balance counts:
// this one always; another only when its put was heard within two
// refreshes and after this instance last took a partition. A crashed
// instance whose key has not expired yet (its TTL is three refreshes) and
// whose partition this one took is not counted, so this one keeps it.
func TestReleaseCount(t *testing.T) {
	every := 2 * time.Second
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	took := now.Add(-time.Second) // this instance took a partition 1 s ago
	cases := []struct {
		name  string
		heard map[string]time.Time
		took  time.Time
		want  []string
	}{
		{"alone, its own key not heard yet", nil, took, []string{"b"}},
		{"its own key, old", map[string]time.Time{"b": now.Add(-time.Hour)}, took, []string{"b"}},
		{"a put after the take", map[string]time.Time{"a": now.Add(-500 * time.Millisecond)}, took, []string{"a", "b"}},
		{"the crashed owner of what it took: last put before the take", map[string]time.Time{"a": now.Add(-3 * time.Second)}, took, []string{"b"}},
		{"the crashed owner, a take long ago: stale after two refreshes", map[string]time.Time{"a": now.Add(-4 * time.Second)}, time.Time{}, []string{"b"}},
		{"no take yet, a put within two refreshes", map[string]time.Time{"a": now.Add(-3 * time.Second)}, time.Time{}, []string{"a", "b"}},
		{"a live one and a crashed one", map[string]time.Time{"c": now.Add(-100 * time.Millisecond), "a": now.Add(-2500 * time.Millisecond)}, took, []string{"b", "c"}},
		{"a newcomer heard now", map[string]time.Time{"a": now.Add(-1500 * time.Millisecond), "z": now}, took.Add(-time.Hour), []string{"a", "b", "z"}},
	}
	for _, c := range cases {
		if got := releaseCount("b", c.heard, now, c.took, 2*every); !slices.Equal(got, c.want) {
			t.Errorf("%s: counts %v, want %v", c.name, got, c.want)
		}
	}
}

// TestQuotaGrowsWhenUncounted checks that leaving any instance out of the
// count never lowers another's quota, so a count that misses a live
// instance delays a release and never adds one.
func TestQuotaGrowsWhenUncounted(t *testing.T) {
	for n := 1; n <= 17; n++ {
		for k := 2; k <= 6; k++ {
			var live []string
			for i := range k {
				live = append(live, fmt.Sprintf("i%d", i))
			}
			for _, self := range live {
				for _, gone := range live {
					if gone == self {
						continue
					}
					fewer := slices.DeleteFunc(slices.Clone(live), func(s string) bool { return s == gone })
					if q, qf := quota(self, live, n), quota(self, fewer, n); qf < q {
						t.Errorf("n=%d k=%d: quota(%s) is %d, and %d without %s", n, k, self, q, qf, gone)
					}
				}
			}
		}
	}
}
