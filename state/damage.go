package state

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// ErrDamaged means the store's files are damaged: a table whose checksum
// does not match its bytes, a MANIFEST that is missing or unreadable, a
// table the MANIFEST lists that is gone. The store cannot be trusted to
// judge: Open refuses it, or, with Options.OnDamage DamageRebuild, moves
// it aside and starts empty. Its errors are *DamageError values.
var ErrDamaged = errors.New("state: the store is damaged")

// DamagePolicy says what Open does with a damaged store (ErrDamaged).
type DamagePolicy string

const (
	// DamageRefuse makes Open fail with a *DamageError that names the file
	// and the fix. It is the default (the zero value means it too).
	DamageRefuse DamagePolicy = "refuse"
	// DamageRebuild makes Open move the damaged Badger directory and the
	// filter snapshots aside, into Dir/damaged-<UTC time> (never deleting
	// them), and open an empty store in their place: a store without
	// cursors, which the stage restores from the output stream before it
	// judges anything (docs/state.md, "One recovery path").
	DamageRebuild DamagePolicy = "rebuild"
)

// DamagedPrefix starts the name of the directory, in Dir, that a rebuild
// moves a damaged store into: DamagedPrefix + the UTC time, as
// 20060102T150405Z.
const DamagedPrefix = "damaged-"

// DamageError is the error of a damaged store: the file found damaged, if
// known, and what is wrong with it. It wraps ErrDamaged and the cause.
type DamageError struct {
	// Dir is the store's Badger directory.
	Dir string
	// File is the damaged file's path, or "" when Badger's error names
	// none.
	File string
	// Err is what is wrong with it.
	Err error
}

func (e *DamageError) Error() string {
	file := e.File
	if file == "" {
		file = e.Dir
	}
	return fmt.Sprintf("%v: %s: %v", ErrDamaged, file, e.Err)
}

// Unwrap returns ErrDamaged and the cause.
func (e *DamageError) Unwrap() []error { return []error{ErrDamaged, e.Err} }

// Fix returns what the operator can do about the damage: start with the
// rebuild policy (which moves the store aside and restores it from the
// output stream), or move the directory aside by hand. setting names the
// setting that chooses the policy (the stage's is state.on_damage).
func (e *DamageError) Fix(setting string) string {
	return fmt.Sprintf("to rebuild the store from the output stream, start once with %s: rebuild "+
		"(it moves %s aside, keeping it, and restores every partition from the output before judging), "+
		"or move %s out of the way yourself and start again", setting, e.Dir, e.Dir)
}

// checkBadgerFiles returns a *DamageError when dir, a Badger directory,
// holds tables or logs but no MANIFEST. Badger would open it: it writes a
// new, empty MANIFEST and deletes every table the MANIFEST does not list,
// that is every table, silently, keeping only the keys still in its
// write-ahead log (and with them, perhaps, a partition's cursor that says
// the lost keys are stored).
func checkBadgerFiles(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("state: dir %q is not usable: %w", dir, err)
	}
	var data []string
	manifest := false
	for _, e := range entries {
		name := e.Name()
		switch {
		case name == "MANIFEST":
			manifest = true
		case strings.HasSuffix(name, ".sst"), strings.HasSuffix(name, ".vlog"), strings.HasSuffix(name, ".mem"):
			data = append(data, name)
		}
	}
	if manifest || len(data) == 0 {
		return nil
	}
	return &DamageError{Dir: dir, File: filepath.Join(dir, "MANIFEST"),
		Err: fmt.Errorf("missing, and the directory holds %d Badger files (%s ...): "+
			"without it Badger would delete every table and forget their keys", len(data), data[0])}
}

// damagePhrases are parts of Badger's errors (4.9.6) for files whose bytes
// are wrong or missing, as opposed to files it cannot read or write at all
// (permissions, a full disk, a lock), which are not damage.
var damagePhrases = []string{
	"checksum",                      // a table's block or index, the MANIFEST
	"failed to verify",              // table.OpenTable
	"file does not exist for table", // a table the MANIFEST lists is gone
	"manifest",                      // bad magic, bad version, a truncated change set
	"bad magic",
	"corrupt",
	"unexpected eof",
	"while iterating wal",
	"while iterating over",   // the last value-log file
	"truncate",               // a log that needs truncating in read-only mode
	"index",                  // a table's index that cannot be read
	"invalid table",          // a table too short for its footer
	"while opening table",    // OpenTable's wrap
	"while opening memtable", // the write-ahead log
}

// badgerFileRE finds the Badger file an error names.
var badgerFileRE = regexp.MustCompile(`[^\s:"']*(?:\d+\.(?:sst|vlog|mem)|MANIFEST)\b`)

// tableIDRE finds the table of "file does not exist for table N".
var tableIDRE = regexp.MustCompile(`file does not exist for table (\d+)`)

// classifyOpenError returns err, Badger's error opening dir, as a
// *DamageError when it says a file is damaged; otherwise err itself. A
// lock held, a full disk, a permission refused or a read that fails are
// never damage: moving the store aside would not cure them.
func classifyOpenError(dir string, err error) error {
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EIO) ||
		errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EROFS) {
		return err
	}
	msg := strings.ToLower(err.Error())
	damaged := false
	for _, p := range damagePhrases {
		if strings.Contains(msg, p) {
			damaged = true
			break
		}
	}
	if !damaged {
		return err
	}
	de := &DamageError{Dir: dir, Err: err}
	if m := badgerFileRE.FindString(err.Error()); m != "" {
		if !filepath.IsAbs(m) {
			m = filepath.Join(dir, filepath.Base(m))
		}
		de.File = m
	} else if m := tableIDRE.FindStringSubmatch(err.Error()); m != nil {
		de.File = filepath.Join(dir, fmt.Sprintf("%06s.sst", m[1]))
	} else if strings.Contains(msg, "manifest") {
		de.File = filepath.Join(dir, "MANIFEST")
	}
	return de
}

// moveAside moves the damaged store in opts.Dir (its Badger directory and
// the partitions' filter snapshots) into a new directory
// Dir/damaged-<UTC time>, and returns that directory. Nothing is deleted.
func moveAside(opts Options, now time.Time) (string, error) {
	aside := filepath.Join(opts.Dir, DamagedPrefix+now.UTC().Format("20060102T150405Z"))
	if _, err := os.Stat(aside); err == nil {
		aside += fmt.Sprintf("-%d", now.UnixNano())
	}
	if err := os.MkdirAll(aside, 0o755); err != nil {
		return "", fmt.Errorf("state: move the damaged store aside: %w", err)
	}
	if err := os.Rename(filepath.Join(opts.Dir, BadgerDir), filepath.Join(aside, BadgerDir)); err != nil {
		return "", fmt.Errorf("state: move the damaged store aside: %w", err)
	}
	for i := range opts.Partitions {
		snap := filepath.Join(PartitionDir(opts.Dir, i), SnapshotFile)
		if _, err := os.Stat(snap); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		to := filepath.Join(aside, filepath.Base(PartitionDir(opts.Dir, i)))
		if err := os.MkdirAll(to, 0o755); err != nil {
			return "", fmt.Errorf("state: move the damaged store's filter snapshots aside: %w", err)
		}
		if err := os.Rename(snap, filepath.Join(to, SnapshotFile)); err != nil {
			return "", fmt.Errorf("state: move the damaged store's filter snapshots aside: %w", err)
		}
	}
	if err := syncDir(opts.Dir); err != nil {
		return "", fmt.Errorf("state: move the damaged store aside: %w", err)
	}
	return aside, nil
}

// openOrRebuild opens the store's Badger and, when it is damaged and
// opts.OnDamage is DamageRebuild, moves it aside and opens an empty one.
// aside is where the damaged store went ("" when it was not damaged).
func openOrRebuild(opts Options) (db *badger.DB, aside string, err error) {
	db, err = openBadger(opts)
	var de *DamageError
	if err == nil || !errors.As(err, &de) {
		return db, "", err
	}
	if opts.OnDamage != DamageRebuild {
		return nil, "", err
	}
	aside, merr := moveAside(opts, time.Now())
	if merr != nil {
		return nil, "", errors.Join(err, merr)
	}
	opts.Logger.Error("state: the store is damaged; moved it aside and starting empty: every partition is restored from the output stream before any message is judged",
		"file", de.File, "err", de.Err, "moved_to", aside, "fix", "delete "+aside+" once it is no longer needed")
	db, err = openBadger(opts)
	if err != nil {
		return nil, aside, fmt.Errorf("state: open an empty store after moving the damaged one to %s: %w", aside, err)
	}
	return db, aside, nil
}
