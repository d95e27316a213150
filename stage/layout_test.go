package stage_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dedupe-stage/dedupe-stage/stage"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// TestPartitionCountChangeSaysWhatToDo: reopening a data dir with another
// state.partitions names the field, the two counts, and the way out.
func TestPartitionCountChangeSaysWhatToDo(t *testing.T) {
	e := newEnv(t)
	e.start().stop(t)
	e.cfg.State.Partitions = 2
	_, err := stage.New(context.Background(), stage.Options{Config: e.cfg, Conn: e.nc})
	if !errors.Is(err, state.ErrLayout) {
		t.Fatalf("New with another partition count: %v, want ErrLayout", err)
	}
	for _, want := range []string{"made with 4 partitions", "2 were asked for", "state.partitions", "--partitions",
		"new, empty data dir", "state.data_dir", "Changing the partition count"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "Options.Partitions") {
		t.Errorf("error speaks Go: %v", err)
	}
}
