package faults

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// smallDisk mounts a tmpfs of size (e.g. "64m") on a new directory and
// returns it; it is unmounted when the test ends. It skips the test when
// the mount is not possible (not root, or no CAP_SYS_ADMIN), saying why.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("mounting a %s tmpfs for the data dir needs root; running as uid %d", size, os.Geteuid())
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (mount -t tmpfs -o size=%s tmpfs %s): %v: %s", size, dir, err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillDisk writes path until the file system holding it has no space left,
// and returns the bytes written.
func fillDisk(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var written int64
	for _, chunk := range []int{1 << 20, 4 << 10, 512} {
		buf := make([]byte, chunk)
		for {
			n, err := f.Write(buf)
			written += int64(n)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	if free := st.Bavail * uint64(st.Bsize); free > 64<<10 {
		t.Fatalf("%d bytes still free after filling %s", free, path)
	}
	return written
}

// TestDataDirFull fills the file system of the stage's data directory (a
// small tmpfs) while inputs keep arriving. The stage must keep running,
// answer 503 on /healthz naming the failing commit, acknowledge no input
// whose key it could not record (the new keys are already in the output:
// the order is publish, commit, ack), and once the space is freed, record
// and acknowledge everything. Every key ends in the output exactly once.
func TestDataDirFull(t *testing.T) {
	t.Parallel()
	seed := testSeed(t)
	disk := smallDisk(t, "128m")
	srv := startNATSUnsynced(t)
	cfg := defaultStageConfig(t, srv.URL())
	cfg.DataDir = filepath.Join(disk, "data")
	js := publisherJS(t, srv.URL())
	s := newStage(t, cfg)
	w := newWorkload(seed, "full", cfg.MaxMessageBytes)
	p := s.startReady()
	mustPublish(t, js, w.mix(2000, 0.25, 0.02, 0), "before")
	waitDrained(t, js, 60*time.Second)

	filler := filepath.Join(disk, "filler")
	n := fillDisk(t, filler)
	t.Logf("filled the data dir's file system with %d MiB", n>>20)
	events := w.mix(3000, 0.25, 0.02, 0)
	acks := mustPublish(t, js, events, "full")
	natstest.WaitFor(t, 30*time.Second, "/healthz to answer 503", func() bool {
		if !p.Running() {
			t.Fatalf("the stage exited on a full disk: %v\n%s", p.Err(), crashReport(p.Log()))
		}
		code, _ := s.get("/healthz")
		return code == http.StatusServiceUnavailable
	})
	if _, body := s.get("/healthz"); !strings.Contains(body, "commit") {
		t.Errorf("/healthz does not name the failing commit: %s", body)
	} else {
		t.Logf("/healthz: 503 %s", strings.TrimSpace(body))
	}
	floor := consumerInfo(t, js).AckFloor.Stream
	// Nothing may be acked for three ack_waits: the floor is watched
	// throughout, and checked below.
	natstest.Until(3*cfg.AckWait, 100*time.Millisecond, func() bool {
		return consumerInfo(t, js).AckFloor.Stream != floor
	})
	if !p.Running() {
		t.Fatalf("the stage exited on a full disk: %v\n%s", p.Err(), crashReport(p.Log()))
	}
	ci := consumerInfo(t, js)
	if ci.AckFloor.Stream != floor {
		t.Errorf("ack floor moved from %d to %d while no key could be recorded", floor, ci.AckFloor.Stream)
	}
	unacked := 0
	for _, e := range events {
		if e.bad == "" && w.firstID[e.key] == e.id {
			if acks[e.id].seq <= ci.AckFloor.Stream {
				t.Errorf("input %d (new key %s) acknowledged while the disk is full", e.id, e.key)
				break
			}
			unacked++
		}
	}
	t.Logf("disk full: %d new keys unrecorded, ack floor %d, %d awaiting an ack, %d in the output",
		unacked, ci.AckFloor.Stream, ci.NumAckPending, streamMsgs(js, outputStream))

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitDrained(t, js, 60*time.Second)
	natstest.WaitFor(t, 15*time.Second, "/healthz to answer 200", func() bool {
		code, _ := s.get("/healthz")
		return code == http.StatusOK
	})
	if !strings.Contains(p.Log(), `"msg":"state commit recovered"`) {
		t.Error("the log does not say the commits recovered")
	}
	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)

	// Full again, a kill, and a start on the full disk: the stage must
	// refuse to start, saying why, and start once there is space.
	fillDisk(t, filler)
	mustPublish(t, js, w.mix(2000, 0.25, 0.02, 0), "full-again")
	natstest.WaitFor(t, 30*time.Second, "/healthz to answer 503", func() bool {
		code, _ := s.get("/healthz")
		return code == http.StatusServiceUnavailable
	})
	p.kill(t)
	p = s.start()
	select {
	case <-p.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the stage is still starting on a full disk after 30s")
	}
	var exit *exec.ExitError
	if !errors.As(p.Err(), &exit) || exit.ExitCode() != 1 || !strings.Contains(p.Log(), "too little free disk space") {
		t.Fatalf("start on a full disk: %v, want exit status 1 saying there is too little free disk space:\n%s", p.Err(), crashReport(p.Log()))
	}
	t.Logf("start on a full disk: %v after %v: %s", p.Err(), time.Since(p.Started).Round(time.Millisecond), strings.TrimSpace(proctest.Tail(p.Log(), 300)))
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	p = s.startReady()
	waitDrained(t, js, 60*time.Second)
	if code, body := s.get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz after the disk recovered: %d %s", code, body)
	}
	checkOutput(t, js, w.forward)
	checkDeadLetters(t, js, w.dead)
}
