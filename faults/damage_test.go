package faults

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// TestDamagedStore damages a stopped stage's store (a flipped byte in a
// table, which Badger's default would never notice) and starts it twice:
// with state.on_damage unset it must refuse, with exit status 1 and a
// message naming the damaged file and the fix, and change nothing on disk;
// with rebuild it must move the store aside (keeping the damaged file),
// restore every partition from the output stream, and then forward no
// repeat of the keys it forwarded before the damage (published after the
// output's duplicate window, so that only the rebuilt store can catch
// them), nor lose a new key.
func TestDamagedStore(t *testing.T) {
	t.Parallel()
	seed := testSeed(t)
	srv := startNATS(t)
	cfg := defaultStageConfig(t, srv.URL())
	cfg.RestartMargin = time.Second
	cfg.DuplicateWindow = 4 * time.Second // covers ack_wait + restart_margin; the repeats come after it
	js := publisherJS(t, srv.URL())
	s := newStage(t, cfg)
	w := newWorkload(seed, "dmg", cfg.MaxMessageBytes)

	p := s.startReady()
	mustPublish(t, js, w.mix(2000, 0.2, 0.02, 0), "before")
	waitDrained(t, js, 60*time.Second)
	p.signal(t, syscall.SIGTERM, 30*time.Second)
	before := slices.Clone(w.keys)

	tables := storeTables(t, cfg)
	damaged, b := flipTableByte(t, tables[0])
	refusedThenRebuilt(t, s, damaged, b, cfg.DuplicateWindow)
	p = s.last()
	if !strings.Contains(p.Log(), logReadBack) {
		t.Error("the log does not say the output was read back")
	}
	restored := s.metric("dedupe_start_restored_records_total")
	if restored != float64(len(before)) {
		t.Errorf("dedupe_start_restored_records_total = %v, want the %d keys forwarded before the damage", restored, len(before))
	}
	copies := make([]event, 0, len(before)+500)
	for _, k := range before {
		copies = append(copies, w.copyOf(k))
	}
	copies = append(copies, w.mix(500, 0.2, 0.02, 0)...)
	mustPublish(t, js, copies, "after")
	waitDrained(t, js, 60*time.Second)
	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)
	t.Logf("rebuilt: %d keys restored from the output, %d copies of them published after the duplicate window and none forwarded; %d keys forwarded once in all",
		int(restored), len(before), len(w.forward))
}

// storeTables returns the Badger tables of cfg's store; it fails when
// there is none.
func storeTables(t *testing.T, cfg stageConfig) []string {
	t.Helper()
	badgerDir := filepath.Join(cfg.DataDir, "state", state.BadgerDir)
	tables, err := filepath.Glob(filepath.Join(badgerDir, "*.sst"))
	if err != nil || len(tables) == 0 {
		t.Fatalf("no table in %s after a clean stop: %v", badgerDir, err)
	}
	return tables
}

// flipTableByte inverts byte 100 of the table path (in its first block,
// whose checksum Badger's default never reads) and returns path and the
// table's damaged bytes.
func flipTableByte(t *testing.T, path string) (string, []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[100] ^= 0xff
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: flipped byte 100 of %s (%d bytes)", time.Now().Format(time.RFC3339Nano), path, len(b))
	return path, b
}

// refusedThenRebuilt starts s on its damaged store (the table damaged,
// now holding b) twice: with state.on_damage unset it must exit with
// status 1 naming the table and the fix, changing nothing; then, once the
// output's duplicate window dup has passed, with rebuild it must start,
// saying it moved the store aside, and keep the damaged table there.
func refusedThenRebuilt(t *testing.T, s *stage, damaged string, b []byte, dup time.Duration) {
	t.Helper()
	p := s.start()
	select {
	case <-p.Exited():
	case <-time.After(60 * time.Second):
		t.Fatal("the stage is still running on a damaged store after 60s")
	}
	var exit *exec.ExitError
	if !errors.As(p.Err(), &exit) || exit.ExitCode() != 1 {
		t.Fatalf("start on a damaged store: %v, want exit status 1:\n%s", p.Err(), crashReport(p.Log()))
	}
	for _, want := range []string{"the store is damaged", damaged, "state.on_damage: rebuild"} {
		if !strings.Contains(p.Log(), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, proctest.Tail(p.Log(), 2000))
		}
	}
	after, err := os.ReadFile(damaged)
	if err != nil || !slices.Equal(after, b) {
		t.Errorf("the refused start changed %s (%v)", damaged, err)
	}
	t.Logf("refused after %v: %v: %s", time.Since(p.Started).Round(time.Millisecond), p.Err(), strings.TrimSpace(proctest.Tail(p.Log(), 600)))

	time.Sleep(dup + time.Second) // on purpose: the copies that follow must come after the window
	s.cfg.OnDamage = "rebuild"
	if err := os.WriteFile(s.cfgPath, []byte(s.cfg.yaml()), 0o644); err != nil {
		t.Fatal(err)
	}
	p = s.startReady()
	if !strings.Contains(p.Log(), "moved it aside and starting empty") {
		t.Errorf("the log does not say the store was moved aside:\n%s", proctest.Tail(p.Log(), 2000))
	}
	aside, err := filepath.Glob(filepath.Join(s.cfg.DataDir, "state", state.DamagedPrefix+"*", state.BadgerDir, filepath.Base(damaged)))
	if err != nil || len(aside) != 1 {
		t.Fatalf("the damaged table was not kept in a %s* dir: %q, %v", state.DamagedPrefix, aside, err)
	}
	if kept, err := os.ReadFile(aside[0]); err != nil || !slices.Equal(kept, b) {
		t.Errorf("the damaged table kept in %s differs from the one damaged (%v)", aside[0], err)
	}
}

// TestDamagedStoreGroupMember damages the store of one member of a group
// of two (a flipped byte in a table, while it is stopped): it is refused,
// then rebuilt; the member takes its share of the partitions back,
// restoring each from the output, and late copies of the group's first
// keys, published after the output's duplicate window, are not forwarded
// again: every key once, every bad input one dead letter.
func TestDamagedStoreGroupMember(t *testing.T) {
	t.Parallel()
	w := newWorkload(testSeed(t), "dmgg", 4096)
	_, stages, js := scaleOutGroup(t, 2, w, "")
	mustPublish(t, js, w.mix(2000, 0.2, 0.02, 0), "before")
	scaleOutDrained(t, js, stages[0].cfg.Partitions, takeoverWait)
	t.Log("SIGTERM i1")
	stages[1].last().signal(t, syscall.SIGTERM, 30*time.Second)
	damaged, b := flipTableByte(t, storeTables(t, stages[1].cfg)[0])
	refusedThenRebuilt(t, stages[1], damaged, b, scaleOutDup)
	waitSpread(t, js, w, stages, takeoverWait)
	t.Logf("partitions owned after the rebuild: i0 %d, i1 %d", stages[0].owned(), stages[1].owned())
	lateCopiesThenCheck(t, js, w, stages[0].cfg.Partitions)
}
