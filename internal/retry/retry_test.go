package retry_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/dedupe-stage/dedupe-stage/internal/retry"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// runServer starts a JetStream server with the given max_payload (0: the
// default) and returns a JetStream context on it.
func runServer(t *testing.T, maxPayload int32) (*server.Server, jetstream.JetStream) {
	t.Helper()
	s := natstest.RunServerWith(t, func(o *server.Options) { o.MaxPayload = maxPayload })
	_, js := natstest.Connect(t, s.ClientURL())
	return s, js
}

// TestClassifyRealServerErrors checks every row of the classification
// table in docs/failures.md that a NATS server produces: the error a real
// server (and client) gives for each case, synchronous and asynchronous,
// is classified as the table says.
func TestClassifyRealServerErrors(t *testing.T) {
	_, js := runServer(t, 8192)
	ctx := context.Background()
	streams := []jetstream.StreamConfig{
		{Name: "SMALL", Subjects: []string{"small.>"}, MaxMsgSize: 100},
		{Name: "SEALED", Subjects: []string{"sealed.>"}},
		{Name: "FULL", Subjects: []string{"full.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew},
		{Name: "FULLBYTES", Subjects: []string{"fullbytes.>"}, MaxBytes: 400, Discard: jetstream.DiscardNew},
		{Name: "PLAIN", Subjects: []string{"plain.>"}},
	}
	for _, sc := range streams {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "full.a", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	sealed, err := js.Stream(ctx, "SEALED")
	if err != nil {
		t.Fatal(err)
	}
	sc := sealed.CachedInfo().Config
	sc.Sealed = true
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		msg  *nats.Msg
		want retry.Class
		code jetstream.ErrorCode // the API error code expected, 0 for none
		is   error               // a sentinel the error is expected to match
	}{
		{"larger than the stream's max_msg_size", &nats.Msg{Subject: "small.a", Data: make([]byte, 200)}, retry.Permanent, retry.CodeMessageTooLarge, nil},
		{"stream sealed", &nats.Msg{Subject: "sealed.a", Data: []byte("x")}, retry.Permanent, retry.CodeStreamSealed, nil},
		{"per-message TTL the stream does not allow", &nats.Msg{Subject: "plain.a", Header: nats.Header{"Nats-TTL": {"1s"}}, Data: []byte("x")}, retry.Permanent, 0, nil},
		{"larger than the server's max_payload", &nats.Msg{Subject: "plain.a", Data: make([]byte, 9000)}, retry.Permanent, 0, nats.ErrMaxPayload},
		{"headers larger than the server's max_payload", &nats.Msg{Subject: "plain.a", Header: nats.Header{"X": {strings.Repeat("h", 9000)}}}, retry.Permanent, 0, nats.ErrMaxPayload},
		{"stream at max_msgs, discard new", &nats.Msg{Subject: "full.a", Data: []byte("x")}, retry.Transient, retry.CodeStoreFailed, nil},
		{"stream at max_bytes, discard new", &nats.Msg{Subject: "fullbytes.a", Data: make([]byte, 500)}, retry.Transient, retry.CodeStoreFailed, nil},
		{"a stream other than the one expected (Nats-Expected-Stream)", &nats.Msg{Subject: "plain.a", Header: nats.Header{jetstream.ExpectedStreamHeader: {"OTHER"}}, Data: []byte("x")}, retry.Permanent, retry.CodeStreamNotMatch, nil},
		{"no stream (deleted, or its leader moving)", &nats.Msg{Subject: "nostream.a", Data: []byte("x")}, retry.Transient, 0, jetstream.ErrNoStreamResponse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check := func(how string, err error) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s: publish succeeded", how)
				}
				if got := retry.Classify(err); got != tc.want {
					t.Errorf("%s: Classify(%v) = %v, want %v", how, err, got, tc.want)
				}
				var api *jetstream.APIError
				if tc.code != 0 && (!errors.As(err, &api) || api.ErrorCode != tc.code) {
					t.Errorf("%s: %v is not API error code %d", how, err, tc.code)
				}
				if tc.is != nil && !errors.Is(err, tc.is) {
					t.Errorf("%s: %v is not %v", how, err, tc.is)
				}
			}
			_, err := js.PublishMsg(ctx, tc.msg)
			check("sync", err)
			f, err := js.PublishMsgAsync(tc.msg)
			if err == nil {
				select {
				case <-f.Ok():
				case err = <-f.Err():
				case <-time.After(10 * time.Second):
					t.Fatal("async: no answer in 10s")
				}
			}
			check("async", err)
		})
	}
}

// TestClassifyHeaderLimit checks that JetStream's 64 KiB header limit is
// refused with its own code, classified permanent, and that MaxHeaderBytes
// is the largest header block it stores.
func TestClassifyHeaderLimit(t *testing.T) {
	_, js := runServer(t, 1<<20)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	// "NATS/1.0\r\n" + "X: " + v + "\r\n" + "\r\n" is len(v) + 17 bytes.
	fits := &nats.Msg{Subject: "s.a", Header: nats.Header{"X": {strings.Repeat("h", retry.MaxHeaderBytes-17)}}}
	if _, err := js.PublishMsg(ctx, fits); err != nil {
		t.Fatalf("headers of exactly MaxHeaderBytes: %v", err)
	}
	over := &nats.Msg{Subject: "s.a", Header: nats.Header{"X": {strings.Repeat("h", retry.MaxHeaderBytes-16)}}}
	_, err := js.PublishMsg(ctx, over)
	var api *jetstream.APIError
	if !errors.As(err, &api) || api.ErrorCode != retry.CodeHeaderTooLarge {
		t.Fatalf("headers of MaxHeaderBytes+1: %v, want API error %d", err, retry.CodeHeaderTooLarge)
	}
	if retry.Classify(err) != retry.Permanent {
		t.Errorf("Classify(%v) = %v, want permanent", err, retry.Classify(err))
	}
}

// TestClassifyOther checks the rows that do not need a server's answer.
func TestClassifyOther(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want retry.Class
	}{
		{nil, retry.None},
		{nats.ErrTimeout, retry.Transient},
		{nats.ErrNoResponders, retry.Transient},
		{jetstream.ErrNoStreamResponse, retry.Transient},
		{jetstream.ErrAsyncPublishTimeout, retry.Transient},
		{jetstream.ErrTooManyStalledMsgs, retry.Transient},
		{nats.ErrConnectionClosed, retry.Transient},
		{nats.ErrDisconnected, retry.Transient},
		{context.DeadlineExceeded, retry.Transient},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, retry.Transient},
		{&jetstream.APIError{Code: 503, ErrorCode: 10023, Description: "insufficient resources"}, retry.Transient},
		{&jetstream.APIError{Code: 500, ErrorCode: 10047, Description: "insufficient storage resources available"}, retry.Transient},
		{&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}, retry.Transient},
		{fmt.Errorf("claim: %w", state.ErrDiskFull), retry.Transient},
		{errors.New("write /data/p000/000001.vlog: no space left on device"), retry.Transient},
		{nats.ErrBadSubject, retry.Permanent},
		{nats.ErrHeadersNotSupported, retry.Permanent},
		{&jetstream.APIError{Code: 400, ErrorCode: 10097, Description: "header size exceeds maximum allowed of 64k"}, retry.Permanent},
		{fmt.Errorf("lookup: %w", state.ErrCorruptRecord), retry.Permanent},
		{fmt.Errorf("claim: %w", state.ErrBadKey), retry.Permanent},
		{fmt.Errorf("claim: %w", state.ErrBadTotal), retry.Permanent},
		{fmt.Errorf("restore: %w", state.ErrBadRestore), retry.Permanent},
		{state.ErrClosed, retry.Permanent},
		{retry.MarkPermanent(errors.New("anything")), retry.Permanent},
	} {
		if got := retry.Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// ownError is an error of some package that says itself whether it is
// permanent (retry.PermanentError), for tests only.
type ownError struct{ permanent bool }

func (e *ownError) Error() string   { return fmt.Sprintf("own error (permanent %v)", e.permanent) }
func (e *ownError) Permanent() bool { return e.permanent }

// TestClassifyPermanentError checks that an error anywhere in a chain that
// answers Permanent true is permanent, that one answering false is left to
// the other rules, and that the state package's permanent sentinels say so
// themselves: Classify knows nothing of state.
func TestClassifyPermanentError(t *testing.T) {
	var _ retry.PermanentError = (*ownError)(nil)
	for _, tc := range []struct {
		name string
		err  error
		want retry.Class
	}{
		{"permanent", &ownError{permanent: true}, retry.Permanent},
		{"permanent, wrapped twice", fmt.Errorf("commit: %w", fmt.Errorf("partition 3: %w", &ownError{permanent: true})), retry.Permanent},
		{"permanent, joined", errors.Join(errors.New("first"), &ownError{permanent: true}), retry.Permanent},
		{"not permanent", fmt.Errorf("commit: %w", &ownError{permanent: false}), retry.Transient},
		{"marked", fmt.Errorf("decode: %w", retry.MarkPermanent(errors.New("bad"))), retry.Permanent},
	} {
		if got := retry.Classify(tc.err); got != tc.want {
			t.Errorf("%s: Classify(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}

	for _, sentinel := range []error{state.ErrBadKey, state.ErrBadTotal, state.ErrBadRestore, state.ErrCorruptRecord, state.ErrClosed} {
		for _, err := range []error{sentinel, fmt.Errorf("partition 2: %w", sentinel), fmt.Errorf("claim: %w: %w", sentinel, errors.New("detail"))} {
			if !errors.Is(err, sentinel) {
				t.Errorf("errors.Is(%v, %v) = false", err, sentinel)
			}
			if got := retry.Classify(err); got != retry.Permanent {
				t.Errorf("Classify(%v) = %v, want permanent", err, got)
			}
			var pe retry.PermanentError
			if !errors.As(err, &pe) || !pe.Permanent() {
				t.Errorf("%v does not answer Permanent true", err)
			}
		}
		for _, other := range []error{state.ErrBadKey, state.ErrBadTotal, state.ErrBadRestore, state.ErrCorruptRecord, state.ErrClosed, state.ErrDiskFull} {
			if other != sentinel && errors.Is(sentinel, other) {
				t.Errorf("errors.Is(%v, %v) = true", sentinel, other)
			}
		}
	}
}

// reporter records what Do reports, for tests only.
type reporter struct {
	mu        sync.Mutex
	failed    int
	succeeded []bool
}

func (r *reporter) Failed(string, error) { r.mu.Lock(); r.failed++; r.mu.Unlock() }
func (r *reporter) Succeeded(_ string, retried bool) {
	r.mu.Lock()
	r.succeeded = append(r.succeeded, retried)
	r.mu.Unlock()
}

func TestDo(t *testing.T) {
	ctx := context.Background()
	t.Run("transient then success", func(t *testing.T) {
		var r reporter
		n, pauses := 0, 0
		err := retry.Do(ctx, "op", func() error {
			if n++; n < 3 {
				return nats.ErrTimeout
			}
			return nil
		}, retry.Options{Reporter: &r, Pause: func() { pauses++ }})
		if err != nil || n != 3 || r.failed != 2 || len(r.succeeded) != 1 || !r.succeeded[0] || pauses != 4 {
			t.Errorf("err %v, %d calls, %d failures reported, successes %v, %d pauses; want nil, 3, 2, [true], 4", err, n, r.failed, r.succeeded, pauses)
		}
	})
	t.Run("permanent is returned at once", func(t *testing.T) {
		var r reporter
		n := 0
		perm := &jetstream.APIError{Code: 400, ErrorCode: retry.CodeStreamSealed}
		err := retry.Do(ctx, "op", func() error { n++; return perm }, retry.Options{Reporter: &r})
		if !errors.Is(err, perm) || n != 1 || r.failed != 0 {
			t.Errorf("err %v after %d calls, %d failures reported; want the permanent error after 1 call, none reported", err, n, r.failed)
		}
		if !retry.IsPermanent(err) {
			t.Errorf("IsPermanent(%v) = false", err)
		}
	})
	t.Run("ctx ends the retries", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		err := retry.Do(ctx, "op", func() error { return nats.ErrTimeout }, retry.Options{})
		if !errors.Is(err, context.DeadlineExceeded) || retry.IsPermanent(err) {
			t.Errorf("err %v, want one wrapping context.DeadlineExceeded and not permanent", err)
		}
		if !strings.Contains(err.Error(), nats.ErrTimeout.Error()) {
			t.Errorf("err %q does not name the last failure", err)
		}
	})
}

// TestClassifyBatch checks the classes of the atomic-batch refusals the
// forward fallback depends on (internal/forward tests them against a real
// server).
func TestClassifyBatch(t *testing.T) {
	api := func(code jetstream.ErrorCode, status int) error {
		return &jetstream.APIError{Code: status, ErrorCode: code}
	}
	cases := []struct {
		name string
		err  error
		want retry.Class
	}{
		{"duplicate id", api(retry.CodeBatchDuplicateMsgID, 400), retry.Permanent},
		{"too large", api(retry.CodeBatchTooLarge, 400), retry.Permanent},
		{"disabled", api(retry.CodeBatchDisabled, 400), retry.Permanent},
		{"incomplete", api(retry.CodeBatchIncomplete, 400), retry.Permanent},
		{"too many in flight", api(retry.CodeBatchTooManyInflight, 429), retry.Transient},
		{"fence moved", api(retry.CodeWrongLastSequence, 400), retry.Fenced},
		{"another fenced proposal in flight", api(retry.CodeWrongLastSequenceConstant, 400), retry.Transient},
		{"timeout", nats.ErrTimeout, retry.Transient},
		{"store failed", api(retry.CodeStoreFailed, 503), retry.Transient},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := retry.ClassifyBatch(c.err); got != c.want {
				t.Errorf("ClassifyBatch = %v, want %v", got, c.want)
			}
		})
	}
}

// TestClassifyFenceRefusals produces the two refusals of a publish that
// expects a fence subject's last sequence on a real server and checks
// their classes: 10071 (the fence moved) is Fenced, never retried by Do
// and neither transient nor permanent, for a plain publish and an atomic
// batch; 10164 (a batch that writes the fence and then checks it, the
// refusal a second fenced proposal in flight gets on a cluster) is
// Transient.
func TestClassifyFenceRefusals(t *testing.T) {
	_, js := runServer(t, 0)
	ctx := context.Background()
	cfg := jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, AllowAtomicPublish: true}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	const fence = "out._fence.0"
	first, err := js.Publish(ctx, fence, []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, fence, []byte("b")); err != nil { // another owner moves the fence
		t.Fatal(err)
	}
	expect := func(seq uint64) nats.Header {
		return nats.Header{
			jetstream.ExpectedLastSubjSeqHeader:     {fmt.Sprint(seq)},
			jetstream.ExpectedLastSubjSeqSubjHeader: {fence},
		}
	}
	code := func(err error) jetstream.ErrorCode {
		var api *jetstream.APIError
		if errors.As(err, &api) {
			return api.ErrorCode
		}
		return 0
	}

	t.Run("plain publish after the fence moved", func(t *testing.T) {
		_, err := js.PublishMsg(ctx, &nats.Msg{Subject: "out.0.x", Header: expect(first.Sequence), Data: []byte("x")})
		if code(err) != retry.CodeWrongLastSequence {
			t.Fatalf("publish: %v, want API error %d", err, retry.CodeWrongLastSequence)
		}
		if got := retry.Classify(err); got != retry.Fenced || !retry.IsFenced(err) || retry.IsPermanent(err) {
			t.Errorf("Classify(%v) = %v, IsFenced %v, IsPermanent %v; want fenced, true, false", err, got, retry.IsFenced(err), retry.IsPermanent(err))
		}
		var r reporter
		calls := 0
		derr := retry.Do(ctx, "publish", func() error { calls++; return err }, retry.Options{Reporter: &r})
		if calls != 1 || !retry.IsFenced(derr) || r.failed != 0 {
			t.Errorf("Do: %d calls, err %v, %d failures reported; want 1 call, the fenced error, none reported", calls, derr, r.failed)
		}
	})
	t.Run("atomic batch after the fence moved", func(t *testing.T) {
		msgs := []*nats.Msg{
			{Subject: "out.0.x", Header: expect(first.Sequence), Data: []byte("x")},
			{Subject: "out.0.y", Header: nats.Header{}, Data: []byte("y")},
		}
		_, err := jetstreamext.PublishMsgBatch(ctx, js, msgs)
		if code(err) != retry.CodeWrongLastSequence {
			t.Fatalf("batch: %v, want API error %d", err, retry.CodeWrongLastSequence)
		}
		if got := retry.ClassifyBatch(err); got != retry.Fenced {
			t.Errorf("ClassifyBatch(%v) = %v, want fenced", err, got)
		}
	})
	t.Run("atomic batch that writes the fence and then checks it", func(t *testing.T) {
		info, err := js.Stream(ctx, "OUT")
		if err != nil {
			t.Fatal(err)
		}
		last, err := info.GetLastMsgForSubject(ctx, fence)
		if err != nil {
			t.Fatal(err)
		}
		msgs := []*nats.Msg{
			{Subject: fence, Header: nats.Header{}, Data: []byte("c")},
			{Subject: "out.0.z", Header: expect(last.Sequence), Data: []byte("z")},
		}
		_, err = jetstreamext.PublishMsgBatch(ctx, js, msgs)
		if code(err) != retry.CodeWrongLastSequenceConstant {
			t.Fatalf("batch: %v, want API error %d", err, retry.CodeWrongLastSequenceConstant)
		}
		if got, gotBatch := retry.Classify(err), retry.ClassifyBatch(err); got != retry.Transient || gotBatch != retry.Transient {
			t.Errorf("Classify(%v) = %v, ClassifyBatch = %v; want transient, transient", err, got, gotBatch)
		}
	})
	t.Run("a wrapped ErrFenced", func(t *testing.T) {
		err := fmt.Errorf("partition 3: %w", retry.ErrFenced)
		if retry.Classify(err) != retry.Fenced || retry.ClassifyBatch(err) != retry.Fenced {
			t.Errorf("Classify(%v) = %v, ClassifyBatch = %v; want fenced", err, retry.Classify(err), retry.ClassifyBatch(err))
		}
		if retry.Fenced.String() != "fenced" {
			t.Errorf("Fenced.String() = %q", retry.Fenced.String())
		}
	})
}
