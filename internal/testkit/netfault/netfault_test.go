package netfault

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// echoServer echoes every connection back; it is closed when the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readN reads n bytes from c within timeout.
func readN(c net.Conn, n int, timeout time.Duration) ([]byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	b := make([]byte, n)
	_, err := io.ReadFull(c, b)
	return b, err
}

// TestCutHoldsAndRestoreDelivers checks the cut a partition makes: nothing
// passes while it lasts, the connection stays open, and every byte sent
// meanwhile arrives once the link returns, in order.
func TestCutHoldsAndRestoreDelivers(t *testing.T) {
	p := Start(t, echoServer(t))
	c := dial(t, p)
	if _, err := c.Write([]byte("before")); err != nil {
		t.Fatal(err)
	}
	if b, err := readN(c, 6, 5*time.Second); err != nil || string(b) != "before" {
		t.Fatalf("before the cut: %q, %v", b, err)
	}
	p.Cut()
	want := bytes.Repeat([]byte("0123456789"), 20_000) // more than a few chunks
	if _, err := c.Write(want); err != nil {
		t.Fatal(err)
	}
	if b, err := readN(c, 1, 300*time.Millisecond); !errors.Is(err, syscall.EAGAIN) && !isTimeout(err) {
		t.Fatalf("during the cut read %q, %v; want a timeout", b, err)
	}
	p.Restore()
	got, err := readN(c, len(want), 10*time.Second)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after the cut: %d bytes, equal %v, %v", len(got), bytes.Equal(got, want), err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestResetAndCutAfter checks that Reset resets an open connection and that
// CutAfter truncates the stream at the byte asked for.
func TestResetAndCutAfter(t *testing.T) {
	p := Start(t, echoServer(t))
	c := dial(t, p)
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := readN(c, 1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := p.Reset(); n != 1 {
		t.Fatalf("Reset reset %d connections, want 1", n)
	}
	if _, err := readN(c, 1, 5*time.Second); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after Reset: %v, want ECONNRESET", err)
	}

	c = dial(t, p)
	p.CutAfter(Down, 5, false) // the echo back is cut after 5 bytes
	if _, err := c.Write([]byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	b, err := readN(c, 10, 5*time.Second)
	if string(b[:5]) != "01234" || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read after CutAfter(5): %q, %v; want 01234 then EOF", b, err)
	}
	if s := p.Stats(); s.Cut != 1 || s.Reset != 1 || s.Accepted != 2 {
		t.Fatalf("stats %+v, want 1 cut, 1 reset, 2 accepted", s)
	}
}

// TestLatencyAndBandwidth checks that a chunk is delayed by the latency and
// that the rate limit holds a transfer to about its rate.
func TestLatencyAndBandwidth(t *testing.T) {
	p := Start(t, echoServer(t))
	c := dial(t, p)
	p.SetLatency(100*time.Millisecond, 20*time.Millisecond)
	start := time.Now()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := readN(c, 4, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 160*time.Millisecond {
		t.Fatalf("round trip %v through 100ms±20ms each way, want at least 160ms", rtt)
	}
	p.SetLatency(0, 0)
	p.SetBandwidth(100_000)
	start = time.Now()
	if _, err := c.Write(make([]byte, 50_000)); err != nil {
		t.Fatal(err)
	}
	if _, err := readN(c, 50_000, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// 50 kB each way at 100 kB/s, the two directions pipelined: 0.5 s at least.
	if took := time.Since(start); took < 450*time.Millisecond {
		t.Fatalf("50 kB echoed in %v at 100 kB/s, want at least 450ms", took)
	}
}
