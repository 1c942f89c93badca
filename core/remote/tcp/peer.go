package tcp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// tcpPeer is a connected TCP peer: a pool of up to Conns connections, each
// carrying one request at a time. Once an operation fails for a reason
// other than the server's refusal — the peer died, froze, or the network
// failed — the peer is broken: every connection closes and later calls
// fail at once, until the worker connects again.
type tcpPeer struct {
	t       *Transport
	worker  uint64
	key     capability.HelloKey // the key the hello is proved under: the capability's, or derived with the deployment key
	scope   capability.Scope    // the key's scope: a read-only peer is not mapped
	desc    []byte              // a block scope's descriptor, sent in the hello
	network string              // "tcp", or "unix" for a peer on this host
	addr    string
	slots   chan struct{} // one token per connection that may be open
	idle    chan *tcpConn

	mu     sync.Mutex
	broken error
	open   map[*tcpConn]struct{}

	shared sharedMaps // the peer's host layouts mapped here (same host only)
}

type tcpConn struct {
	c net.Conn
	r *bufio.Reader
	// deadline is the current operation's (zero: none); a copy of lent
	// memory stops once it passes, as the exporter stops lending then.
	deadline time.Time
	// pid is the server's process, for a Unix socket (0: unknown, or TCP).
	pid int
}

func newTCPPeer(t *Transport, ep tcpEndpoint, network, addr string) *tcpPeer {
	return &tcpPeer{t: t, worker: ep.worker, key: ep.key.HelloKey(t.authKey), scope: ep.scope, desc: ep.desc, network: network, addr: addr, slots: make(chan struct{}, t.cfg.Conns),
		idle: make(chan *tcpConn, t.cfg.Conns), open: map[*tcpConn]struct{}{}}
}

// Attach accepts the descriptors of the peer's own layouts. A peer on this
// host is asked for the shared memory of a host layout, which is mapped
// here; a layout it does not share is reached through the socket.
func (p *tcpPeer) Attach(d transfer.Descriptor) (transfer.Attachment, error) {
	if d.Handle.Worker != p.worker {
		return transfer.Attachment{}, fmt.Errorf("%w: layout %v is not worker %x's, which this connection reaches",
			kvbmerr.ErrInvalidArgument, d.Handle, p.worker)
	}
	if p.network == "unix" && p.scope == capability.ScopeReadWrite && (d.Kind.IsHost() || (d.Kind == storage.Device && p.t.m != nil)) {
		if err := p.mapLayout(d); err != nil {
			return transfer.Attachment{}, err
		}
	}
	return transfer.Attachment{Memory: p}, nil
}

// Read copies the peer's bytes into local host memory.
func (p *tcpPeer) Read(ctx context.Context, h transfer.LayoutHandle, ops []transfer.RemoteOp) error {
	if p.shared.has(h) {
		if err := p.each(ctx, h, ops, opLendRead); !errors.Is(err, errNotLent) {
			return err
		}
	}
	return p.each(ctx, h, ops, opRead)
}

// Write copies local host memory into the peer's layout.
func (p *tcpPeer) Write(ctx context.Context, h transfer.LayoutHandle, ops []transfer.RemoteOp) error {
	if p.shared.has(h) {
		if err := p.each(ctx, h, ops, opLendWrite); !errors.Is(err, errNotLent) {
			return err
		}
	}
	return p.each(ctx, h, ops, opWrite)
}

// each sends ops in requests of at most maxOps.
func (p *tcpPeer) each(ctx context.Context, h transfer.LayoutHandle, ops []transfer.RemoteOp, op wireOp) error {
	for len(ops) > 0 {
		n := min(len(ops), maxOps)
		if err := p.do(ctx, h, ops[:n], op); err != nil {
			return err
		}
		ops = ops[n:]
	}
	return nil
}

func (p *tcpPeer) do(ctx context.Context, h transfer.LayoutHandle, ops []transfer.RemoteOp, op wireOp) error {
	c, err := p.get(ctx)
	if err != nil {
		return err
	}
	c.deadline, _ = ctx.Deadline()
	c.c.SetDeadline(c.deadline)
	stop := context.AfterFunc(ctx, func() { c.c.SetDeadline(time.Unix(1, 0)) })
	err = p.exchange(c, h, ops, op)
	if !stop() && err == nil {
		p.drop(c) // done, but the deadline may be about to hit the connection
		return nil
	}
	if err != nil {
		var se *serverError
		if errors.As(err, &se) {
			p.put(c) // refused or failed there; the stream is in step
			return fmt.Errorf("peer %x: %w", p.worker, err)
		}
		var le *localError
		if errors.As(err, &le) {
			p.put(c) // failed here, after the exchange ended in step
			return err
		}
		if ctx.Err() == context.Canceled {
			// The caller gave up (Cancel, a transfer deadline): this
			// connection is out of step, the peer is not at fault.
			p.abort(c)
			return fmt.Errorf("peer %x: %w", p.worker, context.Cause(ctx))
		}
		return p.fail(c, ctx, err)
	}
	p.put(c)
	return nil
}

// exchange sends one request and takes its reply.
func (p *tcpPeer) exchange(c *tcpConn, h transfer.LayoutHandle, ops []transfer.RemoteOp, op wireOp) error {
	head := appendRequest(make([]byte, 0, reqHeadLen+opLen*len(ops)), op, h, ops)
	if op == opLendRead || op == opLendWrite {
		return p.borrow(c, head, h, ops, op == opLendWrite)
	}
	if op == opRead {
		if _, err := c.c.Write(head); err != nil {
			return err
		}
		if err := readStatus(c.r); err != nil {
			return err
		}
		// The bytes come in op order, read with readv into the ranges
		// here (those adjacent joined).
		return readFullv(c.c, c.r, localBytes(ops))
	}
	bufs := append(net.Buffers{head}, localBytes(ops)...)
	if _, err := bufs.WriteTo(c.c); err != nil { // writev, up to 1,024 ranges a call
		return err
	}
	return readStatus(c.r)
}

// localBytes is the memory here of ops, in order, adjacent ranges joined.
func localBytes(ops []transfer.RemoteOp) [][]byte {
	bufs := make([][]byte, len(ops))
	for i, o := range ops {
		bufs[i] = storage.HostBytes(o.Local, o.Size)
	}
	return joinAdjacent(bufs)
}

// watch holds one idle connection to the peer open, for no request: the
// peer closing it (its process exited, its worker was destroyed) breaks the
// peer at once, which lets go of its connections and of its memory mapped
// here, instead of at the next operation (which may never come: an engine
// forgets a dead peer's instance only if it is told to).
func (p *tcpPeer) watch(c *tcpConn) {
	defer p.t.wg.Done()
	c.c.SetDeadline(time.Time{})
	var b [1]byte
	_, err := c.c.Read(b[:]) // a server sends nothing unasked: this ends only when one side closes
	p.mu.Lock()
	delete(p.open, c) // it holds no slot
	if p.broken == nil {
		p.broken = fmt.Errorf("%w: peer %x at %s closed its connections (%v): it exited, or its worker was destroyed",
			remote.ErrPeerUnavailable, p.worker, p.addr, err)
	}
	p.mu.Unlock()
	rawConn(c.c).Close()
	// Also when an operation broke the peer first (it does not unmap), or
	// Close did (then this is done already): both are idempotent.
	p.closeIdle()
	p.shared.closeAll()
}

// fail closes a connection after a transport error and breaks the peer.
func (p *tcpPeer) fail(c *tcpConn, ctx context.Context, cause error) error {
	var err error
	var ne net.Error
	switch {
	case ctx.Err() == context.DeadlineExceeded || (errors.As(cause, &ne) && ne.Timeout()):
		err = fmt.Errorf("%w: %w: peer %x at %s did not answer within the deadline", remote.ErrPeerUnavailable, kvbmerr.ErrTimeout, p.worker, p.addr)
	case errors.Is(cause, io.EOF) || errors.Is(cause, io.ErrUnexpectedEOF):
		err = fmt.Errorf("%w: peer %x at %s closed the connection mid-operation (it exited, or refused the stream)",
			remote.ErrPeerUnavailable, p.worker, p.addr)
	default:
		err = fmt.Errorf("%w: peer %x at %s: %w", remote.ErrPeerUnavailable, p.worker, p.addr, cause)
	}
	p.mu.Lock()
	if p.broken == nil {
		p.broken = err
	}
	p.mu.Unlock()
	p.abort(c)
	p.closeIdle()
	return err
}

// get returns an idle connection, or dials one while fewer than Conns are
// open, or waits for one.
func (p *tcpPeer) get(ctx context.Context) (*tcpConn, error) {
	for {
		if err := p.brokenErr(); err != nil {
			return nil, err
		}
		select {
		case c := <-p.idle:
			return c, nil
		default:
		}
		select {
		case c := <-p.idle:
			return c, nil
		case p.slots <- struct{}{}:
			c, err := p.dialConn(ctx)
			if err != nil {
				<-p.slots
				return nil, err
			}
			return c, nil
		case <-ctx.Done():
			if ctx.Err() == context.Canceled {
				return nil, fmt.Errorf("peer %x: %w", p.worker, context.Cause(ctx))
			}
			return nil, fmt.Errorf("%w: %w: no connection to peer %x at %s within the deadline",
				remote.ErrPeerUnavailable, kvbmerr.ErrTimeout, p.worker, p.addr)
		}
	}
}

// dial opens the first connection (Connect holds its slot).
func (p *tcpPeer) dial(ctx context.Context) (*tcpConn, error) {
	p.slots <- struct{}{}
	c, err := p.dialConn(ctx)
	if err != nil {
		<-p.slots
	}
	return c, err
}

// dialConn connects, runs the TLS handshake where the transport has TLS
// (tls.go), and proves the key both ways (package capability).
func (p *tcpPeer) dialConn(ctx context.Context) (*tcpConn, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, p.network, p.addr)
	if err != nil {
		return nil, fmt.Errorf("%w: dial peer %x at %s: %w", remote.ErrPeerUnavailable, p.worker, p.addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		raw.SetDeadline(dl)
	}
	nc, err := p.clientTLS(ctx, raw)
	if err != nil {
		raw.Close()
		return nil, err
	}
	// The hello is read and written straight on the connection: its
	// buffers come once the server proved the key (a process that took
	// over the address costs nothing either).
	err = p.handshake(nc)
	if err != nil {
		raw.Close()
		if refusedByTLS(err) {
			return nil, fmt.Errorf("%w: peer %x at %s refused this transport's TLS certificate (%v): it must chain to the peer's %s and be valid now",
				remote.ErrPeerUnavailable, p.worker, p.addr, err, envTLSCA)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, fmt.Errorf("%w: %w: peer %x at %s accepted but did not answer the hello within the deadline",
				remote.ErrPeerUnavailable, kvbmerr.ErrTimeout, p.worker, p.addr)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: peer %x at %s closed the connection at the hello: it is not the worker this metadata names "+
				"(stale metadata: import its current metadata), its %s differs from this process's (set on one side only, or another key), "+
				"a request-scoped capability expired, or another kvbm version", remote.ErrPeerUnavailable, p.worker, p.addr, EnvAuthKey)
		}
		return nil, fmt.Errorf("%w: hello to peer %x at %s: %w", remote.ErrPeerUnavailable, p.worker, p.addr, err)
	}
	setBuffers(raw)
	// Small: reads of the bytes themselves, larger than it, bypass it.
	c := &tcpConn{c: nc, r: bufio.NewReaderSize(nc, 4<<10)}
	if cred := peerCred(nc); cred != nil {
		c.pid = int(cred.Pid)
	}
	p.mu.Lock()
	p.open[c] = struct{}{}
	p.mu.Unlock()
	return c, nil
}

// handshake answers the server's challenge and checks its proof.
func (p *tcpPeer) handshake(c net.Conn) error {
	var self uint64
	if p.t.m != nil {
		self = p.t.m.WorkerID()
	}
	sn := make([]byte, capability.NonceLen)
	if _, err := io.ReadFull(c, sn); err != nil {
		return err
	}
	cn, err := capability.NewNonce()
	if err != nil {
		return err
	}
	tr := capability.Transcript{SN: sn, CN: cn, Server: p.worker, Client: self}
	if _, err := c.Write(p.key.AppendHello(nil, tr, p.desc)); err != nil {
		return err
	}
	got := make([]byte, capability.ProofLen)
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !p.key.CheckServerProof(tr, got) {
		return fmt.Errorf("the peer's proof does not verify: the process at %s is not worker %x", p.addr, p.worker)
	}
	return nil
}

func (p *tcpPeer) put(c *tcpConn) {
	if p.brokenErr() != nil {
		p.drop(c)
		return
	}
	p.idle <- c // never blocks: at most Conns connections exist
}

// abort resets a connection whose operation failed or was given up on and
// frees its slot: a write's bytes still unsent here are discarded, and the
// server sees the reset at once (a plain close would send its FIN after
// those bytes, so that a server frozen meanwhile would read megabytes of
// a write given up on into its layout before it saw the close).
func (p *tcpPeer) abort(c *tcpConn) {
	resetOnClose(c.c)
	p.drop(c)
}

// resetOnClose makes closing c reset a TCP connection (SO_LINGER 0); a
// Unix socket's peer sees a close at once anyway.
func resetOnClose(c net.Conn) {
	if tc, ok := rawConn(c).(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
}

// drop closes a connection and frees its slot.
func (p *tcpPeer) drop(c *tcpConn) {
	p.mu.Lock()
	_, ok := p.open[c]
	delete(p.open, c)
	p.mu.Unlock()
	rawConn(c.c).Close()
	if ok {
		<-p.slots
	}
}

func (p *tcpPeer) closeIdle() {
	for {
		select {
		case c := <-p.idle:
			p.drop(c)
		default:
			return
		}
	}
}

// Server names the server p reaches (remote.ScopeMember).
func (p *tcpPeer) Server() string { return fmt.Sprintf("%x %s %s", p.worker, p.network, p.addr) }

// Worker is the server's worker id (remote.ScopeMember).
func (p *tcpPeer) Worker() uint64 { return p.worker }

// Broken says why p can no longer be used (remote.ScopeMember).
func (p *tcpPeer) Broken() error { return p.brokenErr() }

func (p *tcpPeer) brokenErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.broken
}

// Close breaks the peer: operations in flight fail, later ones are refused.
func (p *tcpPeer) Close() error {
	p.mu.Lock()
	if p.broken == nil {
		p.broken = fmt.Errorf("%w: the connection to peer %x at %s was closed", remote.ErrPeerUnavailable, p.worker, p.addr)
	}
	open := make([]*tcpConn, 0, len(p.open))
	for c := range p.open {
		open = append(open, c)
	}
	p.mu.Unlock()
	for _, c := range open {
		resetOnClose(c.c)    // what is in flight is given up on
		rawConn(c.c).Close() // in-flight operations fail; their owners drop them
	}
	p.closeIdle()
	p.t.forget(p)
	p.shared.closeAll() // after copies in flight end
	return nil
}
