package tcp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
)

// Config configures the TCP transport.
type Config struct {
	// Listen is the address the server listens on (default
	// KVBM_TCP_LISTEN). When it is set the server listens at Serve (an
	// explicit setting: the worker serves from create); when it is not,
	// it listens at the first Endpoint (the worker's first metadata
	// export), on a free port of the Advertise host, so that a worker
	// nobody asked to serve listens on nothing, and one that serves
	// listens on the interface it advertises, never on every interface.
	Listen string
	// Advertise is the host peers dial (default KVBM_TCP_ADVERTISE, else
	// the listen host when it names one, else, when Listen names every
	// interface, this host's first non-loopback IPv4 address, else
	// 127.0.0.1). Peers on other hosts reach a worker only when this (or
	// Listen) names an interface they can reach.
	Advertise string
	// Conns bounds the connections to each peer (default 4): operations on
	// one peer run in parallel, one per connection.
	Conns int
	// NoSameHost turns off the same-host path (default: on, unless
	// KVBM_SAME_HOST=0): a peer on this host otherwise connects over a Unix
	// socket and maps the shared memory of host layouts (samehost_*.go).
	NoSameHost bool
	// MaxConns bounds the connections the server holds once their hello
	// passed (default DefaultMaxConns); one more is closed then.
	MaxConns int
	// MaxConnsPerAddr bounds the server's TCP connections from one remote
	// IP address once their hello passed (default DefaultMaxConnsPerAddr);
	// one more is closed then.
	MaxConnsPerAddr int
	// MaxPendingConns bounds the connections the server holds that have
	// not passed the hello (default DefaultMaxPendingConns); one more
	// takes the place of one of them, the oldest of the address holding
	// the most, which is closed (admission.go).
	MaxPendingConns int
	// MaxPendingConnsPerAddr bounds the server's TCP connections from one
	// remote IP address that have not passed the hello (default
	// DefaultMaxPendingConnsPerAddr); one more is closed at accept.
	MaxPendingConnsPerAddr int
	// HelloDeadline is the time a connection has, once accepted, to pass
	// the TLS handshake, where there is one, and the hello (default
	// DefaultHelloDeadline); one that does not is closed. Its requests have
	// the manager's remote deadline.
	HelloDeadline time.Duration
	// TLS names the PEM files that make every TCP connection TLS 1.3 with
	// certificates both ways (tls.go); when all three are empty, they are
	// KVBM_TLS_CERT, KVBM_TLS_KEY and KVBM_TLS_CA, unless NoTLS.
	TLS TLSFiles
	// NoTLS keeps plain TCP whatever the environment says.
	NoTLS bool
	// AuthKey is the deployment key (default AuthKeyFromEnv:
	// KVBM_AUTH_KEY, KVBM_AUTH_KEY_FILE): when set, every hello's proofs
	// are made under it and the capability's key together, so that only
	// workers with the same key connect (authkey.go).
	AuthKey []byte
}

// Transport is the transport that always works: plain TCP streams, several per
// peer, each moving one request at a time straight between the socket and
// registered memory. It serves one manager.
type Transport struct {
	cfg  Config
	m    *transfer.Manager
	ln   net.Listener
	unix net.Listener // the same-host socket; nil when off
	ep   tcpEndpoint  // set when listening (key zero: the scope is chosen at Endpoint)
	// keyRW and keyRO are the fixed scopes' keys, derived from the secret
	// drawn when the transport starts listening; verifier checks hellos
	// against the keys derived from it (package capability).
	keyRW, keyRO  capability.Key
	secret        capability.Secret // block scopes' keys are derived from it (ScopedEndpoint)
	verifier      *capability.Verifier
	refusedHellos atomic.Uint64          // connections refused at the hello
	refusedScope  atomic.Uint64          // requests refused for being outside their block scope
	revoked       capability.Revocations // block scopes' blocks that changed owner (RevokeBlocks)
	// authKey is Config.AuthKey, or the environment's (authErr: why that
	// could not be read, returned by Serve and Connect).
	authKey capability.Deployment
	authErr error

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{} // server side
	peers  map[*tcpPeer]struct{}
	wg     sync.WaitGroup
	stop   chan struct{} // closed by Close
	lim    limits        // limits.go
	tls    *tlsSide      // nil: plain TCP (tls.go)
	tlsErr error         // the TLS configuration's, returned by Serve and Connect

	served atomic.Uint64 // requests of peers answered, however they ended
}

// New makes a TCP transport; Serve starts its server. A TLS configuration
// that does not load (tls.go) is Serve's and Connect's error.
func New(cfg Config) *Transport {
	if cfg.Listen == "" {
		cfg.Listen = os.Getenv("KVBM_TCP_LISTEN")
	}
	if cfg.Advertise == "" {
		cfg.Advertise = os.Getenv("KVBM_TCP_ADVERTISE")
	}
	if cfg.Conns <= 0 {
		cfg.Conns = 4
	}
	if os.Getenv("KVBM_SAME_HOST") == "0" {
		cfg.NoSameHost = true
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxConnsPerAddr <= 0 {
		cfg.MaxConnsPerAddr = DefaultMaxConnsPerAddr
	}
	if cfg.MaxPendingConns <= 0 {
		cfg.MaxPendingConns = DefaultMaxPendingConns
	}
	if cfg.MaxPendingConnsPerAddr <= 0 {
		cfg.MaxPendingConnsPerAddr = DefaultMaxPendingConnsPerAddr
	}
	if cfg.HelloDeadline <= 0 {
		cfg.HelloDeadline = DefaultHelloDeadline
	}
	if cfg.TLS == (TLSFiles{}) && !cfg.NoTLS {
		cfg.TLS = tlsFilesFromEnv()
	}
	t := &Transport{cfg: cfg, conns: map[net.Conn]struct{}{}, peers: map[*tcpPeer]struct{}{}, stop: make(chan struct{})}
	authKey := cfg.AuthKey
	if authKey == nil {
		authKey, t.authErr = AuthKeyFromEnv()
	}
	t.authKey = capability.NewDeployment(authKey)
	if !cfg.NoTLS {
		t.tls, t.tlsErr = loadTLS(cfg.TLS)
	}
	return t
}

// Name is "tcp".
func (t *Transport) Name() string { return "tcp" }

// Addr is the address the server listens on (nil while it listens on
// nothing: before Serve, and before the first Endpoint unless Listen is
// set).
func (t *Transport) Addr() net.Addr {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ln == nil {
		return nil
	}
	return t.ln.Addr()
}

// Serve serves m's layouts to peers: at once when Config.Listen is set,
// else from the first Endpoint.
func (t *Transport) Serve(m *transfer.Manager) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m != nil {
		return fmt.Errorf("%w: tcp transport already serves worker %x", kvbmerr.ErrAlreadyExists, t.m.WorkerID())
	}
	if t.closed {
		return fmt.Errorf("%w: tcp transport closed", transfer.ErrClosed)
	}
	if err := errors.Join(t.tlsErr, t.authErr); err != nil {
		return err
	}
	t.m = m
	if t.cfg.Listen != "" {
		if err := t.listen(); err != nil {
			t.m = nil
			return err
		}
	}
	return nil
}

// listen opens the listeners (t.mu held).
func (t *Transport) listen() error {
	addr := t.cfg.Listen
	if addr == "" {
		host := t.cfg.Advertise
		if host == "" {
			host = "127.0.0.1"
		}
		addr = net.JoinHostPort(host, "0")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("tcp transport: listen on %q: %w", addr, err)
	}
	if listenWrap != nil {
		ln = listenWrap(ln)
	}
	host, err := advertiseHost(t.cfg.Advertise, ln.Addr().(*net.TCPAddr))
	if err != nil {
		ln.Close()
		return err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	secret, err := capability.NewSecret()
	if err != nil {
		ln.Close()
		return err
	}
	t.secret, t.keyRW, t.keyRO = secret, secret.ReadWrite(), secret.ReadOnly()
	t.verifier = capability.NewVerifier(secret, t.authKey)
	ep := tcpEndpoint{worker: t.m.WorkerID(), addr: net.JoinHostPort(host, fmt.Sprint(port))}
	if t.tls != nil {
		ep.flags |= flagTLS
	}
	if !t.cfg.NoSameHost {
		if ep.host, ep.unix, t.unix = listenSameHost(t.m.WorkerID()); t.unix == nil {
			ep.host = [16]byte{}
		}
	}
	t.ln, t.ep = ln, ep
	t.wg.Add(1)
	go t.accept(ln)
	if t.unix != nil {
		t.wg.Add(1)
		go t.accept(t.unix)
	}
	return nil
}

// Endpoint is version u8 (3) | worker u64 | scope u8 | key [32] |
// (scope 2) descriptor length u16 | descriptor | host id [16] | Unix
// socket name length u8 | name | flags u8 (flagTLS: the server speaks
// TLS, tls.go) | "host:port". The key is the read-write scope's: whoever
// holds the endpoint may read and write the worker's layouts (package
// capability); a
// block scope's endpoint (ScopedEndpoint) carries its descriptor. The host
// id and socket name are zero and
// empty when the same-host path is off. The first call listens, unless
// Serve did.
func (t *Transport) Endpoint() ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return nil, fmt.Errorf("%w: tcp transport closed", transfer.ErrClosed)
	case t.m == nil:
		return nil, fmt.Errorf("%w: tcp transport is not serving", kvbmerr.ErrInvalidArgument)
	case t.ln == nil:
		if err := t.listen(); err != nil {
			return nil, err
		}
	}
	ep := t.ep
	ep.scope, ep.key = capability.ScopeReadWrite, t.keyRW
	return ep.append(nil), nil
}

// ReadOnlyEndpoint is Endpoint with the read-only scope's key: its holder
// reads the layouts and cannot write them, nor map them (same host).
func (t *Transport) ReadOnlyEndpoint() ([]byte, error) {
	if _, err := t.Endpoint(); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ep := t.ep
	ep.scope, ep.key = capability.ScopeReadOnly, t.keyRO
	return ep.append(nil), nil
}

const endpointVersion = 3 // 3: the scope and its key

type tcpEndpoint struct {
	worker uint64
	scope  capability.Scope
	key    capability.Key // the scope's key: the capability
	desc   []byte         // ScopeBlocks: the scope's descriptor (capability.BlockScope)
	host   [16]byte       // the boot id of the server's host
	unix   string         // its same-host socket (abstract, "@...")
	flags  byte           // flagTLS
	addr   string         // host:port
}

func (e tcpEndpoint) append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(append(b, endpointVersion), e.worker)
	b = e.key.AppendTo(append(b, byte(e.scope)))
	if e.scope == capability.ScopeBlocks {
		b = append(binary.LittleEndian.AppendUint16(b, uint16(len(e.desc))), e.desc...)
	}
	b = append(append(b, e.host[:]...), byte(len(e.unix)))
	return append(append(append(b, e.unix...), e.flags), e.addr...)
}

func parseTCPEndpoint(ep []byte) (tcpEndpoint, error) {
	if len(ep) > 0 && ep[0] != endpointVersion {
		return tcpEndpoint{}, fmt.Errorf("%w: tcp endpoint version %d, this library reads version %d (metadata of an older kvbm: both instances must run the same kvbm)",
			remote.ErrBadEndpoint, ep[0], endpointVersion)
	}
	const keyLen = capability.KeyLen
	const head = 1 + 8 + 1 + keyLen + 16 + 1
	if len(ep) < head+3 {
		return tcpEndpoint{}, fmt.Errorf("%w: tcp endpoint of %d bytes, at least %d", remote.ErrBadEndpoint, len(ep), head+3)
	}
	e := tcpEndpoint{worker: binary.LittleEndian.Uint64(ep[1:]), scope: capability.Scope(ep[9])}
	if !e.scope.Valid() {
		return tcpEndpoint{}, fmt.Errorf("%w: tcp endpoint scope %d", remote.ErrBadEndpoint, e.scope)
	}
	e.key = capability.KeyFromRaw32([keyLen]byte(ep[10 : 10+keyLen]))
	if e.scope == capability.ScopeBlocks {
		var err error
		if e.desc, ep, err = cutScope(ep, 10+keyLen); err != nil {
			return tcpEndpoint{}, err
		}
		if len(ep) < head+3 {
			return tcpEndpoint{}, fmt.Errorf("%w: tcp endpoint of %d bytes after its scope, at least %d", remote.ErrBadEndpoint, len(ep), head+3)
		}
	}
	copy(e.host[:], ep[10+keyLen:head-1])
	n := int(ep[head-1])
	if len(ep) < head+n+4 {
		return tcpEndpoint{}, fmt.Errorf("%w: tcp endpoint of %d bytes is too short for its %d-byte socket name", remote.ErrBadEndpoint, len(ep), n)
	}
	e.unix, e.flags, e.addr = string(ep[head:head+n]), ep[head+n], string(ep[head+n+1:])
	if e.flags&^flagTLS != 0 {
		return tcpEndpoint{}, fmt.Errorf("%w: tcp endpoint flags %#x, this library knows %#x (another kvbm version)", remote.ErrBadEndpoint, e.flags, flagTLS)
	}
	if n > 0 && e.unix[0] != '@' {
		return tcpEndpoint{}, fmt.Errorf("%w: tcp endpoint's same-host socket %q is not an abstract name", remote.ErrBadEndpoint, e.unix)
	}
	if _, _, err := net.SplitHostPort(e.addr); err != nil {
		return tcpEndpoint{}, fmt.Errorf("%w: tcp endpoint address %q: %v", remote.ErrBadEndpoint, e.addr, err)
	}
	return e, nil
}

// Connect dials the peer once, to check that it answers as the worker the
// endpoint names, and keeps the connection for its first operation. A peer
// on this host is dialed on its Unix socket when it has one and it can be
// reached (another network namespace cannot), else over TCP.
func (t *Transport) Connect(ctx context.Context, endpoint []byte) (remote.Peer, error) {
	ep, err := parseTCPEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if err := errors.Join(t.tlsErr, t.authErr); err != nil {
		return nil, err
	}
	if err := t.checkTLSMatch(ep); err != nil {
		return nil, err
	}
	var p *tcpPeer
	var c *tcpConn
	if !t.cfg.NoSameHost && ep.unix != "" && ep.host == hostID() && ep.host != [16]byte{} {
		// Any failure here but the deadline's falls back to TCP: the socket
		// may be in another network namespace, or refuse this user.
		p = newTCPPeer(t, ep, "unix", ep.unix)
		if c, err = p.dial(ctx); err != nil && ctx.Err() != nil {
			return nil, err
		}
	}
	if c == nil {
		p = newTCPPeer(t, ep, "tcp", ep.addr)
		if c, err = p.dial(ctx); err != nil {
			return nil, err
		}
	}
	p.put(c)
	var watch *tcpConn
	if ep.scope != capability.ScopeBlocks { // a request's capability lives for one transfer, whose deadline sees a death
		watch, _ = p.dialConn(ctx) // best effort: without it a death is seen at the next operation
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		p.Close() // takes t.mu itself (forget)
		return nil, fmt.Errorf("%w: tcp transport closed", transfer.ErrClosed)
	}
	t.peers[p] = struct{}{}
	if watch != nil {
		t.wg.Add(1)
		go p.watch(watch)
	}
	t.mu.Unlock()
	if ep.scope == capability.ScopeBlocks {
		return remote.NewScopedPeer(p, ep.desc)
	}
	return p, nil
}

// Served is the number of peers' requests the server has answered so far,
// however each ended (a peer that gave up on one still counts): a test
// waits on it to know that a late answer was made.
func (t *Transport) Served() uint64 { return t.served.Load() }

// Close stops the server, closes its connections and every peer, and
// waits for the server's goroutines.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	close(t.stop)
	var err error
	if t.ln != nil {
		err = t.ln.Close()
	}
	if t.unix != nil {
		t.unix.Close()
	}
	for c := range t.conns {
		c.Close()
	}
	peers := t.peers
	t.peers = nil
	t.mu.Unlock()
	for p := range peers {
		p.Close()
	}
	t.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (t *Transport) forget(p *tcpPeer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.peers, p)
}

// advertiseHost picks the host peers dial.
func advertiseHost(configured string, listen *net.TCPAddr) (string, error) {
	if configured != "" {
		return configured, nil
	}
	if !listen.IP.IsUnspecified() {
		return listen.IP.String(), nil
	}
	ifaces, err := net.Interfaces()
	if err == nil {
		for _, ifc := range ifaces {
			if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
				continue
			}
			addrs, _ := ifc.Addrs()
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.IP.IsGlobalUnicast() {
					return ipn.IP.String(), nil
				}
			}
		}
	}
	return "127.0.0.1", nil
}

var _ remote.Transport = (*Transport)(nil)
