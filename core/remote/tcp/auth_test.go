package tcp

import (
	"context"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
)

// routes are the ways a client reaches the pair's exporter: TCP and the
// same-host socket, which authenticate alike.
func routes(t *testing.T, p *tcpPair) (tcpEndpoint, map[string]string) {
	t.Helper()
	ep, err := p.expTCP.Endpoint()
	require.NoError(t, err)
	e, err := parseTCPEndpoint(ep)
	require.NoError(t, err)
	out := map[string]string{"tcp": e.addr}
	if e.unix != "" {
		out["unix"] = e.unix
	}
	return e, out
}

// helloUnder is a client's hello proved under k, with no deployment key.
func helloUnder(k capability.Key, sn, cn []byte, server, client uint64, desc []byte) []byte {
	return k.HelloKey(capability.Deployment{}).AppendHello(nil, capability.Transcript{SN: sn, CN: cn, Server: server, Client: client}, desc)
}

// serverProofUnder is a server's proof under k, with no deployment key.
func serverProofUnder(k capability.Key, sn, cn []byte, server, client uint64) []byte {
	return k.HelloKey(capability.Deployment{}).ServerProof(capability.Transcript{SN: sn, CN: cn, Server: server, Client: client})
}

// readAll reads what the server sends until it closes.
func readAll(t *testing.T, c net.Conn) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the server did not close the connection")
	}
	return b
}

// settledServed is tr.Served once the server has counted every request it
// answered so far: it counts just after each answer, so a client (the pair's
// own set-up) may be done before its last request counts.
func settledServed(t *testing.T, tr *Transport) uint64 {
	t.Helper()
	last := tr.Served()
	require.Eventually(t, func() bool {
		time.Sleep(20 * time.Millisecond)
		n := tr.Served()
		same := n == last
		last = n
		return same
	}, 5*time.Second, time.Millisecond)
	return last
}

// A client that has only the port learns nothing but a random challenge
// and moves no byte: its hello, whatever it claims, is closed on, and the
// request it sends after is never read.
func TestAClientWithOnlyThePortLearnsNothingAndMovesNothing(t *testing.T) {
	p := newTCPPair(t, 5*time.Second)
	fill(t, p.exp, p.remote["g2"], 0x42)
	want := block(t, p.exp, p.remote["g2"], 1)
	d, err := p.exp.Describe(p.remote["g2"])
	require.NoError(t, err)
	e, nets := routes(t, p)
	served := settledServed(t, p.expTCP)
	for network, addr := range nets {
		before := p.expTCP.Refused()
		c, err := net.Dial(network, addr)
		require.NoError(t, err)
		sn := make([]byte, capability.NonceLen)
		_, err = io.ReadFull(c, sn)
		require.NoError(t, err, network)
		var guess [capability.KeyLen]byte
		rand.Read(guess[:])
		cn := make([]byte, capability.NonceLen)
		hello := helloUnder(capability.KeyFromRaw32(guess), sn, cn, e.worker, 0, nil)
		// A write of block 1 straight after, as if the hello had passed.
		bs := uint64(p.cfg.BlockSize())
		req := appendRequest(nil, opWrite, p.remote["g2"], []transfer.RemoteOp{{Remote: d.Bases[0] + bs, Size: bs}})
		_, err = c.Write(append(append(hello, req...), make([]byte, bs)...))
		require.NoError(t, err)
		require.Empty(t, readAll(t, c), "%s: nothing after the challenge: no worker id, no reason", network)
		c.Close()
		require.Eventually(t, func() bool { return p.expTCP.Refused() == before+1 }, 5*time.Second, time.Millisecond, "counted")
	}
	require.Equal(t, served, p.expTCP.Served(), "no request was read")
	require.Equal(t, want, block(t, p.exp, p.remote["g2"], 1), "no byte moved")
	// A client that sends nothing, or junk, fares no better.
	c, err := net.Dial("tcp", nets["tcp"])
	require.NoError(t, err)
	c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	c.(*net.TCPConn).CloseWrite()
	require.Len(t, readAll(t, c), capability.NonceLen, "the challenge, then nothing")
	c.Close()
}

// A recorded genuine hello replayed on a new connection is refused: the
// server's challenge is fresh.
func TestAReplayedHelloIsRefused(t *testing.T) {
	p := newTCPPair(t, 5*time.Second)
	e, nets := routes(t, p)
	for network, addr := range nets {
		c, err := net.Dial(network, addr)
		require.NoError(t, err)
		sn := make([]byte, capability.NonceLen)
		_, err = io.ReadFull(c, sn)
		require.NoError(t, err)
		cn := make([]byte, capability.NonceLen)
		rand.Read(cn)
		recorded := helloUnder(e.key, sn, cn, e.worker, 0x11, nil)
		_, err = c.Write(recorded)
		require.NoError(t, err)
		got := make([]byte, capability.ProofLen)
		_, err = io.ReadFull(c, got)
		require.NoError(t, err, "%s: the genuine hello is answered", network)
		require.Equal(t, serverProofUnder(e.key, sn, cn, e.worker, 0x11), got)
		c.Close()

		again, err := net.Dial(network, addr)
		require.NoError(t, err)
		_, err = io.ReadFull(again, make([]byte, capability.NonceLen))
		require.NoError(t, err)
		_, err = again.Write(recorded)
		require.NoError(t, err)
		require.Empty(t, readAll(t, again), "%s: replayed: closed on", network)
		again.Close()
	}
}

// Another worker's metadata (another secret) and a tampered endpoint are
// refused at Connect, and the server says nothing about why.
func TestAnotherWorkersKeyOrATamperedEndpointIsRefused(t *testing.T) {
	p := newTCPPair(t, 5*time.Second)
	q := newTCPPair(t, 5*time.Second) // another exporter, same worker id: its secret differs
	ep, err := p.expTCP.Endpoint()
	require.NoError(t, err)
	other, err := q.expTCP.Endpoint()
	require.NoError(t, err)
	e, err := parseTCPEndpoint(ep)
	require.NoError(t, err)
	o, err := parseTCPEndpoint(other)
	require.NoError(t, err)
	require.NotEqual(t, e.key, o.key, "each transport draws its own secret")

	wrongKey := e
	wrongKey.key = o.key
	tampered := append([]byte(nil), ep...)
	tampered[12] ^= 1 // in the key
	otherWorker := e
	otherWorker.worker++
	for name, bad := range map[string][]byte{"another worker's key": wrongKey.append(nil), "tampered": tampered,
		"another worker id": otherWorker.append(nil)} {
		before := p.expTCP.Refused()
		_, err := p.impTCP.Connect(context.Background(), bad)
		require.ErrorIs(t, err, remote.ErrPeerUnavailable, name)
		require.ErrorContains(t, err, "closed the connection at the hello", name)
		require.Greater(t, p.expTCP.Refused(), before, name)
	}
	peer, err := p.impTCP.Connect(context.Background(), ep)
	require.NoError(t, err, "the genuine metadata still connects")
	require.NoError(t, peer.Close())
}

// The client checks the server's proof: a process that took over the
// address (it does not hold the secret) is not believed.
func TestAServerWithoutTheKeyIsNotBelieved(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sn := make([]byte, capability.NonceLen)
				c.Write(sn)
				b := make([]byte, capability.HelloLen)
				if _, err := io.ReadFull(c, b); err != nil {
					return
				}
				h, _ := capability.ParseHello(b)
				c.Write(serverProofUnder(capability.Key{}, sn, h.CN, 0xE1, h.Client)) // a guessed key
				io.Copy(io.Discard, c)
			}()
		}
	}()
	tr := New(Config{NoSameHost: true})
	defer tr.Close()
	_, err = tr.Connect(context.Background(), tcpEndpoint{worker: 0xE1, key: capability.KeyFromRaw32([capability.KeyLen]byte{1}), addr: ln.Addr().String()}.append(nil))
	require.ErrorIs(t, err, remote.ErrPeerUnavailable)
	require.ErrorContains(t, err, "the peer's proof does not verify")
}

// One connect with its handshake (TCP, no same-host route).
func BenchmarkConnectAndHandshake(b *testing.B) {
	p := newTCPPair(b, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true})
	ep, _ := p.expTCP.Endpoint()
	e, _ := parseTCPEndpoint(ep)
	peer := newTCPPeer(p.impTCP, e, "tcp", e.addr)
	b.ResetTimer()
	for range b.N {
		c, err := peer.dial(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		peer.drop(c)
	}
}

// A read-only capability reads and cannot write, over TCP and on the same
// host (where it is not mapped either: a mapping could be written); the
// connection stays usable after the refusal.
func TestAReadOnlyCapabilityCannotWrite(t *testing.T) {
	for _, sameHost := range []bool{false, true} {
		p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: !sameHost})
		ro, err := p.expTCP.ReadOnlyEndpoint()
		require.NoError(t, err)
		rw, err := p.expTCP.Endpoint()
		require.NoError(t, err)
		require.NotEqual(t, rw, ro)
		peer, err := p.impTCP.Connect(context.Background(), ro)
		require.NoError(t, err)
		require.Equal(t, sameHost, SameHost(peer))
		defer peer.Close()
		for _, name := range []string{"g2", "g1"} {
			d, err := p.exp.Describe(p.remote[name])
			require.NoError(t, err)
			a, err := peer.Attach(d)
			require.NoError(t, err)
			require.False(t, Mapped(peer, p.remote[name]), "read-only: not mapped")
			fill(t, p.exp, p.remote[name], 0x24)
			want, want0 := block(t, p.exp, p.remote[name], 2), block(t, p.exp, p.remote[name], 0)
			bs := uint64(p.cfg.BlockSize())
			buf, err := storage.AllocSystem(bs)
			require.NoError(t, err)
			defer buf.Close()
			var op transfer.RemoteOp
			if d.Kind.IsHost() { // block 2 is one range; the device layout's is split by layer
				op = transfer.RemoteOp{Remote: d.Bases[0] + 2*bs, Local: buf.Addr(), Size: bs}
				require.NoError(t, a.Memory.Read(context.Background(), p.remote[name], []transfer.RemoteOp{op}), "%s: reads", name)
				require.Equal(t, want, storage.HostBytes(buf.Addr(), bs))
			} else {
				op = transfer.RemoteOp{Remote: d.Bases[0], Local: buf.Addr(), Size: 64}
				require.NoError(t, a.Memory.Read(context.Background(), p.remote[name], []transfer.RemoteOp{op}), "%s: reads", name)
			}
			err = a.Memory.Write(context.Background(), p.remote[name], []transfer.RemoteOp{op})
			require.ErrorIs(t, err, transfer.ErrUnsupported, name)
			require.ErrorContains(t, err, "read-only capability")
			require.Equal(t, want, block(t, p.exp, p.remote[name], 2), "%s: nothing written", name)
			require.Equal(t, want0, block(t, p.exp, p.remote[name], 0), "%s: nothing written", name)
		}
	}
}
