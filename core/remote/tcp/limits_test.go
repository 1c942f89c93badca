package tcp

import (
	"context"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/transfer"
	"github.com/stretchr/testify/require"
)

// flakyListener fails its first n accepts as a process out of file
// descriptors does (EMFILE), then works.
type flakyListener struct {
	net.Listener
	n atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.n.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// pull moves blocks of the exporter's layout into the importer's and
// checks them.
func pull(t *testing.T, p *tcpPair, name string, seed byte) {
	t.Helper()
	fill(t, p.exp, p.remote[name], seed)
	n, err := p.imp.ExecuteTransfer(p.remote[name], []int{1, 5}, p.local[name], []int{2, 3}, transfer.Options{})
	require.NoError(t, err)
	require.NoError(t, n.WaitTimeout(-1))
	require.Equal(t, pattern(p.cfg.BlockSize(), seed, 1), block(t, p.imp, p.local[name], 2))
	require.Equal(t, pattern(p.cfg.BlockSize(), seed, 5), block(t, p.imp, p.local[name], 3))
}

// An EMFILE burst at accept does not end the server: it retries with a
// pause and serves the peer that connects meanwhile, and later ones.
func TestTCPAcceptSurvivesAnEMFILEBurst(t *testing.T) {
	const burst = 6 // pauses of 5+10+20+40+80+160 ms
	var flaky []*flakyListener
	listenWrap = func(ln net.Listener) net.Listener {
		f := &flakyListener{Listener: ln}
		f.n.Store(burst)
		flaky = append(flaky, f)
		return f
	}
	defer func() { listenWrap = nil }()
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true})
	listenWrap = nil
	require.Len(t, flaky, 2)
	pull(t, p, "g1", 0x21)
	require.Equal(t, uint64(burst), p.expTCP.Limits().AcceptErrors)

	// A second peer, connected after the burst, is served too.
	connectsAfresh(t, p)
}

// A peer that sends one byte of a request header and stalls is closed at
// the remote deadline of that byte, counted; a genuine peer is served
// meanwhile, and an idle connection (no byte sent) is left open.
func TestTCPSlowHeaderIsClosedAtTheDeadline(t *testing.T) {
	const deadline = 300 * time.Millisecond
	p := newTCPPair(t, deadline, Config{Listen: "127.0.0.1:0", NoSameHost: true})
	peer := p.peer.(*tcpPeer)
	slow, err := peer.dialConn(context.Background()) // past the hello: an authenticated peer
	require.NoError(t, err)
	idle, err := peer.dialConn(context.Background())
	require.NoError(t, err)
	slow.c.SetDeadline(time.Time{})
	idle.c.SetDeadline(time.Time{})
	start := time.Now()
	_, err = slow.c.Write([]byte{byte(opRead)})
	require.NoError(t, err)
	closed := make(chan time.Duration, 1)
	go func() {
		io.Copy(io.Discard, slow.c) // ends when the server closes it
		closed <- time.Since(start)
	}()
	pull(t, p, "g2", 0x42) // the genuine peer, on its own connection
	select {
	case took := <-closed:
		require.GreaterOrEqual(t, took, deadline-50*time.Millisecond)
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not close a connection stalled in a request header")
	}
	require.Equal(t, uint64(1), p.expTCP.Limits().SlowHeaders)

	idle.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	_, err = idle.c.Read(make([]byte, 1))
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout(), "an idle connection between requests stays open: %v", err)
	pull(t, p, "g1", 0x43)
}

// dialFrom opens n raw connections to addr from the local IP from (any
// loopback address: 127.0.0.0/8 is all this host's).
func dialFrom(t *testing.T, from, addr string, n int) []net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	var cs []net.Conn
	for range n {
		c, err := d.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return cs
}

// closedAtOnce counts the connections the server closed (EOF or reset)
// within wait; the others are still open (an admitted one is sent the
// handshake's nonce, then waits for the client's proof).
func closedAtOnce(cs []net.Conn, wait time.Duration) int {
	n := 0
	buf := make([]byte, 64)
	for _, c := range cs {
		c.SetReadDeadline(time.Now().Add(wait))
		for {
			_, err := c.Read(buf)
			if err == nil {
				continue
			}
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				n++
			}
			break
		}
	}
	return n
}

func tcpAddr(t *testing.T, tr *Transport) string {
	t.Helper()
	return tr.Addr().String()
}

// connectsAfresh checks that another importer connects to p's exporter on
// new connections (a genuine peer during or after a flood).
func connectsAfresh(t *testing.T, p *tcpPair) {
	t.Helper()
	imp := New(Config{Listen: "127.0.0.1:0", NoSameHost: true})
	defer imp.Close()
	ep, err := p.expTCP.Endpoint()
	require.NoError(t, err)
	peer, err := imp.Connect(context.Background(), ep)
	require.NoError(t, err)
	require.NoError(t, peer.Close())
}

// helloedFrom passes n hellos from the local IP from, one after the other;
// it returns the connections the server kept, and how many it closed at
// their hello.
func helloedFrom(t *testing.T, p *tcpPair, from string, n int) (kept []net.Conn, closed int) {
	t.Helper()
	for range n {
		if c, ok := helloFrom(t, p, from); ok {
			kept = append(kept, c)
		} else {
			closed++
		}
	}
	return kept, closed
}

// Connections beyond MaxConnsPerAddr from one address are closed once
// their hello passes, counted; a genuine peer from another address is
// served, and once the address's connections close, it may connect again.
func TestTCPConnsPerAddrAreCapped(t *testing.T) {
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true, MaxConnsPerAddr: 4})
	kept, closed := helloedFrom(t, p, "127.0.0.2", 7)
	require.Equal(t, 3, closed, "three beyond the cap, closed at their hello")
	require.Equal(t, uint64(3), p.expTCP.Limits().OverMaxConnsPerAddr)

	// A genuine peer from 127.0.0.1, on new connections.
	connectsAfresh(t, p)
	pull(t, p, "g1", 0x51)

	for _, c := range kept {
		c.Close()
	}
	require.Eventually(t, func() bool {
		p.expTCP.mu.Lock()
		defer p.expTCP.mu.Unlock()
		return p.expTCP.lim.perAddr["127.0.0.2"] == 0
	}, 5*time.Second, 10*time.Millisecond)
	_, closed = helloedFrom(t, p, "127.0.0.2", 4)
	require.Zero(t, closed, "the address may connect again once its connections closed")
	require.Equal(t, uint64(3), p.expTCP.Limits().OverMaxConnsPerAddr)
}

// Connections beyond MaxConns are closed once their hello passes, from
// any address; once they close, a genuine peer is served.
func TestTCPConnsAreCappedGlobally(t *testing.T) {
	const max = 8
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true, MaxConns: max})
	p.expTCP.mu.Lock()
	held := p.expTCP.lim.authed // the importer's
	p.expTCP.mu.Unlock()
	kept2, closed2 := helloedFrom(t, p, "127.0.0.2", 4)
	kept3, closed3 := helloedFrom(t, p, "127.0.0.3", 4)
	require.Equal(t, held, closed2+closed3)
	require.Equal(t, uint64(held), p.expTCP.Limits().OverMaxConns)
	require.Len(t, append(kept2, kept3...), max-held)
	for _, c := range append(kept2, kept3...) {
		c.Close()
	}
	require.Eventually(t, func() bool {
		p.expTCP.mu.Lock()
		defer p.expTCP.mu.Unlock()
		return p.expTCP.lim.authed == held
	}, 5*time.Second, 10*time.Millisecond)
	connectsAfresh(t, p)
	pull(t, p, "g2", 0x61)
}
