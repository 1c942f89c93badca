package tcp

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvbm/kvbm/core/remote"
)

// Default bounds on the server's authenticated connections
// (Config.MaxConns, Config.MaxConnsPerAddr). A peer worker holds Conns (4)
// connections and one more that watches for its death, so one address
// holds a dozen workers' worth at the default. Connections still at their
// hello have a budget of their own (admission.go).
const (
	DefaultMaxConns        = 1024
	DefaultMaxConnsPerAddr = 64
)

// Accept errors (EMFILE, ENFILE, ECONNABORTED, ENOBUFS...) are retried
// after a pause that doubles from acceptBackoffMin to acceptBackoffMax,
// as net/http's server does; a successful accept resets it.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// refusalLogEvery is how often a refusal of one kind is logged for one
// peer address at most; refusalLogPeers bounds the addresses remembered.
const (
	refusalLogEvery = time.Minute
	refusalLogPeers = 4096
)

// listenWrap, when set (tests only), wraps the server's TCP listener.
var listenWrap func(net.Listener) net.Listener

// LimitCounts count what the server refused or survived to keep its
// resources bounded, since the transport started.
type LimitCounts struct {
	// AcceptErrors are failed accepts (the listener retried after a pause).
	AcceptErrors uint64
	// OverMaxPendingConnsPerAddr are connections closed at accept because
	// the server held MaxPendingConnsPerAddr connections from their
	// address that had not passed the hello; EvictedPending those that had
	// not passed it, closed to take a newer one when the server held
	// MaxPendingConns; SlowHellos those that did not pass it (the TLS
	// handshake included) within HelloDeadline (admission.go).
	OverMaxPendingConnsPerAddr, EvictedPending, SlowHellos uint64
	// OverMaxConns and OverMaxConnsPerAddr are connections closed once
	// their hello passed because the server held MaxConns authenticated
	// connections, or MaxConnsPerAddr from the connection's address.
	OverMaxConns, OverMaxConnsPerAddr uint64
	// SlowHeaders are connections closed because a request header did not
	// arrive whole within the remote deadline of its first byte;
	// BadRequests those closed for a malformed request header.
	SlowHeaders, BadRequests uint64
}

// Limits reports the server's refusals and accept errors.
func (t *Transport) Limits() LimitCounts {
	l := &t.lim
	return LimitCounts{AcceptErrors: l.acceptErrors.Load(),
		OverMaxPendingConnsPerAddr: l.overPendingPerAddr.Load(), EvictedPending: l.evictedPending.Load(), SlowHellos: l.slowHellos.Load(),
		OverMaxConns: l.overConns.Load(), OverMaxConnsPerAddr: l.overPerAddr.Load(),
		SlowHeaders: l.slowHeaders.Load(), BadRequests: l.badRequests.Load()}
}

// limits is the server's connection accounting and refusal counters.
type limits struct {
	// Under Transport.mu: the connections that have not passed the hello
	// (admission.go), and those that have: in all, and by remote IP (TCP
	// only).
	pending pendingConns
	authed  int
	perAddr map[string]int

	acceptErrors, overPendingPerAddr, evictedPending, slowHellos atomic.Uint64
	overConns, overPerAddr, slowHeaders, badRequests             atomic.Uint64

	logMu  sync.Mutex
	logged map[refusalKey]time.Time
}

type refusalKey struct{ peer, what string }

// connAddr is the address a connection is counted under for
// MaxConnsPerAddr and MaxPendingConnsPerAddr: its remote IP; "" (not
// counted) for the same-host socket, whose peers are this user's
// processes.
func connAddr(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return ""
}

// admitConn counts c, whose hello passed, against the caps of
// authenticated connections, or reports why it must be closed; t.mu held.
func (t *Transport) admitConn(c net.Conn) (refused string) {
	if t.lim.authed >= t.cfg.MaxConns {
		t.lim.overConns.Add(1)
		return "the server holds MaxConns connections"
	}
	addr := connAddr(c)
	if addr == "" {
		t.lim.authed++
		return ""
	}
	if t.lim.perAddr == nil {
		t.lim.perAddr = map[string]int{}
	}
	if t.lim.perAddr[addr] >= t.cfg.MaxConnsPerAddr {
		t.lim.overPerAddr.Add(1)
		return "the server holds MaxConnsPerAddr connections from this address"
	}
	t.lim.perAddr[addr]++
	t.lim.authed++
	return ""
}

// releaseConn uncounts a closed connection: from the authenticated caps
// when admitConn admitted it (authed), else from the pending budget (where
// an evicted one is no longer); t.mu held.
func (t *Transport) releaseConn(c net.Conn, authed bool) {
	if !authed {
		t.lim.pending.remove(c)
		return
	}
	t.lim.authed--
	addr := connAddr(c)
	if addr == "" {
		return
	}
	if n := t.lim.perAddr[addr] - 1; n > 0 {
		t.lim.perAddr[addr] = n
	} else {
		delete(t.lim.perAddr, addr)
	}
}

// acceptFailed counts and logs a failed accept and pauses before the next
// try; it returns the next pause, or false when the transport closed
// meanwhile.
func (t *Transport) acceptFailed(ln net.Listener, err error, pause time.Duration) (time.Duration, bool) {
	t.lim.acceptErrors.Add(1)
	if pause == 0 {
		pause = acceptBackoffMin
	} else {
		pause = min(2*pause, acceptBackoffMax)
	}
	t.logRefusal(ln.Addr().String(), "accept", "tcp transport: accept failed; retrying", "err", err, "retry_in", pause) // "peer": the listener's own address
	timer := time.NewTimer(pause)
	defer timer.Stop()
	select {
	case <-timer.C:
		return pause, true
	case <-t.stop:
		return 0, false
	}
}

// requestFailed counts and logs a request header that did not arrive
// whole within its deadline, or was malformed (the connection closes).
func (t *Transport) requestFailed(c net.Conn, err error) {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		t.lim.slowHeaders.Add(1)
		t.logRefusal(c.RemoteAddr().String(), "slow header", "tcp transport: closed a connection whose request header did not arrive within the remote deadline",
			"deadline", t.m.RemoteDeadline())
	case errors.Is(err, remote.ErrBadEndpoint):
		t.lim.badRequests.Add(1)
		t.logRefusal(c.RemoteAddr().String(), "bad request", "tcp transport: closed a connection after a malformed request", "err", err)
	}
	// else the peer or Close ended the connection
}

// logRefusal logs at warn, at most once per refusalLogEvery for one kind
// of refusal from one peer address (its IP: a flood from many ports of one
// host is one peer).
func (t *Transport) logRefusal(peer, what, msg string, args ...any) {
	if host, _, err := net.SplitHostPort(peer); err == nil {
		peer = host
	}
	k := refusalKey{peer, what}
	now := time.Now()
	l := &t.lim
	l.logMu.Lock()
	if last, ok := l.logged[k]; ok && now.Sub(last) < refusalLogEvery {
		l.logMu.Unlock()
		return
	}
	if l.logged == nil || len(l.logged) >= refusalLogPeers {
		for k, last := range l.logged {
			if now.Sub(last) >= refusalLogEvery {
				delete(l.logged, k)
			}
		}
		if l.logged == nil || len(l.logged) >= refusalLogPeers {
			l.logged = map[refusalKey]time.Time{} // a flood from many addresses: forget, log again
		}
	}
	l.logged[k] = now
	l.logMu.Unlock()
	slog.Warn(msg, append([]any{"peer", peer, "refused", t.Limits()}, args...)...)
}
