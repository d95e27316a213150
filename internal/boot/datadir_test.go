package boot_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dedupe-stage/dedupe-stage/internal/boot"
)

func TestLockDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	store := filepath.Join(dir, "nats")
	l, err := boot.LockDataDir(dir, store)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(store); err != nil || !fi.IsDir() {
		t.Errorf("the store dir was not created: %v", err)
	}
	_, err = boot.LockDataDir(dir)
	if !errors.Is(err, boot.ErrDataDir) || !strings.Contains(err.Error(), "in use") || !strings.Contains(err.Error(), strconv.Itoa(os.Getpid())) {
		t.Errorf("second lock: %v, want ErrDataDir saying it is in use by pid %d", err, os.Getpid())
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Errorf("second Release: %v", err)
	}
	l2, err := boot.LockDataDir(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	l2.Release()

	// A data dir that cannot be created.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = boot.LockDataDir(filepath.Join(file, "data"))
	if !errors.Is(err, boot.ErrDataDir) || !strings.Contains(err.Error(), "cannot create") || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("data dir under a file: %v, want ErrDataDir: cannot create ... not a directory", err)
	}
	// One that exists but cannot be written.
	if os.Geteuid() == 0 {
		t.Log("running as root, which writes in a read-only directory: the unwritable case is not checked here")
		return
	}
	ro := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(ro, 0o555); err != nil {
		t.Fatal(err)
	}
	_, err = boot.LockDataDir(ro)
	if !errors.Is(err, boot.ErrDataDir) || !strings.Contains(err.Error(), "cannot write") {
		t.Errorf("read-only data dir: %v, want ErrDataDir: cannot write", err)
	}
}
