package stage

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// TestLastSeqOn: the read-back's target is the highest sequence of a
// message on the subjects asked, wildcards included, on a stream that
// allows direct gets; 0 when no message is on them, or the stream is
// empty.
func TestLastSeqOn(t *testing.T) {
	srv := natstest.RunServer(t, "")
	_, js := natstest.Connect(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>", "other.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	if got, err := lastSeqOn(ctx, js, "OUT", []string{"out.>"}); err != nil || got != 0 {
		t.Fatalf("empty stream: lastSeqOn = %d, %v; want 0", got, err)
	}
	var msgs []*nats.Msg
	for _, s := range []string{"out.a.x", "out.b.y", "out.a.z", "other.a", "out.b.y.deep", "other.b"} {
		msgs = append(msgs, &nats.Msg{Subject: s, Data: []byte("x")})
	}
	natstest.PublishAll(t, js, msgs) // sequences 1..6 in order
	for _, c := range []struct {
		subjects []string
		want     uint64
	}{
		{[]string{"out.a.*"}, 3},
		{[]string{"out.a.x"}, 1},
		{[]string{"out.*.y"}, 2},
		{[]string{"out.a.*", "out.b.>"}, 5},
		{[]string{"out.>"}, 5},
		{[]string{"out.c.>", "out.a.x"}, 1},
		{[]string{"out.c.>"}, 0},
		{[]string{"none"}, 0},
	} {
		if got, err := lastSeqOn(ctx, js, "OUT", c.subjects); err != nil || got != c.want {
			t.Errorf("lastSeqOn(%q) = %d, %v; want %d", c.subjects, got, err, c.want)
		}
	}
	// A missing stream is asked again until the context ends.
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := lastSeqOn(short, js, "MISSING", []string{"out.>"}); err == nil {
		t.Error("lastSeqOn on a missing stream: no error")
	}
}
