package state

import (
	"os"
	"path/filepath"
	"strings"
)

// removeEmptyLogFiles deletes the zero-length Badger memtable (*.mem) and
// value-log (*.vlog) files in dir and returns their names.
//
// Badger creates such a file and then sizes it; a process killed in between
// (Badger creates a memtable file at every open) leaves it empty, and the
// next badger.Open fails on it with "Create a new file"
// (dgraph-io/badger#2207). An empty file holds no entry, not even the
// file's header, so removing it loses nothing.
func removeEmptyLogFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !(strings.HasSuffix(name, ".mem") || strings.HasSuffix(name, ".vlog")) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return removed, err
		}
		if info.Size() != 0 {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			return removed, err
		}
		removed = append(removed, name)
	}
	return removed, nil
}
