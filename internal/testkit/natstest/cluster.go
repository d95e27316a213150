package natstest

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// Cluster is an in-process nats-server cluster with JetStream, every node
// on loopback with its own store directory. Nodes can be stopped and
// restarted on the same ports and store, to lose and regain a node. It is
// for tests only; its methods are safe for concurrent use.
type Cluster struct {
	tb      testing.TB
	name    string
	clients []int // client port of each node
	routes  []int // cluster (route) port of each node
	dirs    []string

	edit func(i int, o *server.Options) // StartClusterWith's, applied at every start of node i

	mu      sync.Mutex
	servers []*server.Server // nil while a node is stopped
}

// StartCluster starts an n-node cluster (n >= 1; 3 for replicated R3
// streams) and waits until JetStream has a meta leader and every node is
// current. Every node is shut down when the test ends.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	return StartClusterWith(tb, n, nil)
}

// StartClusterWith is StartCluster with node i's options changed by
// edit(i, o) before each start of the node (nil: none), for a test that
// puts proxies in the routes or keeps clients from learning other nodes'
// addresses. edit may be called for several nodes at once.
func StartClusterWith(tb testing.TB, n int, edit func(i int, o *server.Options)) *Cluster {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("natstest: StartCluster(%d), want at least one node", n)
	}
	c := &Cluster{tb: tb, name: "dedupe-test", servers: make([]*server.Server, n), edit: edit}
	ports, err := proctest.Ports(2 * n)
	if err != nil {
		tb.Fatalf("natstest: %v", err)
	}
	c.clients, c.routes = ports[:n], ports[n:]
	base := tb.TempDir()
	for i := range n {
		c.dirs = append(c.dirs, filepath.Join(base, fmt.Sprintf("n%d", i)))
	}
	tb.Cleanup(c.shutdownAll)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.start(i)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			tb.Fatalf("natstest: cluster node %d: %v", i, err)
		}
	}
	c.WaitReady(30 * time.Second)
	return c
}

// options are node i's server options: fixed ports, routes to every other
// node, its own store.
func (c *Cluster) options(i int) *server.Options {
	var routes []*url.URL
	for j, p := range c.routes {
		if j == i {
			continue
		}
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	return &server.Options{
		ServerName: fmt.Sprintf("n%d", i),
		Host:       "127.0.0.1",
		Port:       c.clients[i],
		JetStream:  true,
		StoreDir:   c.dirs[i],
		NoLog:      true,
		NoSigs:     true,
		Cluster: server.ClusterOpts{
			Name: c.name,
			Host: "127.0.0.1",
			Port: c.routes[i],
		},
		Routes: routes,
	}
}

// start starts node i and waits until it accepts clients.
func (c *Cluster) start(i int) error {
	o := c.options(i)
	if c.edit != nil {
		c.edit(i, o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		return err
	}
	go s.Start()
	if !s.ReadyForConnections(20 * time.Second) {
		s.Shutdown()
		return fmt.Errorf("node %d not ready for connections in 20s", i)
	}
	c.mu.Lock()
	c.servers[i] = s
	c.mu.Unlock()
	return nil
}

// Size returns the number of nodes, running or not.
func (c *Cluster) Size() int { return len(c.clients) }

// Server returns node i, or nil while it is stopped.
func (c *Cluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[i]
}

// URL returns the client URL of node i.
func (c *Cluster) URL(i int) string { return fmt.Sprintf("nats://127.0.0.1:%d", c.clients[i]) }

// URLs returns the client URLs of every node, comma-separated, which is
// what nats.Connect and the stage's nats.url accept: a client fails over to
// another node when its node stops.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.clients))
	for i := range c.clients {
		urls[i] = c.URL(i)
	}
	return strings.Join(urls, ",")
}

// Connect connects to the cluster (any node) and returns the connection and
// a JetStream context; both are closed when the test ends.
func (c *Cluster) Connect() (*nats.Conn, jetstream.JetStream) {
	c.tb.Helper()
	return Connect(c.tb, c.URLs())
}

// Stop shuts node i down and waits until it is gone. Its store and ports
// are kept for Restart.
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	s := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Restart starts node i again on its ports and store, and waits until the
// cluster is ready again.
func (c *Cluster) Restart(i int) {
	c.tb.Helper()
	if c.Server(i) != nil {
		c.tb.Fatalf("natstest: Restart(%d): node is running", i)
	}
	if err := c.start(i); err != nil {
		c.tb.Fatalf("natstest: restart node %d: %v", i, err)
	}
	c.WaitReady(30 * time.Second)
}

// WaitReady waits until every running node sees a JetStream meta leader and
// answers JetStream requests, and the meta leader counts every running node
// as a peer that can hold a replica (it has the node's JetStream stats), so
// that a replicated stream can be placed; it fails the test after timeout.
func (c *Cluster) WaitReady(timeout time.Duration) {
	c.tb.Helper()
	Poll(c.tb, timeout, 50*time.Millisecond, "the cluster's JetStream to be ready", func() (bool, error) {
		c.mu.Lock()
		servers := append([]*server.Server(nil), c.servers...)
		c.mu.Unlock()
		running, peers := 0, -1
		for _, s := range servers {
			if s == nil {
				continue
			}
			running++
			if s.JetStreamIsLeader() {
				peers = len(s.JetStreamClusterPeers())
			}
		}
		if peers < running {
			return false, fmt.Errorf("the meta leader sees %d of %d running nodes as JetStream peers", max(peers, 0), running)
		}
		for i, s := range servers {
			if s == nil {
				continue
			}
			if !s.JetStreamEnabled() {
				return false, fmt.Errorf("node %d: JetStream not enabled yet", i)
			}
			if err := jsReady(c.URL(i)); err != nil {
				return false, fmt.Errorf("node %d: %w", i, err)
			}
		}
		return true, nil
	})
}

// jsReady connects to url and asks for the account's JetStream info, which
// needs a meta leader.
func jsReady(u string) error {
	nc, err := nats.Connect(u, nats.MaxReconnects(0), nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

// shutdownAll stops every running node.
func (c *Cluster) shutdownAll() {
	var wg sync.WaitGroup
	for i := range c.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Stop(i)
		}()
	}
	wg.Wait()
}

// CreateStream creates a stream on the cluster and returns it once the
// stream has a leader (publishes before that find no responder). A request
// the cluster leaves unanswered (a meta leader that steps down before it
// replies) is asked again, with cfg unchanged, for up to a minute: the
// create is idempotent.
func (c *Cluster) CreateStream(js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	c.tb.Helper()
	var st jetstream.Stream
	Poll(c.tb, time.Minute, 100*time.Millisecond, "stream "+cfg.Name+" to be created", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		if st, err = js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return false, err
		}
		// Created is not yet served: a publish before the stream's first
		// leader is elected finds no responder.
		info, err := st.Info(ctx)
		if err != nil {
			return false, err
		}
		return info.Cluster != nil && info.Cluster.Leader != "", fmt.Errorf("stream %s has no leader yet", cfg.Name)
	})
	return st
}
