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
		return fmt.Errorf("state: read %s: %w", path, err)
	}
	if have != want && partitions > 1 {
		return fmt.Errorf("%w: state in %s is partitioned by %s, this configuration by %s, so its repeats would be forwarded again; "+
			"start with an empty state.data_dir or switch back", ErrLayout, dir, have, want)
	}
	if err == nil && have == want {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	if err := os.WriteFile(path, []byte(want+"\n"), 0o644); err != nil {
		return fmt.Errorf("state: record the partition key: %w", err)
	}
	return nil
}
