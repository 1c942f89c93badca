package tcp

import (
	"fmt"
	"io"
	"net"

	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/kvbmerr"
)

// Authentication on the socket. Every connection, TCP or same-host,
// proves the endpoint's key both ways before a request is read: the
// challenge, the hello and the proofs are package capability's, which
// also derives every key (one derivation each); the server's side of the
// hello is handshake in server.go, the client's in peer.go. Here: what a
// connection's grant lets it do, and the refusals.

// answerIn answers a request the scope allows, and refuses, keeping the
// connection, one it does not: a read-only peer may read, not write nor
// map (a mapping could be written).
func (t *Transport) answerIn(g capability.Grant, c net.Conn, r io.Reader, q request) error {
	if g.Scope == capability.ScopeBlocks {
		// Counted from before the check to the last byte sent, so that a
		// revocation of its blocks waits for it (capability/revoke.go).
		tk := t.revoked.Enter()
		defer t.revoked.Exit(tk)
		if err := t.inScope(g.Blocks, c, q); err != nil {
			return t.refuseRequest(c, r, q, err)
		}
		return t.answer(c, r, q)
	}
	if g.Scope == capability.ScopeReadWrite || q.op == opRead {
		return t.answer(c, r, q)
	}
	return t.refuseRequest(c, r, q, fmt.Errorf("%w: the peer holds a read-only capability of worker %x: %s is refused (export read-write metadata to let it write)",
		kvbmerr.ErrUnsupported, t.m.WorkerID(), q.op))
}

// refuseRequest answers a request its scope does not allow with the
// reason, keeping the connection (a write's bytes are read past first).
func (t *Transport) refuseRequest(c net.Conn, r io.Reader, q request, err error) error {
	if q.op == opWrite {
		if _, derr := io.CopyN(io.Discard, r, int64(q.bytes)); derr != nil {
			return derr
		}
	}
	_, werr := c.Write(appendStatus(nil, statusOf(err), err.Error()))
	return werr
}

// refuseHello counts a connection refused at the hello and logs it as the
// server's other refusals are (logRefusal: once a minute per peer host).
func (t *Transport) refuseHello(c net.Conn, why string) {
	n := t.refusedHellos.Add(1)
	t.logRefusal(c.RemoteAddr().String(), "hello", "kvbm tcp: refused a connection at the hello",
		"worker", fmt.Sprintf("%#x", t.m.WorkerID()), "network", c.LocalAddr().Network(), "reason", why, "refused so far", n)
}

// Refused is the number of connections the server closed on at the hello,
// for want of a valid proof.
func (t *Transport) Refused() uint64 { return t.refusedHellos.Load() }
