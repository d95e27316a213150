package state

import (
	"fmt"
	"strconv"
	"strings"
)

// Hashes that place keys in partitions, as recorded in LayoutFile.
const (
	// HashXXHash64 is PartitionOf: one instance places its keys itself.
	// A LayoutFile that names no hash was written with it.
	HashXXHash64 = "xxhash64"
	// HashServerFNV1a32 is nats-server's {{partition(N,k)}} subject
	// transform (PartitionFNV): with scale-out, the server places keys and
	// the stage reads the partition from the subject.
	HashServerFNV1a32 = "server-fnv1a32"
)

// Partitioning is how keys were placed in a store's partitions. It is
// recorded in LayoutFile beside the partition count, so that a data dir is
// never opened by a configuration that would look keys up in other
// partitions.
type Partitioning struct {
	// Hash is HashXXHash64 or HashServerFNV1a32; "" means HashXXHash64.
	Hash string
	// Group is the scale-out consumer group the partitions belong to,
	// required with HashServerFNV1a32 and empty otherwise: partition i of
	// one group is not partition i of another.
	Group string
}

// hash returns Hash with the default applied.
func (p Partitioning) hash() string {
	if p.Hash == "" {
		return HashXXHash64
	}
	return p.Hash
}

// String describes p as LayoutFile records it, e.g. "hash xxhash64" or
// "hash server-fnv1a32, group dedupe".
func (p Partitioning) String() string {
	if p.Group == "" {
		return "hash " + p.hash()
	}
	return "hash " + p.hash() + ", group " + p.Group
}

func (p Partitioning) validate() error {
	switch p.hash() {
	case HashXXHash64:
		if p.Group != "" {
			return fmt.Errorf("group %q set with hash %s; a group is only recorded for %s", p.Group, HashXXHash64, HashServerFNV1a32)
		}
	case HashServerFNV1a32:
		if p.Group == "" || strings.ContainsFunc(p.Group, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return fmt.Errorf("group %q, want a name without whitespace with hash %s", p.Group, HashServerFNV1a32)
		}
	default:
		return fmt.Errorf("hash %q, want %s or %s", p.Hash, HashXXHash64, HashServerFNV1a32)
	}
	return nil
}

// layout is the content of LayoutFile.
type layout struct {
	partitions int
	how        Partitioning
	// shared is true when the partitions are keyspaces of one Badger
	// instance in BadgerDir (the "store one-badger" line), false for a
	// data dir written before, with one Badger instance per partition
	// directory: Open moves those into BadgerDir, then records shared.
	shared bool
}

// storeOneBadger is LayoutFile's line of a shared store. Versions that
// kept a Badger instance per partition refuse a LayoutFile with it, so
// they never open a migrated data dir as an empty one.
const storeOneBadger = "store one-badger"

// formatLayout returns LayoutFile's text: "partitions N\n", followed by
// "hash H\ngroup G\n" when the hash is not HashXXHash64, then
// "store one-badger\n" when shared.
func formatLayout(l layout) []byte {
	b := fmt.Appendf(nil, "partitions %d\n", l.partitions)
	if l.how.hash() != HashXXHash64 {
		b = fmt.Appendf(b, "hash %s\ngroup %s\n", l.how.hash(), l.how.Group)
	}
	if l.shared {
		b = fmt.Appendf(b, "%s\n", storeOneBadger)
	}
	return b
}

// parseLayout reads LayoutFile's text (see formatLayout).
func parseLayout(b []byte) (layout, error) {
	var l layout
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	f := strings.Fields(lines[0])
	if len(f) != 2 || f[0] != "partitions" {
		return l, fmt.Errorf("want \"partitions N\", got %q", b)
	}
	n, err := strconv.Atoi(f[1])
	if err != nil || n < 1 {
		return l, fmt.Errorf("bad partition count %q", f[1])
	}
	l.partitions = n
	for _, line := range lines[1:] {
		if line == storeOneBadger {
			l.shared = true
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return l, fmt.Errorf("want \"hash H\" or \"group G\", got %q", line)
		}
		switch f[0] {
		case "hash":
			l.how.Hash = f[1]
		case "group":
			l.how.Group = f[1]
		default:
			return l, fmt.Errorf("unknown line %q", line)
		}
	}
	if err := l.how.validate(); err != nil {
		return l, err
	}
	return l, nil
}
