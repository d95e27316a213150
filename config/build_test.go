package config

import (
	"testing"

	"github.com/dedupe-stage/dedupe-stage/state"
)

// TestStateLimitsAgree checks that the configuration accepts a partition
// count exactly when the store it opens does, and that the limits check-
// config applies are the store's own.
func TestStateLimitsAgree(t *testing.T) {
	if MaxPartitions != state.MaxPartitions {
		t.Fatalf("config allows %d partitions, the store %d", MaxPartitions, state.MaxPartitions)
	}
	for _, p := range []int{-1, 0, 1, 8, state.MaxPartitions, state.MaxPartitions + 1} {
		c := Default()
		c.State.Partitions = p
		c.State.MemoryBudget = MinMemoryBudget
		w, err := c.Window.Derive()
		if err != nil {
			t.Fatal(err)
		}
		configOK := c.Validate() == nil
		storeOK := c.StateOptions(w).Validate() == nil
		if configOK != storeOK {
			t.Errorf("partitions %d: config valid %v, store options valid %v", p, configOK, storeOK)
		}
	}
}
