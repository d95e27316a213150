package changelog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/internal/forward"
	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

const prefix = "out"

// outStream starts a server and creates stream OUT on out.> allowing
// atomic publish.
func outStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	s := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, s.ClientURL())
	cfg := jetstream.StreamConfig{Name: "OUT", Subjects: []string{prefix + ".>", changelog.ControlSubjects(prefix)}, Duplicates: time.Minute, AllowAtomicPublish: true}
	if _, err := js.CreateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	return js
}

// record is one record as published and as read back.
type record struct {
	key       string
	firstSeen time.Time
	fp        uint64
	group     string // "" when the record adds to no total
	bucket    time.Time
	value     int64
	seq       uint64
}

// publishRecords publishes n annotated records of partition p, keys
// <p>-<from>.., every third one with a contribution to a total, and
// returns them with their sequences.
func publishRecords(t *testing.T, js jetstream.JetStream, p, from, n int) []record {
	t.Helper()
	var out []record
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := from; i < from+n; i++ {
		r := record{key: fmt.Sprintf("%d-%d", p, i), firstSeen: base.Add(time.Duration(i)*time.Second + time.Duration(p)), fp: uint64(i)<<32 | uint64(p)}
		h := nats.Header{jetstream.MsgIDHeader: {r.key}}
		changelog.Annotate(h, r.firstSeen, r.fp)
		if i%3 == 0 {
			r.group, r.bucket, r.value = fmt.Sprintf("g%d", i%2), base.Truncate(time.Hour).Add(time.Duration(i%4)*time.Minute), int64(i)
			changelog.AnnotateTotal(h, r.group, r.bucket, r.value)
		}
		ack, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: changelog.PartitionSubject(prefix, p, "events.x"), Header: h, Data: []byte("payload")})
		if err != nil {
			t.Fatal(err)
		}
		r.seq = ack.Sequence
		out = append(out, r)
	}
	return out
}

// restore runs Restore and returns the records it passed on. upTo is a
// sequence Restore reads: partition 1's fence (FenceSubject(prefix, 1)),
// or a record of partition p, or it is below every record of p that it
// reads.
func restore(t *testing.T, js jetstream.JetStream, p int, from uint64, since time.Time, upTo uint64) []record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got []record
	st, err := changelog.Restore(ctx, js, "OUT", changelog.PartitionFilter(prefix, p), changelog.FenceSubject(prefix, 1), changelog.KeyStateSubject(prefix, p), from, since, upTo,
		func(r changelog.Record, seq uint64) error {
			got = append(got, asRecord(r, seq))
			return nil
		})
	if err != nil {
		t.Fatalf("restore p%d from %d since %v up to %d: %v", p, from, since, upTo, err)
	}
	if st.Records != len(got) {
		t.Errorf("Restore returned %d, passed %d records on", st.Records, len(got))
	}
	return got
}

// sameRecords fails unless got equals want, in order.
func sameRecords(t *testing.T, what string, got, want []record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d records, want %d", what, len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.key != w.key || !g.firstSeen.Equal(w.firstSeen) || g.fp != w.fp || g.seq != w.seq ||
			g.group != w.group || !g.bucket.Equal(w.bucket) || g.value != w.value {
			t.Errorf("%s: record %d = %+v, want %+v", what, i, g, w)
		}
	}
}

func TestSubjects(t *testing.T) {
	if got := changelog.FenceSubject("out", 3); got != "_dedupe.out.fence.3" {
		t.Errorf("FenceSubject = %q", got)
	}
	if got := changelog.ControlSubjects("out"); got != "_dedupe.out.>" {
		t.Errorf("ControlSubjects = %q", got)
	}
	if got := changelog.PartitionSubject("out", 12, "events.a.b"); got != "out.12.events.a.b" {
		t.Errorf("PartitionSubject = %q", got)
	}
	if got := changelog.PartitionFilter("out", 12); got != "out.12.>" {
		t.Errorf("PartitionFilter = %q", got)
	}
}

func TestDecode(t *testing.T) {
	first := time.Unix(1_767_000_000, 123_456_789)
	h := nats.Header{jetstream.MsgIDHeader: {"k1"}}
	changelog.Annotate(h, first, 0xab)
	if got := h.Get(changelog.HeaderFingerprint); got != "00000000000000ab" {
		t.Errorf("fingerprint header %q, want 16 lowercase hex digits", got)
	}
	if got := h.Get(changelog.HeaderFirstSeen); got != "1767000000123456789" {
		t.Errorf("first-seen header %q, want Unix nanoseconds", got)
	}
	r, err := changelog.DecodeHeader(h)
	if err != nil || string(r.Key) != "k1" || !r.FirstSeen.Equal(first) || r.Fingerprint != 0xab || r.Group != "" {
		t.Errorf("DecodeHeader = %+v %v", r, err)
	}
	bucket := time.Unix(1_767_000_000, 0).UTC()
	changelog.AnnotateTotal(h, "campaign 7", bucket, 42)
	if got := h.Get(changelog.HeaderBucket); got != "1767000000" {
		t.Errorf("bucket header %q, want Unix seconds", got)
	}
	r, err = changelog.DecodeHeader(h)
	if err != nil || r.Group != "campaign 7" || !r.Bucket.Equal(bucket) || r.Value != 42 || string(r.Key) != "k1" {
		t.Errorf("DecodeHeader with a total = %+v %v", r, err)
	}
	for name, edit := range map[string]func(nats.Header){
		"empty group":           func(h nats.Header) { h.Set(changelog.HeaderGroup, "") },
		"no bucket":             func(h nats.Header) { h.Del(changelog.HeaderBucket) },
		"bucket not a num":      func(h nats.Header) { h.Set(changelog.HeaderBucket, "2026-01-01T00:00:00Z") },
		"no value":              func(h nats.Header) { h.Del(changelog.HeaderValue) },
		"value negative":        func(h nats.Header) { h.Set(changelog.HeaderValue, "-1") },
		"value not a num":       func(h nats.Header) { h.Set(changelog.HeaderValue, "1e3") },
		"no id":                 func(h nats.Header) { h.Del(jetstream.MsgIDHeader) },
		"no first-seen":         func(h nats.Header) { h.Del(changelog.HeaderFirstSeen) },
		"no fingerprint":        func(h nats.Header) { h.Del(changelog.HeaderFingerprint) },
		"first-seen not a num":  func(h nats.Header) { h.Set(changelog.HeaderFirstSeen, "soon") },
		"first-seen zero":       func(h nats.Header) { h.Set(changelog.HeaderFirstSeen, "0") },
		"fingerprint short":     func(h nats.Header) { h.Set(changelog.HeaderFingerprint, "ab") },
		"fingerprint not hex":   func(h nats.Header) { h.Set(changelog.HeaderFingerprint, "000000000000000g") },
		"fingerprint too large": func(h nats.Header) { h.Set(changelog.HeaderFingerprint, "10000000000000000") },
	} {
		t.Run(name, func(t *testing.T) {
			bad := nats.Header{}
			for k, v := range h {
				bad[k] = append([]string(nil), v...)
			}
			edit(bad)
			_, err := changelog.DecodeHeader(bad)
			if !errors.Is(err, changelog.ErrNotARecord) || !retry.IsPermanent(err) {
				t.Errorf("DecodeHeader: %v, want a permanent ErrNotARecord", err)
			}
		})
	}
}

// TestDecodeForward reads the record of a forward that carries its
// first-seen time alone (AnnotateFirstSeen): its fingerprint is its
// body's. One that carries a fingerprint is read as DecodeHeader reads
// it, a malformed one refused, and one without a first-seen time is not a
// record.
func TestDecodeForward(t *testing.T) {
	first := time.Unix(1_767_000_000, 123_456_789)
	body := []byte(`{"id":"k1"}`)
	h := nats.Header{jetstream.MsgIDHeader: {"k1"}}
	changelog.AnnotateFirstSeen(h, first)
	if got := h.Get(changelog.HeaderFirstSeen); got != "1767000000123456789" {
		t.Errorf("first-seen header %q, want Unix nanoseconds", got)
	}
	if got := h.Values(changelog.HeaderFingerprint); len(got) != 0 {
		t.Errorf("fingerprint header %q, want none", got)
	}
	r, err := changelog.DecodeForward(h, body)
	if err != nil || string(r.Key) != "k1" || !r.FirstSeen.Equal(first) || r.Fingerprint != changelog.Fingerprint(body) {
		t.Errorf("DecodeForward = %+v %v, want the body's fingerprint %x", r, err, changelog.Fingerprint(body))
	}
	if _, err := changelog.DecodeHeader(h); !errors.Is(err, changelog.ErrNotARecord) {
		t.Errorf("DecodeHeader without a fingerprint: %v, want ErrNotARecord", err)
	}
	carried := nats.Header{jetstream.MsgIDHeader: {"k1"}}
	changelog.Annotate(carried, first, 0xab)
	if r, err := changelog.DecodeForward(carried, body); err != nil || r.Fingerprint != 0xab {
		t.Errorf("DecodeForward with a fingerprint = %+v %v, want the header's", r, err)
	}
	for name, edit := range map[string]func(nats.Header){
		"no first-seen":     func(h nats.Header) { h.Del(changelog.HeaderFirstSeen) },
		"fingerprint empty": func(h nats.Header) { h.Set(changelog.HeaderFingerprint, "") },
		"fingerprint short": func(h nats.Header) { h.Set(changelog.HeaderFingerprint, "ab") },
		"no id":             func(h nats.Header) { h.Del(jetstream.MsgIDHeader) },
	} {
		t.Run(name, func(t *testing.T) {
			bad := nats.Header{}
			for k, v := range h {
				bad[k] = append([]string(nil), v...)
			}
			edit(bad)
			if _, err := changelog.DecodeForward(bad, body); !errors.Is(err, changelog.ErrNotARecord) || !retry.IsPermanent(err) {
				t.Errorf("DecodeForward: %v, want a permanent ErrNotARecord", err)
			}
		})
	}
}

// TestDecodeVersioned reads a versioned forward's key and version from
// HeaderKey and HeaderVersion, also when it is the first forward after a
// forget; headers of those names on a forward whose id is not their
// VersionedID (a message's own) leave the id the key.
func TestDecodeVersioned(t *testing.T) {
	first := time.Unix(1_767_000_000, 5)
	forgotten := first.Add(-time.Second)
	for _, tc := range []struct {
		name, id, key, version string
		forgotten              bool
		wantKey                string
		wantVersion            uint64
		wantHas                bool
	}{
		{name: "versioned", id: changelog.VersionedID("order-1", 7), key: "order-1", version: "7", wantKey: "order-1", wantVersion: 7, wantHas: true},
		{name: "key with :v", id: changelog.VersionedID("a:v1", 18446744073709551615), key: "a:v1", version: "18446744073709551615",
			wantKey: "a:v1", wantVersion: 18446744073709551615, wantHas: true},
		{name: "after a forget", id: changelog.ForwardID(changelog.VersionedID("order-1", 3), forgotten), key: "order-1", version: "3",
			forgotten: true, wantKey: "order-1", wantVersion: 3, wantHas: true},
		{name: "not its id", id: "order-1", key: "order-1", version: "7", wantKey: "order-1"},
		{name: "version not a number", id: "order-1:vx", key: "order-1", version: "x", wantKey: "order-1:vx"},
		{name: "no version header", id: "order-1:v7", key: "order-1", wantKey: "order-1:v7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := nats.Header{jetstream.MsgIDHeader: {tc.id}}
			changelog.Annotate(h, first, 1)
			h.Set(changelog.HeaderKey, tc.key)
			if tc.version != "" {
				h.Set(changelog.HeaderVersion, tc.version)
			}
			if tc.forgotten {
				changelog.AnnotateForgotten(h, forgotten)
			}
			r, err := changelog.DecodeHeader(h)
			if err != nil || string(r.Key) != tc.wantKey || r.Version != tc.wantVersion || r.HasVersion != tc.wantHas {
				t.Errorf("DecodeHeader = key %q version %d (%v), %v; want %q %d (%v)", r.Key, r.Version, r.HasVersion, err, tc.wantKey, tc.wantVersion, tc.wantHas)
			}
		})
	}
}

func FuzzDecodeHeader(f *testing.F) {
	f.Add("k", int64(1), uint64(0))
	f.Add("key with spaces", int64(1_767_000_000_123_456_789), ^uint64(0))
	f.Fuzz(func(t *testing.T, key string, ns int64, fp uint64) {
		if len(key) > 1024 || ns <= 0 {
			return
		}
		h := nats.Header{}
		h.Set(jetstream.MsgIDHeader, key)
		changelog.Annotate(h, time.Unix(0, ns), fp)
		r, err := changelog.DecodeHeader(h)
		if key == "" {
			if err == nil {
				t.Fatal("decoded a record without a key")
			}
			return
		}
		if err != nil || string(r.Key) != key || r.FirstSeen.UnixNano() != ns || r.Fingerprint != fp {
			t.Fatalf("round trip of %q %d %x: %+v %v", key, ns, fp, r, err)
		}
	})
}

// TestTakeFencesTheOldOwner takes a fence on an empty stream, then again as
// another instance: each take returns the sequence of its fence message,
// and the first owner's fenced publishes are refused after the second
// take while the second owner's are stored.
func TestTakeFencesTheOldOwner(t *testing.T) {
	js := outStream(t)
	ctx := context.Background()
	fence := changelog.FenceSubject(prefix, 2)
	fa, err := changelog.Take(ctx, js, "OUT", fence, "A")
	if err != nil {
		t.Fatal(err)
	}
	publishRecords(t, js, 2, 0, 3)
	fb, err := changelog.Take(ctx, js, "OUT", fence, "B")
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "OUT")
	if err != nil {
		t.Fatal(err)
	}
	for who, seq := range map[string]uint64{"A": fa, "B": fb} {
		m, err := st.GetMsg(ctx, seq)
		if err != nil || m.Subject != fence {
			t.Fatalf("%s's fence sequence %d: %v, subject %q", who, seq, err, m.Subject)
		}
		if got := fenceOwner(t, m.Data); got != who {
			t.Errorf("%s's fence message names %q", who, got)
		}
	}
	if fa != 1 || fb != 5 {
		t.Errorf("fences at %d and %d, want 1 (empty stream) and 5 (after 3 records)", fa, fb)
	}
	msg := func(id string) []*nats.Msg {
		return []*nats.Msg{{Subject: changelog.PartitionSubject(prefix, 2, "e"), Header: nats.Header{jetstream.MsgIDHeader: {id}}}}
	}
	err = forward.Batch(ctx, js, msg("z"), make([]forward.Result, 1), forward.Options{Atomic: true, Fence: &forward.Fence{Subject: fence, Seq: fa}})
	if !retry.IsFenced(err) {
		t.Errorf("A's publish after B's take: %v, want fenced", err)
	}
	if err := forward.Batch(ctx, js, msg("y"), make([]forward.Result, 1), forward.Options{Atomic: true, Fence: &forward.Fence{Subject: fence, Seq: fb}}); err != nil {
		t.Errorf("B's publish: %v", err)
	}
}

// fenceOwner returns the instance a fence message's body names.
func fenceOwner(t *testing.T, body []byte) string {
	t.Helper()
	var b struct{ Instance string }
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatalf("fence body %q: %v", body, err)
	}
	return b.Instance
}

// TestTakeRaces has several instances take one fence at once: each take
// succeeds (a take refused because another moved the fence reads again),
// each fence message expected the one before it, so the subject holds
// exactly one message per take and the takes' sequences are all distinct.
func TestTakeRaces(t *testing.T) {
	js := outStream(t)
	ctx := context.Background()
	fence := changelog.FenceSubject(prefix, 0)
	const takers = 4
	seqs := make([]uint64, takers)
	errs := make([]error, takers)
	var wg sync.WaitGroup
	for i := range takers {
		wg.Go(func() { seqs[i], errs[i] = changelog.Take(ctx, js, "OUT", fence, fmt.Sprint("i", i)) })
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("take %d: %v", i, err)
		}
		if seen[seqs[i]] {
			t.Errorf("two takes got sequence %d", seqs[i])
		}
		seen[seqs[i]] = true
	}
	fences := 0
	for _, m := range natstest.ReadAll(t, js, "OUT") {
		if m.Subject == fence {
			fences++
			if !seen[m.Seq] {
				t.Errorf("fence message at %d belongs to no take", m.Seq)
			}
		}
	}
	if fences != takers {
		t.Errorf("%d fence messages, want %d", fences, takers)
	}
}

// TestRestore reads partitions back: only the partition's records, none of
// its fence messages nor another partition's, in order, up to the fence;
// from a cursor; from a time; nothing from an empty partition or one whose
// records are all past the fence; and a message without a record is a
// permanent error.
func TestRestore(t *testing.T) {
	js := outStream(t)
	ctx := context.Background()
	p1 := publishRecords(t, js, 1, 0, 10)
	p2 := publishRecords(t, js, 2, 0, 5)
	f1, err := changelog.Take(ctx, js, "OUT", changelog.FenceSubject(prefix, 1), "A")
	if err != nil {
		t.Fatal(err)
	}
	p1 = append(p1, publishRecords(t, js, 1, 10, 5)...)
	f1b, err := changelog.Take(ctx, js, "OUT", changelog.FenceSubject(prefix, 1), "B")
	if err != nil {
		t.Fatal(err)
	}
	publishRecords(t, js, 1, 15, 3) // after B's fence: B's own forwards, not part of the restore

	sameRecords(t, "p1 up to A's fence", restore(t, js, 1, 0, time.Time{}, f1), p1[:10])
	sameRecords(t, "p1 up to B's fence", restore(t, js, 1, 0, time.Time{}, f1b), p1)
	sameRecords(t, "p2, every record below the fence", restore(t, js, 2, 0, time.Time{}, f1b), p2)
	sameRecords(t, "p1 from a cursor", restore(t, js, 1, p1[6].seq+1, time.Time{}, f1b), p1[7:])
	sameRecords(t, "p1 up to a record's own sequence", restore(t, js, 1, 0, time.Time{}, p1[3].seq), p1[:4])

	st, err := js.Stream(ctx, "OUT")
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetMsg(ctx, p1[8].seq)
	if err != nil {
		t.Fatal(err)
	}
	sameRecords(t, "p1 since the time of its 9th record", restore(t, js, 1, 0, m.Time, f1b), p1[8:])

	if got := restore(t, js, 3, 0, time.Time{}, f1b); len(got) != 0 {
		t.Errorf("empty partition 3: %d records", len(got))
	}
	if got := restore(t, js, 1, f1b+1, time.Time{}, f1b); len(got) != 0 {
		t.Errorf("from past the fence: %d records", len(got))
	}
	p4 := publishRecords(t, js, 4, 0, 2)
	if got := restore(t, js, 4, 0, time.Time{}, p4[0].seq-1); len(got) != 0 {
		t.Errorf("partition 4, all past the fence: %d records", len(got))
	}

	if _, err := js.Publish(ctx, changelog.PartitionSubject(prefix, 5, "e"), []byte("no record")); err != nil {
		t.Fatal(err)
	}
	_, err = changelog.Restore(ctx, js, "OUT", changelog.PartitionFilter(prefix, 5), changelog.FenceSubject(prefix, 5), changelog.KeyStateSubject(prefix, 5), 0, time.Time{}, 1<<40,
		func(changelog.Record, uint64) error { return nil })
	if !errors.Is(err, changelog.ErrNotARecord) || !retry.IsPermanent(err) {
		t.Errorf("restore of a message without a record: %v, want a permanent ErrNotARecord", err)
	}
	stop := errors.New("stop")
	rs, err := changelog.Restore(ctx, js, "OUT", changelog.PartitionFilter(prefix, 1), changelog.FenceSubject(prefix, 1), changelog.KeyStateSubject(prefix, 1), 0, time.Time{}, f1b,
		func(changelog.Record, uint64) error { return stop })
	if !errors.Is(err, stop) || rs.Records != 0 {
		t.Errorf("restore whose fn fails: %d, %v; want 0 and fn's error", rs.Records, err)
	}
}

// TestRestoreReadsUpToTheFence: Restore ends at the fence, not when its
// reader has nothing more to deliver. The reader runs on any replica of
// the output stream, and one that is catching up has not applied every
// record stored before the fence yet; here the records after the first
// three are stored only once Restore has read the first one, as such a
// replica would deliver them. A Restore that ended when the records
// pending at its start were read returned 3 of 6 records and let the new
// owner forward the other keys again.
func TestRestoreReadsUpToTheFence(t *testing.T) {
	js := outStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const p = 6
	want := publishRecords(t, js, p, 0, 3)
	fenceSeq := want[len(want)-1].seq + 4 // three more records, then the fence
	r := startHalted(ctx, js, p, fenceSeq, 1)
	<-r.halted
	want = append(want, moreThenFence(t, ctx, js, p, fenceSeq)...)
	close(r.resume)
	<-r.done
	if r.err != nil {
		t.Fatal(r.err)
	}
	sameRecords(t, "records stored after the restore began, before its fence", r.got, want)
}

// haltedRestore is a Restore running in the background that halts once.
type haltedRestore struct {
	halted chan struct{} // closed once it halts
	resume chan struct{} // close to let it go on
	done   chan struct{} // closed when Restore returned
	got    []record      // the records passed to fn
	st     changelog.RestoreStats
	err    error
}

// startHalted starts a Restore of partition p from its first record up to
// fenceSeq, which halts in fn once it has the at-th record.
func startHalted(ctx context.Context, js jetstream.JetStream, p int, fenceSeq uint64, at int) *haltedRestore {
	h := &haltedRestore{halted: make(chan struct{}), resume: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		h.st, h.err = changelog.Restore(ctx, js, "OUT", changelog.PartitionFilter(prefix, p), changelog.FenceSubject(prefix, p), changelog.KeyStateSubject(prefix, p), 0, time.Time{}, fenceSeq,
			func(r changelog.Record, seq uint64) error {
				h.got = append(h.got, asRecord(r, seq))
				if len(h.got) == at {
					close(h.halted)
					<-h.resume
				}
				return nil
			})
	}()
	return h
}

// moreThenFence publishes three more records of partition p (keys from 3
// on) and takes p's fence, which must land at fenceSeq; it returns the
// records.
func moreThenFence(t *testing.T, ctx context.Context, js jetstream.JetStream, p int, fenceSeq uint64) []record {
	t.Helper()
	more := publishRecords(t, js, p, 3, 3)
	f, err := changelog.Take(ctx, js, "OUT", changelog.FenceSubject(prefix, p), "B")
	if err != nil {
		t.Fatal(err)
	}
	if f != fenceSeq {
		t.Fatalf("fence at sequence %d, want %d (nothing else writes the stream)", f, fenceSeq)
	}
	return more
}

// asRecord is r, read back at sequence seq.
func asRecord(r changelog.Record, seq uint64) record {
	return record{key: string(r.Key), firstSeen: r.FirstSeen, fp: r.Fingerprint, group: r.Group, bucket: r.Bucket, value: r.Value, seq: seq}
}

// TestRestoreReopensASilentReader: a reader that stays subscribed but
// delivers nothing (here its consumer is paused; in a cluster, a reader
// whose pull the server dropped while its heartbeats still flow) does not
// hold the takeover until Restore gives up: after restoreReopen of silence
// Restore opens a new reader from the message after the last it read, and
// reads every record up to the fence once.
func TestRestoreReopensASilentReader(t *testing.T) {
	defer changelog.SetRestoreTimings(200*time.Millisecond, time.Second, time.Hour)()
	js := outStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const p = 7
	want := publishRecords(t, js, p, 0, 3)
	fenceSeq := want[len(want)-1].seq + 4 // three more records, then the fence
	r := startHalted(ctx, js, p, fenceSeq, 3)
	<-r.halted
	// Silence the reader: pause its consumer, the only one on the stream.
	out, err := js.Stream(ctx, "OUT")
	if err != nil {
		t.Fatal(err)
	}
	names := out.ConsumerNames(ctx)
	var readers []string
	for n := range names.Name() {
		readers = append(readers, n)
	}
	if err := names.Err(); err != nil || len(readers) != 1 {
		t.Fatalf("consumers of OUT: %v, %v; want Restore's reader alone", readers, err)
	}
	if _, err := js.PauseConsumer(ctx, "OUT", readers[0], time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	want = append(want, moreThenFence(t, ctx, js, p, fenceSeq)...)
	close(r.resume)
	select {
	case <-r.done:
	case <-ctx.Done():
		t.Fatal("Restore still waits on its paused reader")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	sameRecords(t, "records before and after the silent spell", r.got, want)
	if r.st.Reopens < 1 || r.st.Records != len(want) {
		t.Errorf("Restore stats %+v, want at least 1 reopen and %d records", r.st, len(want))
	}
}

// TestTakeoverStepsGiveUp: each step of a takeover that talks to the
// cluster (reading the output stream, taking a fence, refreshing it,
// opening a restore's reader by sequence and by time) ends with its last
// failure once StepBound has passed, instead of retrying until the
// caller's context ends. Here every JetStream request goes unanswered, as
// after a takeover raced the stream's leader away. A takeover stuck so
// held its worker, and the worker's held messages were kept alive (in
// progress) with no owner to judge them.
func TestTakeoverStepsGiveUp(t *testing.T) {
	defer changelog.SetStepBound(time.Second)()
	s := natstest.RunServer(t, "")
	nc, _ := natstest.Connect(t, s.ClientURL())
	nowhere, err := jetstream.NewWithAPIPrefix(nc, "$NOWHERE.API")
	if err != nil {
		t.Fatal(err)
	}
	fence := changelog.FenceSubject(prefix, 1)
	restore := func(from uint64, since time.Time) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := changelog.Restore(ctx, nowhere, "OUT", changelog.PartitionFilter(prefix, 1), fence, changelog.KeyStateSubject(prefix, 1), from, since, 10,
				func(changelog.Record, uint64) error { return nil })
			return err
		}
	}
	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{"read the output stream", func(ctx context.Context) error {
			_, err := changelog.StreamState(ctx, nowhere, "OUT")
			return err
		}},
		{"take the fence", func(ctx context.Context) error {
			_, err := changelog.Take(ctx, nowhere, "OUT", fence, "i0")
			return err
		}},
		{"refresh the fence", func(ctx context.Context) error {
			_, err := changelog.Refresh(ctx, nowhere, "OUT", fence, "i0", 7)
			return err
		}},
		{"open a restore's reader by sequence", restore(1, time.Time{})},
		{"open a restore's reader by time", restore(0, time.Now().Add(-time.Hour))},
	}
	for _, st := range steps {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		start := time.Now()
		err := st.run(ctx)
		ended := ctx.Err()
		cancel()
		if ended != nil {
			t.Errorf("%s: retried until its context ended (%v)", st.name, err)
			continue
		}
		if err == nil || !errors.Is(err, context.DeadlineExceeded) || retry.IsPermanent(err) || retry.IsFenced(err) {
			t.Errorf("%s: %v, want a transient error after the step bound", st.name, err)
		}
		t.Logf("%s: gave up after %v: %v", st.name, time.Since(start).Round(time.Millisecond), err)
	}
}

// TestRestoreLeavesNoConsumer restores a partition 50 times, as a warm
// standby's tail does every couple of seconds under load: the output
// stream is left with no consumer. A reader's ordered consumer, once
// stopped, used to linger for nats.go's default of 5 minutes, so that
// readers filled the stream's consumers up to the server's limit (1,000
// a stream by default since nats-server 2.15) and a takeover could then
// open no restore at all.
func TestRestoreLeavesNoConsumer(t *testing.T) {
	js := outStream(t)
	ctx := context.Background()
	publishRecords(t, js, 1, 0, 10)
	f, err := changelog.Take(ctx, js, "OUT", changelog.FenceSubject(prefix, 1), "A")
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if got := restore(t, js, 1, 0, time.Time{}, f); len(got) != 10 {
			t.Fatalf("restore: %d records, want 10", len(got))
		}
	}
	st, err := js.Stream(ctx, "OUT")
	if err != nil {
		t.Fatal(err)
	}
	natstest.Poll(t, 10*time.Second, 100*time.Millisecond, "the restores' consumers to be gone", func() (bool, error) {
		info, err := st.Info(ctx)
		if err != nil {
			return false, err
		}
		return info.State.Consumers == 0, fmt.Errorf("%d consumers on the output stream after 50 restores", info.State.Consumers)
	})
}
