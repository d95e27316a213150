package changelog_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

func TestKeyStateSubject(t *testing.T) {
	if got := changelog.KeyStateSubject("out", 7); got != "_dedupe.out.key.7" {
		t.Errorf("KeyStateSubject = %q", got)
	}
}

// TestDecodeKeyState reads back what RefreshMsg and ForgetMsg write, and
// refuses, permanently, a key-state record it cannot read.
func TestDecodeKeyState(t *testing.T) {
	first, at := time.Unix(1_767_000_000, 1), time.Unix(1_767_000_060, 2)
	m := changelog.RefreshMsg("s", changelog.Record{Key: []byte("k"), FirstSeen: first, Fingerprint: 9, Version: 4, HasVersion: true, OutputSeq: 12}, at)
	if len(m.Data) != 0 || m.Header.Get("Nats-Msg-Id") != "" {
		t.Errorf("refresh record %+v: want headers only, no Nats-Msg-Id", m)
	}
	r, err := changelog.DecodeKeyState(m.Header)
	if err != nil || string(r.Key) != "k" || !r.FirstSeen.Equal(first) || r.Fingerprint != 9 || !r.WindowStart.Equal(at) ||
		r.Version != 4 || !r.HasVersion || !r.Forgotten.IsZero() || r.OutputSeq != 12 {
		t.Errorf("refresh decoded as %+v, %v", r, err)
	}
	f := changelog.ForgetMsg("s", changelog.Record{Key: []byte("k"), FirstSeen: first, Fingerprint: 9}, at)
	r, err = changelog.DecodeKeyState(f.Header)
	if err != nil || string(r.Key) != "k" || !r.Forgotten.Equal(at) || !r.WindowStart.IsZero() || !r.FirstSeen.Equal(first) || r.HasVersion || r.OutputSeq != 0 {
		t.Errorf("forget decoded as %+v, %v", r, err)
	}
	f = changelog.ForgetMsg("s", changelog.Record{Key: []byte("k"), FirstSeen: first, Fingerprint: 9, WindowStart: at}, at.Add(time.Second))
	r, err = changelog.DecodeKeyState(f.Header)
	if err != nil || !r.Forgotten.Equal(at.Add(time.Second)) || !r.WindowStart.Equal(at) {
		t.Errorf("forget of a refreshed record decoded as %+v, %v", r, err)
	}
	for name, h := range map[string]nats.Header{
		"no op":                 {changelog.HeaderKey: {"k"}},
		"unknown op":            {changelog.HeaderOp: {"rename"}, changelog.HeaderKey: {"k"}},
		"no key":                {changelog.HeaderOp: {changelog.OpForget}, changelog.HeaderForgotten: {"1"}},
		"forget without a time": {changelog.HeaderOp: {changelog.OpForget}, changelog.HeaderKey: {"k"}, changelog.HeaderFirstSeen: {"1"}, changelog.HeaderFingerprint: {"0000000000000001"}},
		"forget without record": {changelog.HeaderOp: {changelog.OpForget}, changelog.HeaderKey: {"k"}, changelog.HeaderForgotten: {"1"}},
		"refresh without start": {changelog.HeaderOp: {changelog.OpRefresh}, changelog.HeaderKey: {"k"}, changelog.HeaderFirstSeen: {"1"}, changelog.HeaderFingerprint: {"0000000000000001"}},
		"refresh without first": {changelog.HeaderOp: {changelog.OpRefresh}, changelog.HeaderKey: {"k"}, changelog.HeaderWindowStart: {"1"}, changelog.HeaderFingerprint: {"0000000000000001"}},
		"refresh bad version": {changelog.HeaderOp: {changelog.OpRefresh}, changelog.HeaderKey: {"k"}, changelog.HeaderWindowStart: {"1"},
			changelog.HeaderFirstSeen: {"1"}, changelog.HeaderFingerprint: {"0000000000000001"}, changelog.HeaderVersion: {"-1"}},
		"refresh bad output seq": {changelog.HeaderOp: {changelog.OpRefresh}, changelog.HeaderKey: {"k"}, changelog.HeaderWindowStart: {"1"},
			changelog.HeaderFirstSeen: {"1"}, changelog.HeaderFingerprint: {"0000000000000001"}, changelog.HeaderOutputSeq: {"0"}},
	} {
		if _, err := changelog.DecodeKeyState(h); !errors.Is(err, changelog.ErrNotARecord) || !retry.IsPermanent(err) {
			t.Errorf("%s: %v, want a permanent ErrNotARecord", name, err)
		}
	}
}

// TestRestoreReadsKeyState: Restore passes a partition's key-state records
// on, in stream order among its forwards, and not another partition's; a
// forward's OutputSeq is its own sequence, a key-state record's the one it
// carries.
func TestRestoreReadsKeyState(t *testing.T) {
	js := outStream(t)
	ctx := context.Background()
	recs := publishRecords(t, js, 1, 0, 2)
	at := recs[0].firstSeen.Add(time.Minute)
	publish := func(m *nats.Msg) {
		t.Helper()
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	publish(changelog.RefreshMsg(changelog.KeyStateSubject(prefix, 1), changelog.Record{Key: []byte(recs[0].key), FirstSeen: recs[0].firstSeen, Fingerprint: recs[0].fp, OutputSeq: 77}, at))
	publish(changelog.ForgetMsg(changelog.KeyStateSubject(prefix, 2), changelog.Record{Key: []byte("other"), FirstSeen: at, Fingerprint: 1}, at))
	publishRecords(t, js, 1, 2, 1)
	publish(changelog.ForgetMsg(changelog.KeyStateSubject(prefix, 1), changelog.Record{Key: []byte(recs[1].key), FirstSeen: recs[1].firstSeen, Fingerprint: recs[1].fp}, at))
	f, err := changelog.Take(ctx, js, "OUT", changelog.FenceSubject(prefix, 1), "B")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	_, err = changelog.Restore(ctx, js, "OUT", changelog.PartitionFilter(prefix, 1), changelog.FenceSubject(prefix, 1), changelog.KeyStateSubject(prefix, 1), 0, time.Time{}, f,
		func(r changelog.Record, seq uint64) error {
			switch {
			case !r.WindowStart.IsZero():
				got = append(got, "refresh "+string(r.Key))
				if r.OutputSeq != 77 {
					t.Errorf("refresh of %s at %d: OutputSeq %d, want the 77 it carries", r.Key, seq, r.OutputSeq)
				}
			case !r.Forgotten.IsZero():
				got = append(got, "forget "+string(r.Key))
				if r.OutputSeq != 0 {
					t.Errorf("forget of %s at %d: OutputSeq %d, want 0: it carries none", r.Key, seq, r.OutputSeq)
				}
			default:
				got = append(got, string(r.Key))
				if r.OutputSeq != seq {
					t.Errorf("forward %s at %d: OutputSeq %d, want its own sequence", r.Key, seq, r.OutputSeq)
				}
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"1-0", "1-1", "refresh 1-0", "1-2", "forget 1-1"}
	if len(got) != len(want) {
		t.Fatalf("restored %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("restored %q, want %q", got, want)
		}
	}
}

// TestReadShortSpanWhole: a read of a span shorter than Span.ReadAllUnder
// reads every subject of the stream and leaves out other partitions'
// forwards and key-state records, and fences, itself: it passes on what a
// filtered read of the span does, ends at the fence, and its reader has no
// filter (the server's pass over the subjects a filter matches is what it
// saves). A span as long as ReadAllUnder is read filtered.
func TestReadShortSpanWhole(t *testing.T) {
	js := outStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	publish := func(m *nats.Msg) {
		t.Helper()
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	recs := publishRecords(t, js, 1, 0, 3)
	at := recs[0].firstSeen.Add(time.Minute)
	if _, err := changelog.Take(ctx, js, "OUT", changelog.FenceSubject(prefix, 2), "A"); err != nil {
		t.Fatal(err)
	}
	publishRecords(t, js, 2, 0, 2)
	publish(changelog.RefreshMsg(changelog.KeyStateSubject(prefix, 1), changelog.Record{Key: []byte(recs[0].key), FirstSeen: recs[0].firstSeen, Fingerprint: recs[0].fp}, at))
	publish(changelog.ForgetMsg(changelog.KeyStateSubject(prefix, 2), changelog.Record{Key: []byte("2-0"), FirstSeen: at, Fingerprint: 1}, at))
	publishRecords(t, js, 1, 3, 2)
	publishRecords(t, js, 2, 2, 1)
	f, err := changelog.Take(ctx, js, "OUT", changelog.FenceSubject(prefix, 1), "B")
	if err != nil {
		t.Fatal(err)
	}
	publishRecords(t, js, 1, 5, 1) // past the fence
	st, err := js.Stream(ctx, "OUT")
	if err != nil {
		t.Fatal(err)
	}

	from := recs[1].seq
	span := f - from + 1
	read := func(readAllUnder uint64) (got []string, filters []string) {
		t.Helper()
		sp := changelog.Span{Stream: "OUT", Forwards: []string{changelog.PartitionFilter(prefix, 1)}, KeyState: changelog.KeyStateSubject(prefix, 1),
			Fence: changelog.FenceSubject(prefix, 1), From: from, UpTo: f, ReadAllUnder: readAllUnder}
		_, err := changelog.Read(ctx, js, sp, func(r changelog.Record, subject string, seq uint64) error {
			if filters == nil {
				for info := range st.ListConsumers(ctx).Info() {
					filters = append(append(filters, info.Config.FilterSubject), info.Config.FilterSubjects...)
				}
			}
			what := subject + " " + string(r.Key)
			if !r.WindowStart.IsZero() {
				what += " refresh"
			}
			got = append(got, what)
			return nil
		})
		if err != nil {
			t.Fatalf("read with ReadAllUnder %d: %v", readAllUnder, err)
		}
		return got, filters
	}
	filtered, withFilters := read(span)
	// A reader deletes its consumer in the background once it closes:
	// the second read lists only its own.
	natstest.Poll(t, 10*time.Second, 20*time.Millisecond, "the first reader's consumer deleted", func() (bool, error) {
		n := 0
		for range st.ListConsumers(ctx).Info() {
			n++
		}
		return n == 0, fmt.Errorf("%d consumers left", n)
	})
	whole, withoutFilters := read(span + 1)
	want := []string{"out.1.events.x 1-1", "out.1.events.x 1-2", "_dedupe.out.key.1 1-0 refresh", "out.1.events.x 1-3", "out.1.events.x 1-4"}
	if fmt.Sprint(filtered) != fmt.Sprint(want) || fmt.Sprint(whole) != fmt.Sprint(want) {
		t.Errorf("read filtered %q, whole %q; want %q", filtered, whole, want)
	}
	if len(strings.Join(withFilters, "")) == 0 {
		t.Errorf("a span of %d sequences with ReadAllUnder %d was read without a filter", span, span)
	}
	if got := strings.Join(withoutFilters, ""); got != "" {
		t.Errorf("a span of %d sequences with ReadAllUnder %d was read with filters %q, want none", span, span+1, withoutFilters)
	}
}
