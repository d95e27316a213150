package state

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// A process killed between Badger creating its next memtable or value-log
// file and giving it a size leaves the file empty. The faults package's
// kill -9 test hit this at start, where Badger creates a new memtable file.
func TestOpenAfterKillLeftAnEmptyLogFile(t *testing.T) {
	for _, name := range []string{"00099.mem", "000099.vlog"} {
		t.Run(name, func(t *testing.T) {
			opts := testOptions(t, t.TempDir(), 2)
			keys := testKeys("empty-log", 2000)
			s, err := Open(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			claimAll(t, s, keys)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(PartitionDir(opts.Dir, 1), name)
			if err := os.WriteFile(path, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			s = openStore(t, opts)
			assertAllSeen(t, s, keys)
		})
	}
}
