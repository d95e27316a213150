package main

import (
	"errors"
	"math"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dedupe-stage/dedupe-stage/config"
	"github.com/dedupe-stage/dedupe-stage/keys"
)

// testScaleOutEnv is a scale-out environment with a workload and no
// processes, for the parts of a row that need none.
func testScaleOutEnv(t *testing.T, events int, badRatio float64) *soEnv {
	t.Helper()
	f, err := parseFlags([]string{"--scaleout", "--events", strconv.Itoa(events), "--bad-ratio", strconv.FormatFloat(badRatio, 'g', -1, 64)})
	if err != nil {
		t.Fatal(err)
	}
	bad := int(math.Round(float64(events) * badRatio))
	keyed := events - bad
	w := 70 * time.Minute
	thr, err := Generate(Spec{Prefix: "thr", Seed: 1, Events: keyed, Keys: int(float64(keyed) * 0.7), Mix: f.mix, BurstSize: 3, PayloadSize: 256, W: w, Span: w * 9 / 10})
	if err != nil {
		t.Fatal(err)
	}
	return &soEnv{f: f, thr: thr, bad: bad, dir: t.TempDir(), cl: &natsCluster{clients: []int{4222, 4223, 4224}}}
}

// TestScaleOutBacklog checks the backlog each mode publishes against the
// instances' own key configuration: every keyed event once, in the
// workload's order, under its key; every bad input refused by the key
// function (so the stage must dead-letter it), spread over the backlog.
func TestScaleOutBacklog(t *testing.T) {
	for _, mode := range []string{soOff, soHeader, soSubject} {
		t.Run(mode, func(t *testing.T) {
			e := testScaleOutEnv(t, 10_000, 0.01)
			n := namesForRow(0)
			cfg, err := config.Parse([]byte(e.yaml(soRow{mode: mode, instances: 1}, n, "i0", filepath.Join(e.dir, "data"), "127.0.0.1:1")))
			if err != nil {
				t.Fatal(err)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("the instance's configuration is invalid: %v", err)
			}
			kf, err := keys.NewKeyFunc(cfg.Key)
			if err != nil {
				t.Fatal(err)
			}
			total := len(e.thr.Main) + e.bad
			msg := e.backlogMsg(soRow{mode: mode}, n)
			var badAt []int
			k := 0
			for i := range total {
				m := msg(i)
				key, err := kf.Key(m.Subject, m.Header, m.Data)
				if m.Header.Get(headerBad) != "" {
					var ke *keys.Error
					if !errors.As(err, &ke) {
						t.Fatalf("bad input %d on %s: key %q, err %v; want a key error", len(badAt), m.Subject, key, err)
					}
					badAt = append(badAt, i)
					continue
				}
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				if want := e.thr.Key(int(e.thr.Main[k].Key)); string(key) != want {
					t.Fatalf("event %d: key %q, want %q (the workload's event %d)", i, key, want, k)
				}
				k++
			}
			if k != len(e.thr.Main) || len(badAt) != e.bad {
				t.Fatalf("backlog: %d keyed events and %d bad inputs, want %d and %d", k, len(badAt), len(e.thr.Main), e.bad)
			}
			gap := total / e.bad
			for i := 1; i < len(badAt); i++ {
				if d := badAt[i] - badAt[i-1]; d < gap-1 || d > gap+1 {
					t.Fatalf("bad inputs %d and %d are %d events apart, want about %d", i-1, i, d, gap)
				}
			}
		})
	}
}

// TestScaleOutFlags checks the mode's defaults and refusals.
func TestScaleOutFlags(t *testing.T) {
	f, err := parseFlags([]string{"--scaleout"})
	if err != nil {
		t.Fatal(err)
	}
	if f.syncAlways || f.repeatRatio != 0.3 || f.mix[ClassNear] != 0 || f.mix[ClassPast] != 0 || len(f.kinds) != 0 {
		t.Errorf("defaults: sync-always %v, repeat-ratio %v, mix %v, configs %v; want false, 0.3, no near or past copies, none",
			f.syncAlways, f.repeatRatio, f.mix, f.kinds)
	}
	rows := planRows(f.soModes, f.soInstances, f.cpuCaps)
	if len(rows) != 14 || rows[0] != (soRow{mode: soOff, instances: 1}) || rows[13] != (soRow{mode: soSubject, instances: 3, cap: 0.25}) {
		t.Errorf("default rows: %v; want off, header x1..3, subject x1..3, uncapped then capped at 0.25", rows)
	}
	if f, err := parseFlags([]string{"--scaleout", "--sync-always", "--repeat-ratio", "0.1"}); err != nil || !f.syncAlways || f.repeatRatio != 0.1 {
		t.Errorf("flags given: sync-always %v, repeat-ratio %v, err %v; want them kept", f.syncAlways, f.repeatRatio, err)
	}
	for _, args := range [][]string{
		{"--scaleout", "--configs", "raw"},
		{"--scaleout", "--ages", "burst=0.5,past=0.5"},
		{"--scaleout", "--scaleout-instances", "9"},
		{"--scaleout", "--cpu-cap", "-1"},
		{"--scaleout", "--scaleout-rows", "on"},
		{"--scaleout", "--scaleout-ack-wait", "1s"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%v: accepted, want an error", args)
		}
	}
}

// TestSeriesHistogram reads a histogram's mean and p99 bucket back from
// the text a real registry serves (promhttp, as the stage's /metrics), as the scale-out mode reads the
// instances' /metrics, over the difference of two scrapes.
func TestSeriesHistogram(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dedupe_publish_seconds", Buckets: prometheus.ExponentialBuckets(0.001, 2, 10)})
	reg.MustRegister(h)
	expose := func() series {
		rec := httptest.NewRecorder()
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		s, err := parseSeries(rec.Body)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for range 50 {
		h.Observe(0.5) // before: not part of the difference
	}
	before := expose()
	for i := range 100 {
		h.Observe(0.003)
		if i == 0 {
			h.Observe(0.1)
		}
	}
	count, sum, p99 := expose().minus(before).histogram("dedupe_publish_seconds", 0.99)
	if count != 101 || math.Abs(sum-(100*0.003+0.1)) > 1e-9 || p99 != 0.004 {
		t.Errorf("count %v, sum %v, p99 bucket %v; want 101, 0.4, 0.004", count, sum, p99)
	}
}
