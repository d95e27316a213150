package stage_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/metrictest"
	"github.com/dedupe-stage/dedupe-stage/internal/testkit/natstest"
)

// fetchState says how the fetch component stands:
// dedupe_component_healthy{component="fetch"} (-1 when not exported) and
// /healthz's answer (nil or its error).
func fetchState(t *testing.T, r *running) (float64, error) {
	t.Helper()
	v, ok := metrictest.Lookup(t, r.reg, "dedupe_component_healthy", map[string]string{"component": "fetch"})
	if !ok {
		v = -1
	}
	return v, r.status.Healthy()
}

// waitFetch waits until the fetch component is unhealthy (want
// non-empty: /healthz names it with want) or healthy (want empty), and
// fails with what it saw last.
func waitFetch(t *testing.T, r *running, timeout time.Duration, want string) {
	t.Helper()
	natstest.Poll(t, timeout, 50*time.Millisecond, "the fetch component to be "+map[bool]string{true: "healthy", false: "failing: " + want}[want == ""],
		func() (bool, error) {
			gauge, err := fetchState(t, r)
			if want == "" {
				return err == nil && gauge == 1, fmt.Errorf("healthz %v, dedupe_component_healthy{fetch} %v", err, gauge)
			}
			return err != nil && strings.Contains(err.Error(), "fetch: ") && strings.Contains(err.Error(), want) && gauge == 0,
				fmt.Errorf("healthz %v, dedupe_component_healthy{fetch} %v", err, gauge)
		})
}

// TestDeletedConsumerIsUnhealthy deletes the stage's consumer under it:
// /healthz and dedupe_component_healthy name fetch and the consumer within
// seconds; once the consumer is back, the next message recovers it.
func TestDeletedConsumerIsUnhealthy(t *testing.T) {
	e := newEnv(t)
	r := e.start()
	e.publish([]event{{key: "k1", payload: []byte("1")}})
	e.drained(30 * time.Second)
	waitFetch(t, r, 10*time.Second, "")

	ctx := context.Background()
	c, err := e.js.Consumer(ctx, e.cfg.Input.Stream, e.cfg.Input.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	cc := c.CachedInfo().Config
	if err := e.js.DeleteConsumer(ctx, e.cfg.Input.Stream, e.cfg.Input.Consumer); err != nil {
		t.Fatal(err)
	}
	// The pull ends with "consumer deleted", and the backlog read every 5s
	// finds it missing: either fails the component at once.
	waitFetch(t, r, 15*time.Second, "consumer dedupe-stage on stream EVENTS")
	_, err = fetchState(t, r)
	t.Logf("with the consumer deleted: %v", err)

	if _, err := e.js.CreateConsumer(ctx, e.cfg.Input.Stream, cc); err != nil {
		t.Fatal(err)
	}
	e.publish([]event{{key: "k2", payload: []byte("2")}})
	waitFetch(t, r, 30*time.Second, "")
	e.drained(30 * time.Second)
	if n := len(e.outputByKey()); n != 2 {
		t.Errorf("%d keys forwarded, want 2", n)
	}
}

// TestRefusedPullIsUnhealthy runs the stage as a user that may do
// everything but pull from its consumer: the permissions violation on the
// pull subject fails fetch at once, naming it, while nothing else fails.
func TestRefusedPullIsUnhealthy(t *testing.T) {
	const pull = "$JS.API.CONSUMER.MSG.NEXT.EVENTS.dedupe-stage"
	srv := natstest.RunServerWith(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "stage", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{pull}},
		}}}
	})
	url := strings.Replace(srv.ClientURL(), "nats://", "nats://stage:pw@", 1)
	e := newEnvAt(t, srv, url)
	r := e.start()
	waitFetch(t, r, 15*time.Second, "consumer dedupe-stage on stream EVENTS: pull refused: nats: permissions violation: Permissions Violation for Publish to \""+pull+"\"")
	_, err := fetchState(t, r)
	t.Logf("with the pull refused: %v", err)
	failing, _ := strings.CutPrefix(err.Error(), "failing, retrying: ")
	if parts := strings.Split(failing, "; "); len(parts) != 1 {
		t.Errorf("more than fetch fails: %v", err)
	}
}
