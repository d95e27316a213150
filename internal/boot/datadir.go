package boot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrDataDir means the data directory cannot be used: it cannot be
// created or written, or another process holds it.
var ErrDataDir = errors.New("state.data_dir not usable")

// LockFile is the file in the data directory whose lock marks it as in use.
const LockFile = "LOCK"

// DataDirLock is a process's hold on its data directory. Release it once,
// at exit.
type DataDirLock struct {
	f *os.File
}

// LockDataDir creates dir (and each of extra, such as the embedded server's
// store directory) when missing, checks that a file can be written in each,
// and takes an exclusive lock on dir/LOCK. It is called before anything
// else opens dir, the embedded nats-server among them, so that a data dir
// that cannot be used, or that another process is using, is reported at
// once with its cause, wrapping ErrDataDir. Where the platform offers no
// file locks, the lock is Badger's own, taken later when the state opens.
func LockDataDir(dir string, extra ...string) (*DataDirLock, error) {
	for _, d := range append([]string{dir}, extra...) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("%w: cannot create %s: %w", ErrDataDir, d, err)
		}
		probe, err := os.CreateTemp(d, ".write-test-*")
		if err != nil {
			return nil, fmt.Errorf("%w: cannot write in %s: %w", ErrDataDir, d, err)
		}
		probe.Close()
		if err := os.Remove(probe.Name()); err != nil {
			return nil, fmt.Errorf("%w: cannot write in %s: %w", ErrDataDir, d, err)
		}
	}
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDataDir, err)
	}
	if err := lockFile(f); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		pid := strings.TrimSpace(string(holder))
		if pid == "" {
			pid = "unknown"
		}
		return nil, fmt.Errorf("%w: %s is in use by another process (pid %s; %v): stop it, or give this one another data dir (--data-dir, $DEDUPE_DATA_DIR)",
			ErrDataDir, dir, pid, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &DataDirLock{f: f}, nil
}

// Release gives the data directory up. It is safe to call twice.
func (l *DataDirLock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := unlockFile(l.f)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	return err
}
