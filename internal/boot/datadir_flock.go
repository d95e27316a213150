//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package boot

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive advisory lock on f without waiting. The
// kernel releases it when the process exits, however it exits.
func lockFile(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}

func unlockFile(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}

// writable reports whether this process may create files in the
// directory dir.
func writable(dir string) error {
	const wOK = 0x2 // W_OK
	return syscall.Access(dir, wOK)
}
