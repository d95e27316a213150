package stage_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// restoreKeys is how many records TestScaleOutRestoresMillionKeys restores:
// 1M, or 50k under the race detector, which makes writing and restoring
// 1M records take over ten minutes here. 50k still restores three of its
// 4096-record chunks into each of the 4 partitions.
func restoreKeys(t *testing.T) int {
	if raceEnabled {
		t.Log("the race detector is on: 50000 records instead of 1M; the 1M restore runs without it: go test -run TestScaleOutRestoresMillionKeys ./stage/")
		return 50_000
	}
	return 1_000_000
}

// TestScaleOutRestoresMillionKeys gives an instance with an empty data dir
// the partitions of an output stream holding 1M records (restoreKeys), as a former owner
// left them: it takes every partition and restores it exactly. Copies of a
// sample of those keys (every 50th, the first and the last) arriving
// afterwards are each recognised as a repeat, and new keys are forwarded
// once; then the instance's store, opened on its own, holds every one of
// the 1M keys with the first-seen time and fingerprint of its record.
func TestScaleOutRestoresMillionKeys(t *testing.T) {
	restoreKeys := restoreKeys(t)
	e := newScaleOutEnv(t).as("fresh")
	e.cfg.Filter.ExpectedKeys = 2 * uint64(restoreKeys)
	e.cfg.State.MemoryBudget = 128 << 20
	createStreams(t, e.js, e.cfg)
	data := []byte("restored payload")
	firstSeen := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	began := time.Now()
	publishRecords(t, e.js, e.cfg, restoreKeys, data, firstSeen)
	t.Logf("%d records written to the output in %v", restoreKeys, time.Since(began).Round(time.Millisecond))

	began = time.Now()
	r := e.start()
	payload := map[string][]byte{}
	var copies []string
	for i := 0; i < restoreKeys; i += 50 {
		copies = append(copies, recordKey(i))
	}
	copies = append(copies, recordKey(restoreKeys-1))
	for _, k := range copies {
		payload[k] = data
	}
	fresh, freshPayload := workload(21, 1000, 0)
	var news []string
	for _, ev := range fresh {
		news = append(news, ev.key)
		payload[ev.key] = freshPayload[ev.key]
	}
	e.publishKeys(append(copies, news...), payload)
	e.scaleOutDrained(5 * time.Minute)
	t.Logf("taken, restored and judged %d copies and %d new keys in %v", len(copies), len(news), time.Since(began).Round(time.Millisecond))

	// On a loaded machine a pin can lapse and the instance take a
	// partition again: that restores from its cursor, so the records
	// restored add up to at least every record once.
	takeovers := counter(t, r.reg, "dedupe_partition_takeovers_total", nil)
	restored := counter(t, r.reg, "dedupe_restore_records_total", nil)
	t.Logf("partitions taken %v times, %v records restored", takeovers, restored)
	if takeovers < float64(e.cfg.State.Partitions) {
		t.Errorf("took partitions %v times, want every one of the %d", takeovers, e.cfg.State.Partitions)
	}
	if restored < float64(restoreKeys) {
		t.Errorf("restored %v records, want %d", restored, restoreKeys)
	}
	// A copy the server redelivers (its ack_wait passed on a loaded
	// machine) is judged again, a repeat again: at least every copy.
	if got := counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "repeat"}); got < float64(len(copies)) {
		t.Errorf("recognised %v repeats, want every one of the %d copies of restored keys", got, len(copies))
	}
	if got := counter(t, r.reg, "dedupe_messages_total", map[string]string{"outcome": "new"}); got != float64(len(news)) {
		t.Errorf("forwarded %v new keys, want %d", got, len(news))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := e.js.Stream(ctx, e.cfg.Output.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := out.Info(ctx, jetstream.WithSubjectFilter(changelog.ControlSubjects(e.cfg.Output.SubjectPrefix)))
	if err != nil {
		t.Fatal(err)
	}
	fences := uint64(0)
	for _, n := range info.State.Subjects {
		fences += n
	}
	if want := uint64(restoreKeys+len(news)) + fences; info.State.Msgs != want {
		t.Errorf("output holds %d messages, want the %d records, the %d new keys and %d fence messages: a copy was forwarded again",
			info.State.Msgs, restoreKeys, len(news), fences)
	}
	if n := len(e.deadLetters()); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
	r.stop(t)

	w, err := e.cfg.Window.Derive()
	if err != nil {
		t.Fatal(err)
	}
	st, err := state.Open(context.Background(), e.cfg.StateOptions(w))
	if err != nil {
		t.Fatalf("open the restored store: %v", err)
	}
	defer st.Close()
	fp := fingerprintOf(data)
	missing, wrong := 0, 0
	for i := range restoreKeys {
		k := recordKey(i)
		res, err := st.Partition(partitionOf(k, e.cfg.State.Partitions)).Lookup([]byte(k), time.Time{})
		switch {
		case err != nil:
			t.Fatalf("lookup %s: %v", k, err)
		case !res.Found:
			missing++
		case !res.Record.FirstSeen.Equal(firstSeen) || res.Record.Fingerprint != fp:
			if wrong == 0 {
				t.Errorf("key %s restored as %+v, want first seen %v and fingerprint %016x", k, res.Record, firstSeen, fp)
			}
			wrong++
		}
	}
	if missing != 0 || wrong != 0 {
		t.Errorf("of %d restored keys, %d are missing from the store and %d have another record", restoreKeys, missing, wrong)
	}
}
