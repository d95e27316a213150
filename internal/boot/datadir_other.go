//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package boot

import "os"

// lockFile does nothing where syscall.Flock does not exist; Badger's own
// directory lock, taken when the state opens, still keeps a second process
// out of the state.
func lockFile(*os.File) error { return nil }

func unlockFile(*os.File) error { return nil }

// writable cannot tell here; LockDataDir finds out at start.
func writable(string) error { return nil }
