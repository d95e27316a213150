package stage

import (
	"fmt"
	"slices"
	"testing"
)

func TestFairShare(t *testing.T) {
	for _, tt := range []struct{ n, k, want int }{{16, 1, 16}, {16, 2, 8}, {16, 3, 6}, {4, 3, 2}, {4, 8, 1}, {4, 0, 4}} {
		if got := fairShare(tt.n, tt.k); got != tt.want {
			t.Errorf("fairShare(%d, %d) = %d, want %d", tt.n, tt.k, got, tt.want)
		}
	}
}

func TestToRelease(t *testing.T) {
	all := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	if got := toRelease("a", all, 16, 1); got != nil {
		t.Errorf("alone: releases %v, want none", got)
	}
	got := toRelease("a", all, 16, 2)
	if len(got) != 8 {
		t.Fatalf("16 of 16 with 2 live: releases %v, want 8", got)
	}
	// They are the ones a scores lowest.
	kept := slices.DeleteFunc(slices.Clone(all), func(p int) bool { return slices.Contains(got, p) })
	for _, r := range got {
		for _, k := range kept {
			if rankScore(r, "a") > rankScore(k, "a") {
				t.Errorf("released %d (score %d) but kept %d (score %d)", r, rankScore(r, "a"), k, rankScore(k, "a"))
			}
		}
	}
	// Order-free and deterministic.
	rev := slices.Clone(all)
	slices.Reverse(rev)
	if again := toRelease("a", rev, 16, 2); !slices.Equal(again, got) {
		t.Errorf("released %v for the same partitions in another order, want %v", again, got)
	}
	if got := toRelease("a", []int{1, 2}, 16, 3); got != nil {
		t.Errorf("below the fair share: releases %v, want none", got)
	}
	if got := toRelease("a", all[:7], 16, 3); len(got) != 1 {
		t.Errorf("7 of 16 with 3 live (fair share 6): releases %v, want 1", got)
	}
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
