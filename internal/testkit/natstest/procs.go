package natstest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupe-stage/dedupe-stage/internal/testkit/proctest"
)

// Procs is a cluster of nats-server processes with JetStream on loopback,
// each node with its own configuration, store and log under one
// directory. Unlike Cluster's in-process nodes, whose shutdown hands the
// node's leaderships over first, a node killed here takes them down with
// it, and its CPU is its own process's. A node restarts on its ports and
// store. It is the one process cluster of the bench and the fault tests.
type Procs struct {
	Nodes []*ProcNode
}

// ProcsSpec is what StartProcs starts.
type ProcsSpec struct {
	Bin   string // the nats-server binary
	Dir   string // node i keeps n<i>.conf, n<i>.log (n<i>-<k>.log for restart k) and the store n<i>/ here
	Nodes int    // 3 for R3 streams; 1 starts a server without a cluster
	// SyncAlways fsyncs every stored message before it is acknowledged
	// (jetstream.sync_interval: always), so that a SIGKILL of a node
	// loses nothing it acknowledged; otherwise the server's default (a
	// sync every 2 minutes).
	SyncAlways bool
	// KillWithParent has the kernel kill the nodes when this process dies
	// without stopping them.
	KillWithParent bool
	// Monitor serves each node's monitoring endpoints (/varz, /jsz, ...)
	// on a loopback port of its own (ProcNode.MonitorPort).
	Monitor bool
	// Extra is appended to every node's configuration as it is.
	Extra string
}

// ProcNode is one nats-server process of Procs.
type ProcNode struct {
	Name        string // n<i>, the server's name
	Port        int    // the client port
	MonitorPort int    // the monitoring port with ProcsSpec.Monitor, else 0
	Proc        *proctest.Process

	spec   ProcsSpec
	conf   string
	starts int
}

// StartProcs starts the nodes of s and waits until every node answers
// JetStream requests and, with more than one node, a stream of
// s.Nodes replicas can be placed; it waits at most a minute. On an error
// the nodes it started are killed.
func StartProcs(ctx context.Context, s ProcsSpec) (*Procs, error) {
	ports, err := proctest.Ports(3 * s.Nodes)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return nil, err
	}
	c := &Procs{}
	routes := make([]string, s.Nodes)
	for i := range s.Nodes {
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", ports[s.Nodes+i])
	}
	for i := range s.Nodes {
		n := &ProcNode{Name: fmt.Sprintf("n%d", i), Port: ports[i], spec: s, conf: filepath.Join(s.Dir, fmt.Sprintf("n%d.conf", i))}
		conf := fmt.Sprintf("server_name: %s\nlisten: 127.0.0.1:%d\njetstream {\n  store_dir: %q\n", n.Name, n.Port, n.StoreDir())
		if s.SyncAlways {
			conf += "  sync_interval: always\n"
		}
		conf += "}\n"
		if s.Monitor {
			n.MonitorPort = ports[2*s.Nodes+i]
			conf += fmt.Sprintf("http: 127.0.0.1:%d\n", n.MonitorPort)
		}
		if s.Nodes > 1 {
			conf += fmt.Sprintf("cluster {\n  name: dedupe-procs\n  listen: 127.0.0.1:%d\n  routes: [%s]\n}\n", ports[s.Nodes+i], strings.Join(routes, ", "))
		}
		if err := os.WriteFile(n.conf, []byte(conf+s.Extra), 0o644); err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	for _, n := range c.Nodes {
		if err = n.launch(); err != nil {
			break
		}
	}
	for _, n := range c.Nodes {
		if err == nil {
			err = n.waitUp(ctx, time.Minute)
		}
	}
	if err == nil && s.Nodes > 1 {
		err = c.waitPlaceable(ctx, time.Minute)
	}
	if err != nil {
		c.Kill()
		return nil, err
	}
	return c, nil
}

// URLs returns every node's client URL, comma-separated, as nats.Connect
// and the stage's nats.url take them.
func (c *Procs) URLs() string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = n.URL()
	}
	return strings.Join(urls, ",")
}

// Pids returns the process id of every running node.
func (c *Procs) Pids() []int {
	var pids []int
	for _, n := range c.Nodes {
		if n.Proc != nil && n.Proc.Running() {
			pids = append(pids, n.Proc.Pid())
		}
	}
	return pids
}

// Stop stops every node with SIGTERM, each given grace before SIGKILL, and
// reports whether SIGTERM sufficed for all.
func (c *Procs) Stop(grace time.Duration) bool {
	clean := true
	for _, n := range c.Nodes {
		clean = n.Stop(syscall.SIGTERM, grace) && clean
	}
	return clean
}

// Kill kills every node and waits for them to exit. It is safe to call
// more than once.
func (c *Procs) Kill() {
	for _, n := range c.Nodes {
		if n.Proc != nil {
			n.Proc.Kill()
		}
	}
}

// URL is the node's client URL.
func (n *ProcNode) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.Port) }

// StoreDir is the node's JetStream store directory.
func (n *ProcNode) StoreDir() string { return filepath.Join(n.spec.Dir, n.Name) }

// Start starts a stopped node again on its ports and store, and waits up
// to timeout until JetStream answers on it.
func (n *ProcNode) Start(ctx context.Context, timeout time.Duration) error {
	if n.Proc != nil && n.Proc.Running() {
		return fmt.Errorf("nats-server %s: started while running", n.Name)
	}
	if err := n.launch(); err != nil {
		return err
	}
	return n.waitUp(ctx, timeout)
}

// Stop sends sig, waits up to grace for the exit, then kills the node. It
// reports whether sig sufficed.
func (n *ProcNode) Stop(sig os.Signal, grace time.Duration) bool {
	if n.Proc == nil {
		return true
	}
	return n.Proc.Stop(sig, grace)
}

// launch runs the node without waiting for it.
func (n *ProcNode) launch() error {
	log := filepath.Join(n.spec.Dir, n.Name+".log")
	if n.starts > 0 {
		log = filepath.Join(n.spec.Dir, fmt.Sprintf("%s-%d.log", n.Name, n.starts))
	}
	n.starts++
	p, err := proctest.Start(proctest.Spec{Name: "nats-server " + n.Name, Bin: n.spec.Bin, Args: []string{"-c", n.conf},
		LogPath: log, KillWithParent: n.spec.KillWithParent})
	if err != nil {
		return err
	}
	n.Proc = p
	return nil
}

// waitUp waits until the node accepts clients and answers $JS.API.INFO
// (which needs a meta leader on a cluster).
func (n *ProcNode) waitUp(ctx context.Context, timeout time.Duration) error {
	var last error
	ok := Until(timeout, 50*time.Millisecond, func() bool {
		if !n.Proc.Running() || ctx.Err() != nil {
			return true
		}
		last = jsInfo(n.URL())
		return last == nil
	})
	switch {
	case !n.Proc.Running():
		return fmt.Errorf("nats-server %s exited: %v\n%s", n.Name, n.Proc.Err(), n.Proc.LogTail(3000))
	case ctx.Err() != nil:
		return ctx.Err()
	case !ok:
		return fmt.Errorf("nats-server %s: JetStream not answering within %v: %v", n.Name, timeout, last)
	}
	return nil
}

// jsInfo asks the server at url for the account's JetStream info.
func jsInfo(url string) error {
	nc, err := nats.Connect(url, nats.MaxReconnects(0), nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	m, err := nc.Request("$JS.API.INFO", nil, 2*time.Second)
	if err == nil && strings.Contains(string(m.Data), `"error"`) {
		err = fmt.Errorf("$JS.API.INFO: %s", m.Data)
	}
	return err
}

// waitPlaceable creates and deletes a memory stream of one replica per
// node until it succeeds: the meta leader places a replicated stream only
// on the peers it has heard from.
func (c *Procs) waitPlaceable(ctx context.Context, timeout time.Duration) error {
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var last error
	if Until(timeout, 200*time.Millisecond, func() bool {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		cfg := jetstream.StreamConfig{Name: "PROBE", Subjects: []string{"_probe"}, Replicas: len(c.Nodes), Storage: jetstream.MemoryStorage}
		if _, last = js.CreateOrUpdateStream(rctx, cfg); last == nil {
			last = js.DeleteStream(rctx, "PROBE")
		}
		return last == nil || ctx.Err() != nil
	}) && ctx.Err() == nil {
		return nil
	}
	return fmt.Errorf("no stream of %d replicas placed within %v: %v", len(c.Nodes), timeout, last)
}
