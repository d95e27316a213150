package config

import (
	"strings"
	"testing"
	"time"
)

// TestSizeWindowAsCheckConfig checks that a window sized at the rate that
// fills filter.expected_keys in W gets the filter and memory check-config
// prints for the configuration, and that a window holding more keys than
// the filter takes says so.
func TestSizeWindowAsCheckConfig(t *testing.T) {
	c := Default()
	w, err := c.Window.Derive()
	if err != nil {
		t.Fatal(err)
	}
	sz, err := c.filterSizing()
	if err != nil {
		t.Fatal(err)
	}
	rate := float64(c.Filter.ExpectedKeys) / w.W.Seconds()
	got, err := c.SizeWindow(w.W, rate, 32)
	if err != nil {
		t.Fatal(err)
	}
	filter := filterBytes(sz, c.State.Partitions)
	if got.ExpectedKeys != c.Filter.ExpectedKeys || got.FilterBytes != filter || got.MemoryBytes != c.memoryBytes(filter) ||
		got.DiskBytes != c.Filter.ExpectedKeys*(diskOverheadPerKey+32) {
		t.Errorf("sized %+v; check-config's: %d keys, filter %d, memory %d", got, c.Filter.ExpectedKeys, filter, c.memoryBytes(filter))
	}
	if !strings.Contains(c.Summary(), humanBytes(got.MemoryBytes)) {
		t.Errorf("check-config's summary does not print the memory %s:\n%s", humanBytes(got.MemoryBytes), c.Summary())
	}
	if _, err := c.SizeWindow(1000*time.Hour, 1e8, 32); err == nil {
		t.Error("a window of 3.6e14 keys sized without an error")
	}
}
