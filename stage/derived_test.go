package stage_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/internal/boot"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// TestCheckConfigAgreesWithWhatRunBuilds compares the figures check-config
// prints (config's Summary and the values it is made from) with the objects
// the stage builds from the same configuration: each partition's filter,
// the store's partitions and filter memory, the output stream's duplicate
// window and subjects, the subject a message is forwarded to, and the
// embedded server's store directory.
func TestCheckConfigAgreesWithWhatRunBuilds(t *testing.T) {
	e := newEnv(t)
	e.cfg.Filter.ExpectedKeys = 123_457 // not a multiple of partitions or generations
	e.cfg.Filter.Generations = 5
	e.cfg.Filter.FalsePositiveRate = 0.003
	summary := e.cfg.Summary()
	win, err := e.cfg.Window.Derive()
	if err != nil {
		t.Fatal(err)
	}
	want, err := e.cfg.StateOptions(win).FilterSizing()
	if err != nil {
		t.Fatal(err)
	}
	r := e.start()
	store := r.st.Store()

	// Partitions and filters.
	if store.Partitions() != e.cfg.State.Partitions {
		t.Errorf("store has %d partitions, config says %d", store.Partitions(), e.cfg.State.Partitions)
	}
	for i := range store.Partitions() {
		fo, ok := store.Partition(i).FilterOptions()
		if !ok {
			t.Fatalf("partition %d has no filter", i)
		}
		got, err := fo.Sizing()
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("partition %d filter sizing %+v, check-config's %+v", i, got, want)
		}
		for _, s := range []string{
			fmt.Sprintf("%d+1 generations of %d keys, p=%.3g, m=%d bits, k=%d hash functions",
				fo.Generations, got.KeysPerGeneration, got.FalsePositiveRatePerGeneration, got.BitsPerGeneration, got.Hashes),
			fmt.Sprintf("%d+1 generations of %d keys\n", fo.Generations, uint64(got.KeysPerGeneration)*uint64(store.Partitions())),
		} {
			if !strings.Contains(summary, s) {
				t.Errorf("check-config does not print the built filter's %q:\n%s", s, summary)
			}
		}
	}
	if got := store.Stats().FilterBytes; got != want.MemoryBytes*uint64(e.cfg.State.Partitions) {
		t.Errorf("built filters hold %d bytes, check-config counts %d x %d", got, want.MemoryBytes, e.cfg.State.Partitions)
	}

	// The output stream as created.
	st, err := e.js.Stream(context.Background(), e.cfg.Output.Stream)
	if err != nil {
		t.Fatal(err)
	}
	sc := st.CachedInfo().Config
	if sc.Duplicates != e.cfg.OutputDuplicateWindow() {
		t.Errorf("output stream created with duplicate window %v, check-config says %v", sc.Duplicates, e.cfg.OutputDuplicateWindow())
	}
	if s := fmt.Sprintf("duplicate window %v (computed)", config.Duration(sc.Duplicates)); !strings.Contains(summary, s) {
		t.Errorf("check-config does not print %q:\n%s", s, summary)
	}
	if !strings.Contains(summary, "(subjects "+strings.Join(sc.Subjects, ", ")+")") {
		t.Errorf("output stream subjects %q; check-config:\n%s", sc.Subjects, summary)
	}

	// The subject a message is forwarded to.
	e.publish([]event{{key: "k1", payload: []byte("p")}})
	e.drained(30 * time.Second)
	out := natstest.ReadAll(t, e.js, e.cfg.Output.Stream)
	if len(out) != 1 || out[0].Subject != e.cfg.Output.Subject("events.orders") {
		t.Errorf("forwarded %d messages, first on %v; want one on %q", len(out), out, e.cfg.Output.Subject("events.orders"))
	}
	r.stop(t)

	// The embedded server's store directory.
	c := config.Default()
	c.State.DataDir = t.TempDir()
	c.NATS.Embedded.Port = -1
	srv, err := boot.StartEmbedded(c.EmbeddedServer(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	if got := srv.JetStreamConfig().StoreDir; filepath.Clean(got) != filepath.Join(c.EmbeddedStoreDir(), "jetstream") {
		t.Errorf("embedded server stores in %q, check-config says %q", got, c.EmbeddedStoreDir())
	}
	if !strings.Contains(c.Summary(), "JetStream store "+c.EmbeddedStoreDir()) {
		t.Errorf("check-config does not print the store dir %q:\n%s", c.EmbeddedStoreDir(), c.Summary())
	}
}
