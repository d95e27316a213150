package config

import (
	"fmt"
	"math"
	"time"

	"github.com/dedupe-stage/dedupe-stage/window"
)

// diskOverheadPerKey is what the state store keeps on disk per key besides
// the key's own bytes: 73.3 B per key measured with keys of 32 bytes
// (bench/RESULTS.md, "what the output sequence costs on disk", 1M keys;
// 68 B at 10M and 50M keys of the scale runs), less the key.
const diskOverheadPerKey = 41

// WindowSizing is what the state needs for a window W at a measured rate
// of new keys, sized as check-config sizes the configured filter and
// memory: the filter's expected keys and its memory across the
// partitions, the state's memory (state.memory_budget + the filter +
// Badger's table builders while writing) and the disk of its records.
type WindowSizing struct {
	// ExpectedKeys is filter.expected_keys for W: the new keys of one W.
	ExpectedKeys uint64
	// FilterBytes is the memory of the filters of all partitions.
	FilterBytes uint64
	// MemoryBytes is the state's memory: budget, filter and builders.
	MemoryBytes uint64
	// DiskBytes is the state's disk for ExpectedKeys records.
	DiskBytes uint64
}

// SizeWindow returns the sizing of window w at keysPerSecond new keys of
// keyBytes bytes on average, with this configuration's partitions,
// false-positive rate, generations and memory budget. The error says why
// the filter cannot be built at that size (more keys than the filter
// takes, say); the other values are then still set, the filter's zero.
func (c Config) SizeWindow(w time.Duration, keysPerSecond, keyBytes float64) (WindowSizing, error) {
	keys := math.Ceil(keysPerSecond * w.Seconds())
	if !(keys >= 1) {
		keys = 1
	}
	var s WindowSizing
	s.ExpectedKeys = uint64(min(keys, float64(math.MaxUint64/2)))
	s.DiskBytes = uint64(float64(s.ExpectedKeys) * (diskOverheadPerKey + max(keyBytes, 0)))
	cc := c
	cc.Filter.ExpectedKeys = s.ExpectedKeys
	so := cc.StateOptions(window.Window{W: w, NearFraction: window.DefaultNearFraction})
	var err error
	if s.ExpectedKeys > MaxExpectedKeys {
		err = fmt.Errorf("%d keys per window, more than filter.expected_keys takes (%d)", s.ExpectedKeys, uint64(MaxExpectedKeys))
	} else if sz, serr := so.FilterSizing(); serr != nil {
		err = fmt.Errorf("filter: %w", serr)
	} else {
		s.FilterBytes = filterBytes(sz, c.State.Partitions)
	}
	filter := s.FilterBytes
	if !c.Filter.Enabled {
		filter = 0
	}
	s.MemoryBytes = c.memoryBytes(filter)
	return s, err
}

// memoryBytes is the state's memory beside the filter's filterTotal
// bytes: state.memory_budget, the filter and Badger's table builders
// while it writes.
func (c Config) memoryBytes(filterTotal uint64) uint64 {
	sz := c.StateOptions(window.Window{}).BadgerSizing()
	return uint64(max(c.State.MemoryBudget, 0)) + filterTotal + uint64(sz.BuilderPool)
}
