package config

import (
	"github.com/dedupe-stage/dedupe-stage/state"
	"github.com/dedupe-stage/dedupe-stage/window"
)

// StateOptions returns the options of the state store that `run` opens for
// this configuration with window w: state.DefaultOptions in State.Dir(),
// overlaid with the state and filter sections (and the totals bucket when
// totals are on). Clock and Logger keep their defaults; the caller sets
// them. With scale-out on, the partitioning recorded in the data dir is
// the server's hash for scale_out.group. check-config sizes the filter and checks the partition limits
// through these same options, so what it prints is what `run` builds.
func (c Config) StateOptions(w window.Window) state.Options {
	so := state.DefaultOptions(c.State.Dir(), w)
	so.Partitions = c.State.Partitions
	so.Filter.ExpectedKeys = uint(c.Filter.ExpectedKeys)
	so.Filter.FalsePositiveRate = c.Filter.FalsePositiveRate
	so.Filter.Generations = c.Filter.Generations
	so.DisableFilter = !c.Filter.Enabled
	so.MemoryBudget = int64(c.State.MemoryBudget)
	so.SyncWrites = c.StateSyncWrites()
	so.GCInterval = c.State.GCInterval.D()
	so.SnapshotInterval = c.State.SnapshotInterval.D()
	so.RefreshOnRepeat = c.Window.RefreshOnRepeat
	so.OnDamage = state.DamagePolicy(c.State.OnDamage)
	if c.Totals.Enabled {
		so.TotalsBucket = c.Totals.Bucket.D()
	}
	if c.ScaleOut.Enabled {
		// The server places keys: its partition() of the key token, for
		// this group's members.
		so.Partitioning = state.Partitioning{Hash: state.HashServerFNV1a32, Group: c.ScaleOut.Group}
	}
	return so
}

// Routing describes what the stage hashes to choose a partition
// (PartitionField), as recorded in the state's state.RoutingFile: the key
// (state.RoutingKey), or the totals group when totals are on, so that
// every copy of a key and every event of a group meet in one partition.
func (c Config) Routing() string {
	field, name := c.PartitionField()
	if name == "key" {
		return state.RoutingKey
	}
	return name + " " + field.String()
}
