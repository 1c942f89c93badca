package tcp

import (
	"bufio"
	"errors"
	"io"
	"net"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/core/remote/capability"
)

// accept serves the connections of a listener until the transport closes.
// A failed accept (EMFILE, ...) is retried after a pause (limits.go); a
// connection beyond MaxPendingConnsPerAddr is closed at once, before
// anything is read from it or allocated for it, and one beyond
// MaxPendingConns takes the place of an older one (admission.go).
func (t *Transport) accept(ln net.Listener) {
	defer t.wg.Done()
	var pause time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ok bool
			if pause, ok = t.acceptFailed(ln, err, pause); !ok {
				return // closed
			}
			continue
		}
		pause = 0
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			c.Close()
			return
		}
		if !admitPeer(c) {
			t.mu.Unlock()
			c.Close() // another user of this host: it may not map our memory
			continue
		}
		evicted, refused := t.admitPending(c)
		if refused != "" {
			t.mu.Unlock()
			c.Close()
			t.logRefusal(c.RemoteAddr().String(), "pending", "tcp transport: closed a connection at accept: "+refused,
				"max_pending_conns_per_addr", t.cfg.MaxPendingConnsPerAddr)
			continue
		}
		t.conns[c] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		if evicted != nil {
			t.evict(evicted)
		}
		go t.serveConn(c)
	}
}

// serveConn answers one peer connection's requests until it closes. From
// a request's first byte to its answer the connection has the manager's
// remote deadline, so that a frozen or slow peer (one byte of a header,
// then nothing) cannot hold the connection or the manager for ever;
// between requests it waits without one. The TLS handshake, where there
// is one, and the hello run within the hello deadline instead, in the
// pending budget (admission.go).
func (t *Transport) serveConn(raw net.Conn) {
	defer t.wg.Done()
	authed := false
	defer func() {
		raw.Close()
		t.mu.Lock()
		delete(t.conns, raw)
		t.releaseConn(raw, authed)
		t.mu.Unlock()
	}()
	c, g, ok := t.hello(raw, &authed)
	if !ok {
		return
	}
	deadline := t.m.RemoteDeadline()
	// Only now, once the peer proved a capability, does the connection get
	// anything of its own: a peer that cannot is closed on having cost
	// the hello's few bytes, never a buffer.
	setBuffers(raw)
	// Small: reads of the bytes themselves, larger than it, bypass it.
	r := bufio.NewReaderSize(c, 4<<10)
	var err error
	var buf []byte
	for {
		c.SetDeadline(time.Time{})
		if _, err := r.Peek(1); err != nil {
			return // closed
		}
		c.SetDeadline(time.Now().Add(deadline))
		var q request
		q, buf, err = readRequest(r, buf)
		if err != nil {
			t.requestFailed(c, err)
			return // closed, slow, or a malformed request: the connection cannot be trusted further
		}
		err = t.answerIn(g, c, r, q)
		t.served.Add(1)
		if err != nil {
			return
		}
	}
}

// handshake challenges the client and checks its hello (package
// capability); a client that fails it is closed on with nothing said but
// the challenge. The hello is read straight from the connection (no
// buffered reader yet), its scope descriptor bounded by
// capability.MaxScopeLen. The server's proof, answer, is the caller's to
// send.
func (t *Transport) handshake(c net.Conn) (g capability.Grant, answer []byte, ok bool) {
	sn, err := capability.NewNonce()
	if err != nil {
		return capability.Grant{}, nil, false
	}
	if _, err := c.Write(sn); err != nil {
		return capability.Grant{}, nil, false
	}
	b := make([]byte, capability.HelloLen)
	if _, err := io.ReadFull(c, b); err != nil {
		t.helloFailed(c, "no hello", err)
		return capability.Grant{}, nil, false
	}
	h, err := capability.ParseHello(b)
	if err != nil {
		t.refuseHello(c, err.Error())
		return capability.Grant{}, nil, false
	}
	if h.ScopeLen > 0 {
		h.Scope = make([]byte, h.ScopeLen)
		if _, err := io.ReadFull(c, h.Scope); err != nil {
			t.helloFailed(c, "no scope descriptor", err)
			return capability.Grant{}, nil, false
		}
	}
	g, answer, why := t.verifier.Verify(h, sn, t.m.WorkerID(), time.Now())
	if answer == nil {
		t.refuseHello(c, why)
		return capability.Grant{}, nil, false
	}
	return g, answer, true
}

// answer serves one request; an error means the connection must close.
// A request Serve refuses before its first piece (a bad range, an unknown
// layout) is answered with the reason, the connection kept.
func (t *Transport) answer(c net.Conn, r io.Reader, q request) error {
	started := false
	var err error
	switch q.op {
	case opMap:
		return t.answerMap(c, q)
	case opLendRead, opLendWrite:
		err = t.lend(c, r, q, &started)
	case opRead:
		ok := net.Buffers{appendStatus(nil, statusOK, "")}
		err = t.m.Serve(q.handle, q.ops, false, func(pieces [][]byte) error {
			started = true
			bufs := append(ok, joinAdjacent(slices.Clone(pieces))...)
			ok = nil                  // the status goes once, before the first piece
			_, err := bufs.WriteTo(c) // writev, up to 1,024 pieces a call
			return err
		})
	default:
		// A write whose pusher gave up (its deadline passed, it was
		// canceled) is not applied: its bytes may still be queued here,
		// read late by a server that was frozen, and the blocks they are
		// for may have been reused since. The pusher resets the connection
		// (abort: a close would queue its FIN behind the bytes still
		// unsent) before it reports the failure; the server looks for that
		// before it moves the bytes into the layout, then between reads of
		// at most checkEvery bytes (each a readv into as many pieces as it
		// covers), and before staged bytes are copied to the device.
		br, _ := r.(*bufio.Reader)
		err = t.m.Serve(q.handle, q.ops, true, func(pieces [][]byte) error {
			started = true
			pieces = joinAdjacent(slices.Clone(pieces))
			var batch [][]byte
			for len(pieces) > 0 {
				if peerClosed(c) {
					return errPusherGaveUp
				}
				batch = batch[:0]
				for n := 0; len(pieces) > 0 && n < checkEvery; {
					k := min(len(pieces[0]), checkEvery-n)
					batch = append(batch, pieces[0][:k])
					if n += k; k == len(pieces[0]) {
						pieces = pieces[1:]
					} else {
						pieces[0] = pieces[0][k:]
					}
				}
				if err := readPieces(c, r, br, batch); err != nil {
					return err
				}
			}
			if peerClosed(c) {
				return errPusherGaveUp
			}
			return nil
		})
	}
	switch {
	case err != nil && started:
		return err // out of step mid-request: close; the peer sees the connection end
	case err != nil:
		if q.op == opWrite { // the bytes of the refused write are still on the wire
			if _, derr := io.CopyN(io.Discard, r, int64(q.bytes)); derr != nil {
				return derr
			}
		}
		_, werr := c.Write(appendStatus(nil, statusOf(err), err.Error()))
		return werr
	case q.op == opWrite:
		_, werr := c.Write(appendStatus(nil, statusOK, ""))
		return werr
	}
	return nil
}

// readPieces fills pieces from the request's stream: with readv where r is
// the connection's own buffered reader, else piece by piece.
func readPieces(c net.Conn, r io.Reader, br *bufio.Reader, pieces [][]byte) error {
	if br != nil {
		return readFullv(c, br, pieces)
	}
	for _, p := range pieces {
		if _, err := io.ReadFull(r, p); err != nil {
			return err
		}
	}
	return nil
}

// checkEvery is the most bytes of a write the server moves into the
// layout between two looks at whether its pusher closed the connection:
// where the pusher gives up while the server reads, at most this much
// more of the write lands after the pusher's failure (the bytes already
// queued here stay readable after a reset).
const checkEvery = 1 << 20

var errPusherGaveUp = errors.New("the pusher closed the connection before the write's bytes were applied")

// peerClosed reports whether the peer of c has closed its side (shut
// down writing, or reset), seen by the kernel even while bytes it sent
// before are still queued to be read here.
func peerClosed(c net.Conn) bool {
	sc, ok := rawConn(c).(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			closed = fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
		}
	})
	return closed
}

// setBuffers asks for socket buffers large enough to keep a fast link busy.
func setBuffers(c net.Conn) {
	if bc, ok := c.(interface {
		SetReadBuffer(int) error
		SetWriteBuffer(int) error
	}); ok {
		bc.SetReadBuffer(4 << 20)
		bc.SetWriteBuffer(4 << 20)
	}
}
