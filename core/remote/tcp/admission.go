package tcp

import (
	"container/list"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/kvbm/kvbm/core/remote/capability"
)

// Admission: the budget of connections that have not passed the hello.
//
// A connection proves nothing until its hello verifies (the TLS handshake,
// where there is one, comes first), so until then it is not counted
// against MaxConns and MaxConnsPerAddr, which are the authenticated
// peers': were it counted there, idle connections from a few addresses
// that never say hello would hold every slot and shut the genuine peers
// out for as long as they may take. It is counted in a small pending
// budget of its own instead, and has HelloDeadline (short: an honest
// hello is one round trip) to pass. Once it passes, it moves into the
// authenticated budget, or is closed if that is full.
//
// The pending budget refuses a connection at accept only when its address
// holds MaxPendingConnsPerAddr already. When the budget is full as a
// whole, a new connection is taken and a pending one closed for it: the
// oldest of the address that holds the most. Refusing the newcomer
// instead would let a flood that keeps the budget full shut out the peer
// that comes after it; evicting by age alone would let a flood that keeps
// re-dialing evict an honest connection MaxPendingConns arrivals after it
// came, which a fast flood does faster than a round trip. Taken from the
// most crowded address, a flood from fewer than MaxPendingConns addresses
// evicts its own connections before the one or two of an honest peer.

// Default bounds of the pending budget (Config.MaxPendingConns,
// Config.MaxPendingConnsPerAddr) and its deadline (Config.HelloDeadline).
const (
	DefaultMaxPendingConns        = 256
	DefaultMaxPendingConnsPerAddr = 64 // the ranks of one node (TP 8, each Conns+1 a peer) dial at once
	DefaultHelloDeadline          = 2 * time.Second
)

// pendingConn is a connection in the pending budget.
type pendingConn struct {
	c    net.Conn
	addr string // pendingAddr: "" for the same-host socket
	seq  uint64 // accept order: the smallest is the oldest
}

// pendingConns are the connections that have not passed the hello, by
// address, each address's oldest first; under Transport.mu.
type pendingConns struct {
	byAddr map[string]*list.List // of *pendingConn
	at     map[net.Conn]*list.Element
	seq    uint64
}

func (p *pendingConns) len() int { return len(p.at) }

// count is the number of pending connections from addr.
func (p *pendingConns) count(addr string) int {
	if l := p.byAddr[addr]; l != nil {
		return l.Len()
	}
	return 0
}

func (p *pendingConns) add(c net.Conn, addr string) {
	if p.byAddr == nil {
		p.byAddr, p.at = map[string]*list.List{}, map[net.Conn]*list.Element{}
	}
	l := p.byAddr[addr]
	if l == nil {
		l = list.New()
		p.byAddr[addr] = l
	}
	p.seq++
	p.at[c] = l.PushBack(&pendingConn{c: c, addr: addr, seq: p.seq})
}

// remove takes c out of the budget; false when it was not in it (evicted).
func (p *pendingConns) remove(c net.Conn) bool {
	e, ok := p.at[c]
	if !ok {
		return false
	}
	delete(p.at, c)
	addr := e.Value.(*pendingConn).addr
	l := p.byAddr[addr]
	if l.Remove(e); l.Len() == 0 {
		delete(p.byAddr, addr)
	}
	return true
}

// victim is the connection to evict for a new one: the oldest of the
// address holding the most (ties: the oldest of them all). It looks at
// each address holding one, at most MaxPendingConns.
func (p *pendingConns) victim() net.Conn {
	var best *pendingConn
	bestLen := 0
	for _, l := range p.byAddr {
		front := l.Front().Value.(*pendingConn)
		if l.Len() > bestLen || (l.Len() == bestLen && front.seq < best.seq) {
			best, bestLen = front, l.Len()
		}
	}
	if best == nil {
		return nil
	}
	return best.c
}

// admitPending counts c in the pending budget, evicting a pending
// connection when the budget is full (the caller closes it), or reports
// why c must be closed; t.mu held.
func (t *Transport) admitPending(c net.Conn) (evicted net.Conn, refused string) {
	p := &t.lim.pending
	addr := pendingAddr(c)
	if addr != "" && p.count(addr) >= t.cfg.MaxPendingConnsPerAddr {
		t.lim.overPendingPerAddr.Add(1)
		return nil, "the server holds MaxPendingConnsPerAddr connections from this address that have not passed the hello"
	}
	if p.len() >= t.cfg.MaxPendingConns {
		if evicted = p.victim(); evicted != nil {
			p.remove(evicted)
			t.lim.evictedPending.Add(1)
		}
	}
	p.add(c, addr)
	return evicted, ""
}

// pendingAddr is the address a pending connection is counted under: its
// IP, or for IPv6 its /64, which one host commonly holds whole (so that a
// flood from many addresses of one /64 is taken from itself first); ""
// for the same-host socket.
func pendingAddr(c net.Conn) string {
	a, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return ""
	}
	if a.IP.To4() == nil && len(a.IP) == net.IPv6len {
		return a.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return a.IP.String()
}

// evict closes a pending connection admitPending took out of the budget
// (its goroutine sees the close and ends) and logs it.
func (t *Transport) evict(c net.Conn) {
	c.Close()
	t.logRefusal(c.RemoteAddr().String(), "evicted", "tcp transport: closed a connection that had not passed the hello to take a newer one",
		"max_pending_conns", t.cfg.MaxPendingConns)
}

// promote moves c, whose hello passed, from the pending budget into the
// authenticated one; false (logged) when c must be closed instead: the
// authenticated budget is full, or c was evicted meanwhile.
func (t *Transport) promote(c net.Conn) bool {
	t.mu.Lock()
	if !t.lim.pending.remove(c) {
		t.mu.Unlock()
		return false // evicted: closed, counted there
	}
	refused := t.admitConn(c)
	t.mu.Unlock()
	if refused != "" {
		t.logRefusal(c.RemoteAddr().String(), "conns", "tcp transport: closed a connection after its hello: "+refused,
			"max_conns", t.cfg.MaxConns, "max_conns_per_addr", t.cfg.MaxConnsPerAddr)
		return false
	}
	return true
}

// hello runs the TLS handshake, where there is one, and the hello within
// HelloDeadline, then moves raw into the authenticated budget (promote)
// before the server's proof is sent: a connection closed for want of room
// is closed at its hello. authed says whether it moved, for its release.
// The deadline stays set: the caller sets the request deadlines.
func (t *Transport) hello(raw net.Conn, authed *bool) (net.Conn, capability.Grant, bool) {
	raw.SetDeadline(time.Now().Add(t.cfg.HelloDeadline))
	c, ok := t.serverTLS(raw) // raw itself without TLS; closed with raw
	if !ok {
		return nil, capability.Grant{}, false
	}
	g, answer, ok := t.handshake(c)
	if !ok {
		return nil, capability.Grant{}, false
	}
	if *authed = t.promote(raw); !*authed {
		return nil, capability.Grant{}, false
	}
	if _, err := c.Write(answer); err != nil {
		return nil, capability.Grant{}, false
	}
	return c, g, true
}

// helloFailed counts and logs a connection whose TLS handshake or hello
// failed on its stream: the hello deadline passed (a slow hello), or the
// peer said something else or nothing (a refused hello). A connection
// closed here (evicted, or the transport closed) is not counted again.
func (t *Transport) helloFailed(c net.Conn, what string, err error) {
	var ne net.Error
	switch {
	case errors.Is(err, net.ErrClosed):
	case errors.As(err, &ne) && ne.Timeout():
		t.lim.slowHellos.Add(1)
		t.logRefusal(c.RemoteAddr().String(), "slow hello", "tcp transport: closed a connection that did not pass the hello within the hello deadline",
			"hello_deadline", t.cfg.HelloDeadline, "at", what)
	default:
		t.refuseHello(c, fmt.Sprintf("%s: %v", what, err))
	}
}
