package netfault

import (
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// Routes puts a proxy on each route of a nats-server cluster, one per
// ordered pair of nodes (node i dialling node j), so that a node can be
// cut from its peers while its clients still reach it:
//
//	r := netfault.NewRoutes(t)
//	cl := natstest.StartClusterWith(t, 3, r.Edit)
//	r.Isolate(2) // node 2's routes held both ways
//	r.Heal(2)
//
// Its methods are safe for concurrent use.
type Routes struct {
	tb      testing.TB
	refuser string // an address that accepts and closes at once

	mu    sync.Mutex
	nodes map[int]int       // route port -> node
	pairs map[[2]int]*Proxy // (dialling node, route port dialled) -> proxy
	order [][2]int          // pairs in the order made
	cut   map[int]bool      // nodes cut from their peers
}

// NewRoutes returns Routes whose proxies are closed when the test ends.
func NewRoutes(tb testing.TB) *Routes {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("netfault: %v", err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	tb.Cleanup(func() { ln.Close() })
	return &Routes{tb: tb, refuser: ln.Addr().String(), nodes: map[int]int{}, pairs: map[[2]int]*Proxy{}, cut: map[int]bool{}}
}

// Edit is a natstest.StartClusterWith edit: node i dials each route through
// its own proxy, and advertises an address that closes every connection,
// so that no node reaches another's route port by an address it learned
// from a peer (an implicit route around the proxies). It also keeps the
// servers from telling clients the other nodes' addresses, so that a
// client that connects through a proxy stays behind proxies.
func (r *Routes) Edit(i int, o *server.Options) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nodes[o.Cluster.Port] = i
	o.Cluster.Advertise = r.refuser
	o.Cluster.NoAdvertise = true
	for k, u := range o.Routes {
		port := u.Port()
		var to int
		if _, err := fmt.Sscan(port, &to); err != nil {
			r.tb.Fatalf("netfault: route %s of node %d: %v", u, i, err)
		}
		key := [2]int{i, to}
		p, ok := r.pairs[key]
		if !ok {
			var err error
			if p, err = Listen(u.Host); err != nil {
				r.tb.Fatalf("netfault: route %s of node %d: %v", u, i, err)
			}
			r.tb.Cleanup(p.Close)
			r.pairs[key] = p
			r.order = append(r.order, key)
		}
		o.Routes[k] = &url.URL{Scheme: u.Scheme, Host: p.Addr()}
	}
}

// proxiesOf returns the proxies of the routes node k dials or is dialled by.
// r.mu is held.
func (r *Routes) proxiesOf(k int) []*Proxy {
	var out []*Proxy
	for _, key := range r.order {
		if to, ok := r.nodes[key[1]]; key[0] == k || ok && to == k {
			out = append(out, r.pairs[key])
		}
	}
	return out
}

// Isolate holds every route of node k, both ways (Cut on each proxy), and
// returns how many proxies it cut.
func (r *Routes) Isolate(k int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	ps := r.proxiesOf(k)
	for _, p := range ps {
		p.Cut()
	}
	r.cut[k] = true
	return len(ps)
}

// Heal restores every route of node k that no other cut node holds.
func (r *Routes) Heal(k int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.cut, k)
	for _, key := range r.order {
		from, to := key[0], r.nodes[key[1]]
		if (from == k || to == k) && !r.cut[from] && !r.cut[to] {
			r.pairs[key].Restore()
		}
	}
}
