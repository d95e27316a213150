package changelog_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/changelog"
	"github.com/dedupe-stage/dedupe-stage/state"
)

// TestCheckAhead gives a partition's store records of forwards at output
// sequences 1..10 while the output holds only the first six (a server that
// lost the last four it acknowledged), then, per case, messages of another
// writer at the lost sequences: CheckAhead drops exactly the records the
// output does not hold and lowers the cursor to the last one it does.
func TestCheckAhead(t *testing.T) {
	for _, tc := range []struct {
		name      string
		foreign   int // messages another writer stores after the loss
		ahead     bool
		kept      uint64
		dropped   int
		rewritten bool
	}{
		{name: "tail lost", foreign: 0, ahead: true, kept: 6, dropped: 4},
		{name: "lost sequences written again", foreign: 2, ahead: true, kept: 6, dropped: 4, rewritten: true},
		{name: "written past the cursor", foreign: 4, ahead: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			js := outStream(t)
			p := openOwner(t, "a").store.Partition(part)
			held := publishRecords(t, js, part, 0, 6)
			var claims []state.Claim
			for _, r := range held {
				claims = append(claims, state.Claim{Key: []byte(r.key), Fingerprint: r.fp, At: r.firstSeen, OutputSeq: r.seq})
			}
			for i := range 4 { // forwards the server acknowledged, then lost
				claims = append(claims, state.Claim{Key: fmt.Appendf(nil, "lost-%d", i), Fingerprint: 1, At: held[5].firstSeen, OutputSeq: uint64(7 + i)})
			}
			if _, err := p.ClaimWithCursor(claims, 10); err != nil {
				t.Fatal(err)
			}
			last := uint64(6)
			for i := range tc.foreign {
				h := nats.Header{jetstream.MsgIDHeader: {fmt.Sprintf("other-%d", i)}}
				ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: prefix + ".other", Header: h, Data: []byte("x")})
				if err != nil {
					t.Fatal(err)
				}
				last = ack.Sequence
			}

			a, ahead, err := changelog.CheckAhead(ctx, js, "OUT", p, last)
			if err != nil {
				t.Fatal(err)
			}
			if ahead != tc.ahead || (ahead && (a.Cursor != 10 || a.LastSeq != last || a.Kept != tc.kept || a.Dropped != tc.dropped || a.Rewritten != tc.rewritten)) {
				t.Fatalf("CheckAhead = %+v, ahead %v; want ahead %v, cursor 10, last %d, kept %d, dropped %d, rewritten %v",
					a, ahead, tc.ahead, last, tc.kept, tc.dropped, tc.rewritten)
			}
			wantCursor, wantLost := uint64(10), true
			if tc.ahead {
				wantCursor, wantLost = tc.kept, false
			}
			if c, err := p.Cursor(); err != nil || c != wantCursor {
				t.Errorf("cursor after = %d, %v; want %d", c, err, wantCursor)
			}
			for _, c := range claims {
				want := wantLost || c.OutputSeq <= 6
				if _, ok, err := p.Held(c.Key); err != nil || ok != want {
					t.Errorf("Held(%s) = %v, %v; want %v", c.Key, ok, err, want)
				}
			}
		})
	}
}
