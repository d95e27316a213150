// Package netfault puts a TCP proxy between a test's client and its server
// and breaks the link on demand, as a network does, while both ends keep
// running: it holds the bytes of every connection (a cut: packets dropped,
// nothing reset, the bytes delivered intact once the link returns, as TCP's
// retransmission does), delays them (latency with jitter, order kept),
// limits their rate, resets every connection (RST), or cuts one connection
// after a given number of bytes (a truncated write). It is for tests only.
//
//	p := netfault.Start(t, "127.0.0.1:4222")
//	// the client connects to p.URL() instead of the server
//	p.Cut()      // connections held, new ones accepted and held too
//	p.Restore()  // the held bytes flow again, in order
//	p.Reset()    // every open connection reset
//
// Toxiproxy (github.com/Shopify/toxiproxy/v2) was the obvious choice and is
// not used: its timeout toxic, the only one that stops traffic without a
// reset, drops the bytes it stops and closes the connection when removed, so
// it cannot hold a link the way a partition does; and removing a toxic under
// traffic has hung (its issues 159, 210, 558). The faults here are the ones
// the tests need, in one small file with no dependency.
package netfault

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// Direction is one way through a proxy.
type Direction int

// The two directions.
const (
	Up   Direction = iota // client to server
	Down                  // server to client
)

func (d Direction) String() string {
	if d == Up {
		return "client->server"
	}
	return "server->client"
}

// chunkSize is the most one read takes, and so the unit of delay.
const chunkSize = 16 << 10

// queueLen bounds the chunks read ahead of the writer per direction: past
// it, reading stops and the bytes wait in the kernel's buffers (and the
// sender's writes block), as on a link that stopped acknowledging.
const queueLen = 64

// Proxy is a TCP proxy on a loopback port. Its methods are safe for
// concurrent use.
type Proxy struct {
	name     string
	upstream string
	ln       net.Listener

	mu       sync.Mutex
	links    map[*link]struct{}
	held     chan struct{} // closed while traffic flows; open while cut
	latency  time.Duration
	jitter   time.Duration
	rate     int            // bytes per second per direction and connection; 0: unlimited
	cutAfter [2]int64       // per direction: bytes still to pass before a connection is cut; -1: off
	cutReset bool           // the cut after cutAfter is a reset (RST); else a close (FIN)
	rng      *rand.Rand     // jitter
	stats    [2]int64       // bytes forwarded per direction
	accepted int            // connections accepted
	cuts     int            // connections cut by cutAfter
	resets   int            // connections reset by Reset
	closed   bool           // Close was called
	done     sync.WaitGroup // the accept loop and every link
}

// Start starts a proxy to upstream (host:port) on a free loopback port; it
// is closed when the test ends.
func Start(tb testing.TB, upstream string) *Proxy {
	tb.Helper()
	p, err := Listen(upstream)
	if err != nil {
		tb.Fatalf("netfault: %v", err)
	}
	tb.Cleanup(p.Close)
	return p
}

// Listen starts a proxy to upstream on a free loopback port. Close stops it.
func Listen(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy to %s: %w", upstream, err)
	}
	held := make(chan struct{})
	close(held)
	p := &Proxy{
		name: ln.Addr().String() + "->" + upstream, upstream: upstream, ln: ln,
		links: map[*link]struct{}{}, held: held, cutAfter: [2]int64{-1, -1},
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1)),
	}
	p.done.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL is the proxy's address as a NATS URL.
func (p *Proxy) URL() string { return "nats://" + p.Addr() }

// String names the proxy: its address and its upstream.
func (p *Proxy) String() string { return p.name }

// Cut stops the traffic of every connection, open or opened later, in both
// directions, without closing any: what a connection sends waits, first in
// the proxy, then in the kernel's buffers. Restore lets it through.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.held:
		p.held = make(chan struct{})
	default: // already cut
	}
}

// Restore ends a Cut: what was held is delivered, in order.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.held:
	default:
		close(p.held)
	}
}

// IsCut reports whether the proxy holds the traffic.
func (p *Proxy) IsCut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.held:
		return false
	default:
		return true
	}
}

// SetLatency delays every chunk of every connection by latency plus a
// uniform draw from [-jitter, +jitter] after it was read, keeping the
// order of each direction; zeros turn it off.
func (p *Proxy) SetLatency(latency, jitter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency, p.jitter = latency, min(jitter, latency)
}

// SetBandwidth limits each direction of each connection to bytesPerSecond;
// 0 removes the limit.
func (p *Proxy) SetBandwidth(bytesPerSecond int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rate = bytesPerSecond
}

// CutAfter arms a cut of one connection: once n more bytes have passed in
// direction d (over all connections), the connection carrying the next
// byte gets the bytes up to it, and is then reset (RST) when reset is set,
// else closed: a write truncated mid-message. The cut happens once.
func (p *Proxy) CutAfter(d Direction, n int64, reset bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutAfter[d], p.cutReset = n, reset
}

// Reset resets every open connection (RST to both ends) and returns how
// many it reset. New connections are accepted as before.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	var ls []*link
	for l := range p.links {
		ls = append(ls, l)
	}
	p.resets += len(ls)
	p.mu.Unlock()
	for _, l := range ls {
		l.abort(true)
	}
	return len(ls)
}

// Stats is what a proxy has done so far.
type Stats struct {
	Bytes    [2]int64 // forwarded, by Direction
	Accepted int      // connections accepted
	Open     int      // connections open now
	Cut      int      // connections cut by CutAfter
	Reset    int      // connections reset by Reset
}

// Stats returns what the proxy has done so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Bytes: p.stats, Accepted: p.accepted, Open: len(p.links), Cut: p.cuts, Reset: p.resets}
}

// Close stops accepting, closes every connection and waits for the
// proxy's goroutines. It is safe to call twice.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	ls := make([]*link, 0, len(p.links))
	for l := range p.links {
		ls = append(ls, l)
	}
	select {
	case <-p.held:
	default:
		close(p.held) // unblocks the writers, which then find their conns closed
	}
	p.mu.Unlock()
	p.ln.Close()
	for _, l := range ls {
		l.abort(false)
	}
	p.done.Wait()
}

func (p *Proxy) accept() {
	defer p.done.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			c.Close() // the upstream is down: as a client connecting to it would, this one fails
			continue
		}
		l := &link{p: p, conns: [2]net.Conn{c, up}}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			up.Close()
			return
		}
		p.links[l] = struct{}{}
		p.accepted++
		p.done.Add(2)
		p.mu.Unlock()
		go l.pump(Up, c, up)
		go l.pump(Down, up, c)
	}
}

// link is one proxied connection: the client's side and the upstream's.
type link struct {
	p     *Proxy
	conns [2]net.Conn // client, upstream
	once  sync.Once
}

// chunk is a read of one direction, stamped with when it was read.
type chunk struct {
	b  []byte
	at time.Time
}

// pump copies src to dst through the proxy's faults: a reader goroutine
// stamps chunks, and this one writes each when its delay, the rate limit
// and a cut allow. The end of either direction closes the whole link.
func (l *link) pump(d Direction, src, dst net.Conn) {
	defer l.p.done.Done()
	q := make(chan chunk, queueLen)
	go func() {
		defer close(q)
		for {
			b := make([]byte, chunkSize)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{b[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	var due, free time.Time // the last chunk's delivery time; when the rate allows the next byte
	for c := range q {
		if !l.deliver(d, dst, c, &due, &free) {
			break
		}
	}
	l.abort(false)
	for range q { // let the reader end: it exits once its conn is closed
	}
}

// deliver writes one chunk to dst once the faults allow it, and reports
// whether the link is still up.
func (l *link) deliver(d Direction, dst net.Conn, c chunk, due, free *time.Time) bool {
	p := l.p
	p.mu.Lock()
	held, lat, jit, rate := p.held, p.latency, p.jitter, p.rate
	var j time.Duration
	if jit > 0 {
		j = time.Duration(p.rng.Int64N(int64(2*jit+1))) - jit
	}
	p.mu.Unlock()
	<-held
	if lat > 0 {
		at := c.at.Add(lat + j)
		if at.Before(*due) {
			at = *due // a chunk never overtakes the one before it
		}
		*due = at
		time.Sleep(time.Until(at))
		<-held // a cut that began while the chunk was delayed holds it too
	}
	for b := c.b; len(b) > 0; {
		n := len(b)
		if rate > 0 {
			n = min(n, max(rate/20, 1)) // slices of 50 ms at the rate
			now := time.Now()
			if free.Before(now) {
				*free = now
			}
			time.Sleep(time.Until(*free))
			*free = free.Add(time.Duration(float64(n) / float64(rate) * float64(time.Second)))
		}
		n, cut, reset := l.take(d, n)
		if n > 0 {
			if _, err := dst.Write(b[:n]); err != nil {
				return false
			}
		}
		if cut {
			l.abort(reset)
			return false
		}
		b = b[n:]
	}
	return true
}

// take accounts n bytes about to pass in direction d and returns how many
// may pass, and whether the link is to be cut after them (reset: with an
// RST).
func (l *link) take(d Direction, n int) (int, bool, bool) {
	p := l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if left := p.cutAfter[d]; left >= 0 && int64(n) > left {
		p.cutAfter[d] = -1
		p.cuts++
		p.stats[d] += left
		return int(left), true, p.cutReset
	} else if left >= 0 {
		p.cutAfter[d] -= int64(n)
	}
	p.stats[d] += int64(n)
	return n, false, false
}

// abort closes both sides of the link, with an RST when reset is set.
func (l *link) abort(reset bool) {
	l.once.Do(func() {
		for _, c := range l.conns {
			if tc, ok := c.(*net.TCPConn); ok && reset {
				_ = tc.SetLinger(0)
			}
			c.Close()
		}
		l.p.mu.Lock()
		delete(l.p.links, l)
		l.p.mu.Unlock()
	})
}
