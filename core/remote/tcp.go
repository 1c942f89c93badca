package remote

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"github.com/kvbm/kvbm/core/transfer"
)

// TCPConfig configures the TCP transport.
type TCPConfig struct {
	// Listen is the address the server listens on (default
	// KVBM_TCP_LISTEN, else ":0": every interface, a free port).
	Listen string
	// Advertise is the host peers dial (default KVBM_TCP_ADVERTISE, else
	// the listen host when it names one, else this host's first
	// non-loopback IPv4 address, else 127.0.0.1).
	Advertise string
	// Conns bounds the connections to each peer (default 4): operations on
	// one peer run in parallel, one per connection.
	Conns int
}

// TCP is the transport that always works: plain TCP streams, several per
// peer, each moving one request at a time straight between the socket and
// registered memory. It serves one manager.
type TCP struct {
	cfg TCPConfig
	m   *transfer.Manager
	ln  net.Listener
	ep  []byte

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{} // server side
	peers  map[*tcpPeer]struct{}
	wg     sync.WaitGroup
}

// NewTCP makes a TCP transport; Serve starts its server.
func NewTCP(cfg TCPConfig) *TCP {
	if cfg.Listen == "" {
		cfg.Listen = os.Getenv("KVBM_TCP_LISTEN")
	}
	if cfg.Listen == "" {
		cfg.Listen = ":0"
	}
	if cfg.Advertise == "" {
		cfg.Advertise = os.Getenv("KVBM_TCP_ADVERTISE")
	}
	if cfg.Conns <= 0 {
		cfg.Conns = 4
	}
	return &TCP{cfg: cfg, conns: map[net.Conn]struct{}{}, peers: map[*tcpPeer]struct{}{}}
}

// Name is "tcp".
func (t *TCP) Name() string { return "tcp" }

// Addr is the address the server listens on (nil before Serve).
func (t *TCP) Addr() net.Addr {
	if t.ln == nil {
		return nil
	}
	return t.ln.Addr()
}

// Serve listens and serves m's layouts to peers.
func (t *TCP) Serve(m *transfer.Manager) error {
	if t.m != nil {
		return fmt.Errorf("%w: tcp transport already serves worker %x", transfer.ErrAlreadyExists, t.m.WorkerID())
	}
	ln, err := net.Listen("tcp", t.cfg.Listen)
	if err != nil {
		return fmt.Errorf("tcp transport: listen on %q: %w", t.cfg.Listen, err)
	}
	host, err := advertiseHost(t.cfg.Advertise, ln.Addr().(*net.TCPAddr))
	if err != nil {
		ln.Close()
		return err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	t.m, t.ln = m, ln
	t.ep = binary.LittleEndian.AppendUint64([]byte{wireVersion}, m.WorkerID())
	t.ep = append(t.ep, net.JoinHostPort(host, fmt.Sprint(port))...)
	t.wg.Add(1)
	go t.accept()
	return nil
}

// Endpoint is version u8 | worker u64 | "host:port".
func (t *TCP) Endpoint() ([]byte, error) {
	if t.ep == nil {
		return nil, fmt.Errorf("%w: tcp transport is not serving", transfer.ErrInvalidArgument)
	}
	return t.ep, nil
}

func parseTCPEndpoint(ep []byte) (worker uint64, addr string, err error) {
	if len(ep) < 1+8+3 || ep[0] != wireVersion {
		return 0, "", fmt.Errorf("%w: tcp endpoint of %d bytes is not version %d", ErrBadEndpoint, len(ep), wireVersion)
	}
	addr = string(ep[9:])
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return 0, "", fmt.Errorf("%w: tcp endpoint address %q: %v", ErrBadEndpoint, addr, err)
	}
	return binary.LittleEndian.Uint64(ep[1:]), addr, nil
}

// Connect dials the peer once, to check that it answers as the worker the
// endpoint names, and keeps the connection for its first operation.
func (t *TCP) Connect(ctx context.Context, endpoint []byte) (Peer, error) {
	worker, addr, err := parseTCPEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	p := newTCPPeer(t, worker, addr)
	c, err := p.dial(ctx)
	if err != nil {
		return nil, err
	}
	p.put(c)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		p.Close()
		return nil, fmt.Errorf("%w: tcp transport closed", transfer.ErrClosed)
	}
	t.peers[p] = struct{}{}
	return p, nil
}

// Close stops the server, closes its connections and every peer, and
// waits for the server's goroutines.
func (t *TCP) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	var err error
	if t.ln != nil {
		err = t.ln.Close()
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

func (t *TCP) forget(p *tcpPeer) {
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

var _ Transport = (*TCP)(nil)
