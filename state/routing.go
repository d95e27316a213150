package state

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// RoutingFile is the file in Dir, beside LayoutFile, that records what the
// partition key is (a caller's description, such as "key" or the field a
// group is read from), so that a change is refused instead of silently
// routing keys to other partitions. LayoutFile records how many partitions
// there are; RoutingFile what is hashed to choose one.
const RoutingFile = "ROUTING"

// RoutingKey is what CheckRouting assumes a store records when it has a
// LayoutFile and no RoutingFile (written before RoutingFile existed): it
// was partitioned by the key.
const RoutingKey = "key"

// CheckRouting compares the partition key recorded in dir/RoutingFile with
// want and records want when nothing is recorded. It must run before Open
// creates dir/LayoutFile: a store with a LayoutFile and no RoutingFile was
// partitioned by RoutingKey. With one partition every key routes to it, so a
// change is harmless and simply recorded. A refused change wraps ErrLayout.
func CheckRouting(dir string, partitions int, want string) error {
	record, err := compareRouting(dir, partitions, want)
	if err != nil || !record {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, RoutingFile), []byte(want+"\n"), 0o644); err != nil {
		return fmt.Errorf("state: record the partition key: %w", err)
	}
	return nil
}

// compareRouting is CheckRouting without writing: record says that want
// is to be recorded.
func compareRouting(dir string, partitions int, want string) (record bool, err error) {
	path := filepath.Join(dir, RoutingFile)
	b, err := os.ReadFile(path)
	have := strings.TrimSpace(string(b))
	switch {
	case err == nil:
	case errors.Is(err, fs.ErrNotExist):
		if _, lerr := os.Stat(filepath.Join(dir, LayoutFile)); lerr == nil {
			have = RoutingKey
		} else {
			have = want
		}
	default:
		return false, fmt.Errorf("state: read %s: %w", path, err)
	}
	if have != want && partitions > 1 {
		return false, fmt.Errorf("%w: state in %s is partitioned by %s, this configuration by %s, so its repeats would be forwarded again; "+
			"start with an empty state.data_dir or switch back", ErrLayout, dir, have, want)
	}
	return err != nil || have != want, nil
}

// VerifyRouting reports, reading only, what CheckRouting(dir, partitions,
// want) would refuse: an error wrapping ErrLayout when dir records another
// partition key, or one naming the file it cannot read.
func VerifyRouting(dir string, partitions int, want string) error {
	_, err := compareRouting(dir, partitions, want)
	return err
}

// VerifyLayout reports, reading only, what Open would refuse of the data
// dir dir for partitions partitions placed by how: an error wrapping
// ErrLayout when dir was made with another partition count or placement,
// or one naming the dir when it cannot be read. A dir that does not exist,
// or holds no store yet, is fine: Open makes one.
func VerifyLayout(dir string, partitions int, how Partitioning) error {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	_, _, err := compareLayout(dir, layout{partitions: partitions, how: how})
	return err
}
