package natstest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestClusterR3SurvivesANode checks the cluster helper gives what tests of
// replicated streams need: an R3 stream stores on three nodes, and it
// keeps accepting and serving messages with one node stopped and after
// that node is back.
func TestClusterR3SurvivesANode(t *testing.T) {
	c := StartCluster(t, 3)
	_, js := c.Connect()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.CreateStream(js, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3})
	publish := func(from, to int) {
		t.Helper()
		var msgs []*nats.Msg
		for i := from; i < to; i++ {
			msgs = append(msgs, &nats.Msg{Subject: fmt.Sprintf("r3.%d", i), Data: []byte("x")})
		}
		PublishAll(t, js, msgs)
	}
	publish(0, 50)
	st, err := js.Stream(ctx, "R3")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster == nil || len(info.Cluster.Replicas)+1 != 3 {
		t.Fatalf("stream cluster info %+v, want a leader and two replicas", info.Cluster)
	}

	// Stop the stream's leader: the stream must elect another and go on.
	leader := -1
	for i := range c.Size() {
		if c.Server(i).Name() == info.Cluster.Leader {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("leader %q is not a node of the cluster", info.Cluster.Leader)
	}
	c.Stop(leader)
	Poll(t, 30*time.Second, 100*time.Millisecond, "a new stream leader", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		info, err := st.Info(ctx)
		if err != nil {
			return false, err
		}
		return info.Cluster != nil && info.Cluster.Leader != "" && info.Cluster.Leader != fmt.Sprintf("n%d", leader), nil
	})
	publish(50, 100)
	c.Restart(leader)
	publish(100, 150)

	got := ReadAll(t, js, "R3")
	if len(got) != 150 {
		t.Fatalf("stream holds %d messages, want 150", len(got))
	}
	// Each message once. Not in publish order: an async publish the new
	// stream did not answer yet (no responders) is sent again after the
	// ones behind it, as CI saw once (r3.48 stored third).
	seen := map[string]bool{}
	for _, m := range got {
		if seen[m.Subject] {
			t.Errorf("%s stored twice", m.Subject)
		}
		seen[m.Subject] = true
	}
	for i := range 150 {
		if want := fmt.Sprintf("r3.%d", i); !seen[want] {
			t.Errorf("%s not stored", want)
		}
	}
}
