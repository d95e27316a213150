package boot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrDataDir means the data directory cannot be used: it cannot be
// created or written, or another process holds it.
var ErrDataDir = errors.New("state.data_dir not usable")

// ErrInUse means another process holds the data directory (a running
// stage): an error that wraps it wraps ErrDataDir too.
var ErrInUse = errors.New("state.data_dir in use by another process")

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
		f.Close()
		return nil, heldError(dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &DataDirLock{f: f}, nil
}

// heldError is the error of a data dir another process holds: lockErr is
// the refused lock, and the pid its holder wrote in dir/LOCK.
func heldError(dir string, lockErr error) error {
	holder, _ := os.ReadFile(filepath.Join(dir, LockFile))
	pid := strings.TrimSpace(string(holder))
	if pid == "" {
		pid = "unknown"
	}
	return inUseError{fmt.Errorf("%w: %s is in use by another process (pid %s; %v): stop it, or give this one another data dir (--data-dir, $DEDUPE_DATA_DIR)",
		ErrDataDir, dir, pid, lockErr)}
}

// inUseError is heldError's: its message and chain are the wrapped
// error's, and it is ErrInUse too.
type inUseError struct{ error }

func (e inUseError) Unwrap() error      { return e.error }
func (inUseError) Is(target error) bool { return target == ErrInUse }

// CheckDataDir reports what LockDataDir(dir) would refuse, changing
// nothing: an error wrapping ErrDataDir when dir, or the nearest directory
// above it that exists when dir does not, is not a directory this process
// can write in, or when another process holds dir. To tell, it takes
// dir/LOCK's lock when the file exists and gives it back at once. Where
// the platform cannot check, it only checks that the path is a directory.
func CheckDataDir(dir string) error {
	d := dir
	for {
		fi, err := os.Stat(d)
		if err == nil && !fi.IsDir() {
			return fmt.Errorf("%w: %s is not a directory", ErrDataDir, d)
		}
		if err == nil {
			break
		}
		parent := filepath.Dir(d)
		if !errors.Is(err, fs.ErrNotExist) || parent == d {
			return fmt.Errorf("%w: %w", ErrDataDir, err)
		}
		d = parent
	}
	if err := writable(d); err != nil && d != dir {
		return fmt.Errorf("%w: cannot create %s: cannot write in %s: %w", ErrDataDir, dir, d, err)
	} else if err != nil {
		return fmt.Errorf("%w: cannot write in %s: %w", ErrDataDir, dir, err)
	}
	if d != dir {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(dir, LockFile), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrDataDir, err)
	}
	defer f.Close()
	if err := lockFile(f); err != nil {
		return heldError(dir, err)
	}
	return unlockFile(f)
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
