package state

import "fmt"

// checkFreeSpace returns an error wrapping ErrDiskFull when the file system
// holding dir has fewer than min bytes available. Where the space cannot be
// measured (see freeSpace), it returns nil.
func checkFreeSpace(dir string, min int64) error {
	free, ok, err := freeSpace(dir)
	if err != nil {
		return fmt.Errorf("free space in %s: %w", dir, err)
	}
	if ok && free < uint64(min) {
		return fmt.Errorf("%w: %d bytes available in %s, Options.MinFreeBytes is %d", ErrDiskFull, free, dir, min)
	}
	return nil
}
