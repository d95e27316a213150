//go:build linux || darwin

package state

import "syscall"

// freeSpace returns the bytes available to unprivileged users on the file
// system holding dir; ok is true.
func freeSpace(dir string) (free uint64, ok bool, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false, err
	}
	return st.Bavail * uint64(st.Bsize), true, nil
}
