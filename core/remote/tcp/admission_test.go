package tcp

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/stretchr/testify/require"
)

// helloFrom dials p's exporter from the local IP from and passes the hello
// with the read-write key; ok is whether the server answered it (false:
// closed at its hello).
func helloFrom(t *testing.T, p *tcpPair, from string) (c net.Conn, ok bool) {
	t.Helper()
	e, _ := routes(t, p)
	c = dialFrom(t, from, e.addr, 1)[0]
	c.SetDeadline(time.Now().Add(10 * time.Second))
	sn := make([]byte, capability.NonceLen)
	_, err := io.ReadFull(c, sn)
	require.NoError(t, err)
	cn := make([]byte, capability.NonceLen)
	rand.Read(cn)
	_, err = c.Write(helloUnder(e.key, sn, cn, e.worker, 0x11, nil))
	require.NoError(t, err)
	_, err = io.ReadFull(c, make([]byte, capability.ProofLen))
	c.SetDeadline(time.Time{})
	return c, err == nil
}

// dialAccepted dials addr from the local IP from and waits for the
// server's challenge: once it comes, the server has accepted the
// connection and counted it, so that connections dialed one after the
// other are accepted in that order.
func dialAccepted(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	c := dialFrom(t, from, addr, 1)[0]
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.ReadFull(c, make([]byte, capability.NonceLen))
	require.NoError(t, err)
	return c
}

// closedBy reports whether the server closes c within wait (it is open
// when the wait ends first).
func closedBy(c net.Conn, wait time.Duration) bool {
	return closedAtOnce([]net.Conn{c}, wait) == 1
}

func pendingOf(tr *Transport, addr string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.lim.pending.count(addr)
}

// Connections from one address that have not passed the hello are refused
// at accept beyond MaxPendingConnsPerAddr, counted; a genuine peer from
// another address is served; once they close, the address may connect
// again.
func TestTCPPendingConnsPerAddrAreRefusedAtAccept(t *testing.T) {
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true, MaxPendingConnsPerAddr: 4, HelloDeadline: time.Minute})
	flood := dialFrom(t, "127.0.0.2", tcpAddr(t, p.expTCP), 7)
	require.Equal(t, 3, closedAtOnce(flood, 300*time.Millisecond), "three beyond the cap, closed at once")
	require.Equal(t, uint64(3), p.expTCP.Limits().OverMaxPendingConnsPerAddr)
	require.Zero(t, p.expTCP.Limits().OverMaxConnsPerAddr, "not the authenticated cap's")

	connectsAfresh(t, p) // from 127.0.0.1
	pull(t, p, "g1", 0x71)

	for _, c := range flood {
		c.Close()
	}
	require.Eventually(t, func() bool { return pendingOf(p.expTCP, "127.0.0.2") == 0 }, 5*time.Second, 10*time.Millisecond)
	again := dialFrom(t, "127.0.0.2", tcpAddr(t, p.expTCP), 4)
	require.Zero(t, closedAtOnce(again, 100*time.Millisecond), "the address may connect again once its connections closed")
	require.Equal(t, uint64(3), p.expTCP.Limits().OverMaxPendingConnsPerAddr)
}

// When the pending budget is full, a new connection takes the place of
// the oldest connection of the address holding the most; among addresses
// holding as many, of the oldest.
func TestTCPOldestPendingIsEvictedFirst(t *testing.T) {
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true, MaxPendingConns: 4, HelloDeadline: time.Minute})
	addr := tcpAddr(t, p.expTCP)
	a := dialAccepted(t, "127.0.0.2", addr)
	b := dialAccepted(t, "127.0.0.3", addr)
	c := dialAccepted(t, "127.0.0.3", addr)
	d := dialAccepted(t, "127.0.0.4", addr)
	require.Zero(t, p.expTCP.Limits().EvictedPending)

	e := dialAccepted(t, "127.0.0.5", addr)
	require.True(t, closedBy(b, 5*time.Second), "the oldest of 127.0.0.3, which holds two")
	require.False(t, closedBy(a, 100*time.Millisecond), "older, but of an address holding one")
	f := dialAccepted(t, "127.0.0.6", addr)
	require.True(t, closedBy(a, 5*time.Second), "each address holds one: the oldest of all")
	require.Zero(t, closedAtOnce([]net.Conn{c, d, e, f}, 100*time.Millisecond))
	require.Equal(t, uint64(2), p.expTCP.Limits().EvictedPending)
	p.expTCP.mu.Lock()
	require.Equal(t, 4, p.expTCP.lim.pending.len())
	p.expTCP.mu.Unlock()

	pull(t, p, "g2", 0x72) // the pair's own connections passed the hello: not pending, never evicted
}

// A connection whose hello passes leaves the pending budget for the
// authenticated one: connections still at their hello do not count
// against MaxConnsPerAddr, nor authenticated ones against
// MaxPendingConnsPerAddr; one beyond MaxConnsPerAddr is closed at its
// hello, counted.
func TestTCPHelloMovesAConnToTheAuthenticatedBudget(t *testing.T) {
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true,
		MaxPendingConnsPerAddr: 2, MaxConnsPerAddr: 3, HelloDeadline: time.Minute})
	var passed []net.Conn
	for range 3 { // one more than MaxPendingConnsPerAddr
		c, ok := helloFrom(t, p, "127.0.0.2")
		require.True(t, ok)
		passed = append(passed, c)
	}
	p.expTCP.mu.Lock()
	require.Equal(t, 3, p.expTCP.lim.perAddr["127.0.0.2"])
	require.Zero(t, p.expTCP.lim.pending.len())
	p.expTCP.mu.Unlock()

	_, ok := helloFrom(t, p, "127.0.0.2")
	require.False(t, ok, "closed at its hello: MaxConnsPerAddr")
	require.Equal(t, uint64(1), p.expTCP.Limits().OverMaxConnsPerAddr)
	require.Eventually(t, func() bool { return pendingOf(p.expTCP, "127.0.0.2") == 0 }, 5*time.Second, 10*time.Millisecond)
	pending := dialFrom(t, "127.0.0.2", tcpAddr(t, p.expTCP), 2)
	require.Zero(t, closedAtOnce(append(pending, passed...), 100*time.Millisecond), "two at their hello beside three past it")
	require.Zero(t, p.expTCP.Limits().OverMaxPendingConnsPerAddr)

	for _, c := range passed {
		c.Close()
	}
	require.Eventually(t, func() bool {
		p.expTCP.mu.Lock()
		defer p.expTCP.mu.Unlock()
		return p.expTCP.lim.perAddr["127.0.0.2"] == 0
	}, 5*time.Second, 10*time.Millisecond)
	pull(t, p, "g2", 0x73)
}

// A connection that does not pass the hello within HelloDeadline is
// closed, counted: one that says nothing, one that sends half a hello,
// and, on a TLS server, one that never starts the TLS handshake. A
// connection past its hello is not held to it.
func TestTCPSlowHelloIsClosedAtTheHelloDeadline(t *testing.T) {
	const hello = 100 * time.Millisecond
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true, HelloDeadline: hello})
	addr := tcpAddr(t, p.expTCP)
	silent := dialAccepted(t, "127.0.0.2", addr)
	half := dialAccepted(t, "127.0.0.2", addr)
	_, err := half.Write(make([]byte, capability.HelloLen/2))
	require.NoError(t, err)
	require.Empty(t, readAll(t, silent))
	require.Empty(t, readAll(t, half))
	require.Eventually(t, func() bool { return p.expTCP.Limits().SlowHellos == 2 }, 5*time.Second, time.Millisecond)
	require.Equal(t, uint64(0), p.expTCP.Refused(), "slow, not refused")

	// A connection past its hello (tried again should the loaded machine
	// make one slower than the deadline) outlives it.
	var c net.Conn
	require.Eventually(t, func() bool {
		var ok bool
		c, ok = helloFrom(t, p, "127.0.0.3")
		return ok
	}, 30*time.Second, time.Millisecond)
	time.Sleep(3 * hello)
	require.False(t, closedBy(c, 100*time.Millisecond), "past the hello: no deadline between requests")

	k := newPKI(t)
	cfg := tlsCfg(k.good(t, "server"))
	cfg.HelloDeadline = hello
	q := newTCPPair(t, 5*time.Second, cfg)
	raw := dialFrom(t, "127.0.0.2", tcpAddr(t, q.expTCP), 1)[0]
	require.Empty(t, readAll(t, raw), "no ClientHello: closed at the deadline")
	require.Eventually(t, func() bool { return q.expTCP.Limits().SlowHellos == 1 }, 5*time.Second, time.Millisecond)
}

// Same-host connections are not counted per address (the socket is this
// user's), but are in the pending budget as a whole.
func TestTCPSameHostConnsCountInThePendingBudgetOnly(t *testing.T) {
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", MaxPendingConnsPerAddr: 1, MaxPendingConns: 3, HelloDeadline: time.Minute})
	_, nets := routes(t, p)
	if nets["unix"] == "" {
		t.Skip("no same-host socket here:", SameHostStatus())
	}
	var cs []net.Conn
	for range 4 {
		c, err := net.Dial("unix", nets["unix"])
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.ReadFull(c, make([]byte, capability.NonceLen))
		require.NoError(t, err, "accepted")
		cs = append(cs, c)
	}
	require.True(t, closedBy(cs[0], 5*time.Second), "the fourth took the first's place")
	require.Zero(t, closedAtOnce(cs[1:], 100*time.Millisecond))
	l := p.expTCP.Limits()
	require.Zero(t, l.OverMaxPendingConnsPerAddr)
	require.Equal(t, uint64(1), l.EvictedPending)
}

// flood holds connections that never say hello to a server, from several
// local addresses, each dialed again as soon as the server closes it
// (refused, evicted, or past the hello deadline), until stop.
type flood struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	dials  atomic.Uint64 // connections opened
	live   atomic.Int64  // slots whose first connection opened

	mu      sync.Mutex
	stopped bool
	open    map[net.Conn]struct{}
}

func newFlood() *flood {
	f := &flood{open: map[net.Conn]struct{}{}}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	return f
}

// start opens n slots from the local IP from to addr.
func (f *flood) start(from, addr string, n int) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	for range n {
		f.wg.Add(1)
		go f.slot(d, addr)
	}
}

func (f *flood) slot(d net.Dialer, addr string) {
	defer f.wg.Done()
	first := true
	for f.ctx.Err() == nil {
		c, err := d.DialContext(f.ctx, "tcp", addr)
		if err != nil {
			select { // the backlog or the ports ran out for a moment
			case <-time.After(time.Millisecond):
			case <-f.ctx.Done():
			}
			continue
		}
		if !f.track(c) {
			return
		}
		f.dials.Add(1)
		if first {
			f.live.Add(1)
			first = false
		}
		io.Copy(io.Discard, c) // the challenge, then nothing until the server closes it (or stop does)
		f.untrack(c)
	}
}

func (f *flood) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		c.Close()
		return false
	}
	f.open[c] = struct{}{}
	return true
}

func (f *flood) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.open, c)
	f.mu.Unlock()
	c.Close()
}

// stop closes every connection and waits for the slots to end.
func (f *flood) stop() {
	f.cancel()
	f.mu.Lock()
	f.stopped = true
	for c := range f.open {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// 2,000 connections that never pass the hello, from 32 addresses and
// dialed again as the server closes them, do not keep a genuine peer out:
// it connects and pulls 64 blocks, every byte checked, while the flood
// goes on. The flood is refused per address and evicts its own.
func TestTCPHelloFloodDoesNotKeepAGenuinePeerOut(t *testing.T) {
	const conns, addrs, blocks = 2000, 32, 64
	p := newUnconnectedPair(t, 30*time.Second, smallConfig(blocks), Config{Listen: "127.0.0.1:0", NoSameHost: true})
	addr := tcpAddr(t, p.expTCP)
	f := newFlood()
	defer f.stop()
	// One address first, with more than MaxPendingConnsPerAddr, so that it
	// holds that many before the budget fills; then the others share the
	// rest (conns in all).
	first := DefaultMaxPendingConnsPerAddr + 36
	slots := func(i int) int {
		if i == 0 {
			return first
		}
		rest, others := conns-first, addrs-1
		if i-1 < rest%others {
			return rest/others + 1
		}
		return rest / others
	}
	f.start("127.0.0.2", addr, slots(0))
	require.Eventually(t, func() bool { return p.expTCP.Limits().OverMaxPendingConnsPerAddr > 0 }, 30*time.Second, time.Millisecond)
	for i := 1; i < addrs; i++ {
		f.start(fmt.Sprintf("127.0.0.%d", 2+i), addr, slots(i))
	}
	require.Eventually(t, func() bool { return f.live.Load() == conns && p.expTCP.Limits().EvictedPending > 0 },
		60*time.Second, 10*time.Millisecond, "the flood is open")

	dials := f.dials.Load()
	p.connect(t) // from 127.0.0.1
	fill(t, p.exp, p.remote["g2"], 0x7F)
	src, dst := make([]int, blocks), make([]int, blocks)
	for i := range blocks {
		src[i], dst[i] = i, blocks-1-i
	}
	n, err := p.imp.ExecuteTransfer(p.remote["g2"], src, p.local["g2"], dst, transfer.Options{})
	require.NoError(t, err)
	require.NoError(t, n.WaitTimeout(60*time.Second))
	for i := range blocks {
		require.Equal(t, pattern(p.cfg.BlockSize(), 0x7F, src[i]), block(t, p.imp, p.local["g2"], dst[i]), "block %d", src[i])
	}
	require.Greater(t, f.dials.Load(), dials, "the flood went on meanwhile")
	l := p.expTCP.Limits()
	t.Logf("flood: %d connections dialed; server: %+v", f.dials.Load(), l)
	require.NotZero(t, l.OverMaxPendingConnsPerAddr)
	require.NotZero(t, l.EvictedPending)
	require.Zero(t, l.OverMaxConns+l.OverMaxConnsPerAddr)
}

// addrConn is a connection that says it comes from addr.
type addrConn struct {
	net.Conn
	addr net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.addr }

// A pending connection is counted under its IPv4 address, or its IPv6
// /64; the same-host socket under none.
func TestPendingConnsAreCountedByAddressOrIPv6Prefix(t *testing.T) {
	for addr, want := range map[net.Addr]string{
		&net.TCPAddr{IP: net.ParseIP("10.1.2.3")}:             "10.1.2.3",
		&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1")}: "2001:db8:1:2::/64",
		&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:bbbb::9")}: "2001:db8:1:2::/64",
		&net.TCPAddr{IP: net.ParseIP("::ffff:10.1.2.3")}:      "10.1.2.3",
		&net.UnixAddr{Name: "@kvbm", Net: "unix"}:             "",
	} {
		require.Equal(t, want, pendingAddr(addrConn{addr: addr}), "%v", addr)
	}
}
