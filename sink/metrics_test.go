package sink

import (
	"context"
	"errors"
	"testing"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/prometheus/client_golang/prometheus"
)

func TestInstrument(t *testing.T) {
	srv := natstest.RunServer(t, "")
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	s := Instrument(NewKV(newKVBucket(t, srv)), m)
	if s.Name() != "kv" {
		t.Fatalf("Name() = %q, want kv", s.Name())
	}

	checkedWrite(t, s, []Total{tot("a", bucket0, 5), tot("b", bucket0, 1)})
	checkedWrite(t, s, []Total{tot("a", bucket0, 4), tot("b", bucket0, 2), tot("b", bucket0, 1)})
	if _, err := s.Write(context.Background(), []Total{tot("", bucket0, 1)}); !errors.Is(err, ErrBadTotal) {
		t.Fatalf("Write of a bad total: error = %v, want ErrBadTotal", err)
	}

	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"dedupe_sink_writes_total", map[string]string{"sink": "kv", "result": "applied"}, 3},
		{"dedupe_sink_writes_total", map[string]string{"sink": "kv", "result": "stale"}, 2},
		{"dedupe_sink_write_retries_total", map[string]string{"sink": "kv"}, 0},
		{"dedupe_sink_write_errors_total", map[string]string{"sink": "kv"}, 1},
		{"dedupe_sink_write_seconds", map[string]string{"sink": "kv"}, 3}, // sample count
	} {
		if got := metrictest.Value(t, reg, tc.name, tc.labels); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(context.Background(), []Total{tot("a", bucket0, 9)}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close through Instrument: error = %v, want ErrClosed", err)
	}
	if got := metrictest.Value(t, reg, "dedupe_sink_write_errors_total", map[string]string{"sink": "kv"}); got != 2 {
		t.Fatalf("errors after a closed Write = %v, want 2", got)
	}
}

func TestInstrumentNil(t *testing.T) {
	s := NewKV(nil)
	if got := Instrument(s, nil); got != s {
		t.Fatalf("Instrument(s, nil) = %v, want s itself", got)
	}
	// Metrics without a registry still count.
	m := NewMetrics(nil)
	if err := Instrument(s, m).Close(); err != nil {
		t.Fatal(err)
	}
}
