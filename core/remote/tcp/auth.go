package tcp

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"net"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
)

// Authentication. A serving transport draws a 256-bit secret from the OS
// when it starts listening; its exported endpoint carries a key derived
// from it for one scope (read-write or read-only), so that the metadata is
// the capability. Every connection, TCP or same-host, proves the key both
// ways before a request is read, in one round trip after the connect:
//
//	server → challenge: nonce sn [32]                     (at accept)
//	client → hello:     magic "KVBT" | version u16 | client worker u64 |
//	                    nonce cn [32] | HMAC(key, "kvbm-tcp client" | sn | cn | server worker u64 | client worker u64)
//	server → proof:     HMAC(key, "kvbm-tcp server" | sn | cn | server worker u64 | client worker u64)
//
// The server answers nothing but its nonce to a client that has not
// proved the key: a wrong key, another worker's metadata, a tampered or
// replayed hello (the server's nonce is fresh) are closed on with nothing
// said, the reason going to the server's log. The client checks the
// server's proof in turn, so that a process that took over the address
// is not sent a byte of a write nor believed for a read. The scope is the
// key that verified: a read-only key cannot write (scopeOf).

// keyLen and nonceLen are the sizes of a scope's key and of each nonce.
const (
	keyLen   = 32
	nonceLen = 32
	proofLen = sha256.Size
)

// Scopes: what a key lets a peer do.
const (
	scopeReadWrite byte = 0
	scopeReadOnly  byte = 1
)

// scopeKeys derives each scope's key from the secret.
func scopeKeys(secret [32]byte) (rw, ro [keyLen]byte) {
	for _, s := range []struct {
		label string
		key   *[keyLen]byte
	}{{"kvbm-tcp read-write", &rw}, {"kvbm-tcp read-only", &ro}} {
		m := hmac.New(sha256.New, secret[:])
		m.Write([]byte(s.label))
		copy(s.key[:], m.Sum(nil))
	}
	return rw, ro
}

// newSecret draws a secret from the OS.
func newSecret() ([32]byte, error) {
	var s [32]byte
	if _, err := rand.Read(s[:]); err != nil {
		return s, fmt.Errorf("tcp transport: draw a secret: %w", err)
	}
	return s, nil
}

// proof is one side's MAC over both nonces and both workers.
func proof(key []byte, label string, sn, cn []byte, server, client uint64) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	m.Write(sn)
	m.Write(cn)
	var ids [16]byte
	binary.LittleEndian.PutUint64(ids[:], server)
	binary.LittleEndian.PutUint64(ids[8:], client)
	m.Write(ids[:])
	return m.Sum(nil)
}

const (
	clientLabel = "kvbm-tcp client"
	serverLabel = "kvbm-tcp server"
)

// appendHello is a client's hello, answering the server's nonce sn.
func appendHello(b []byte, key []byte, sn, cn []byte, server, client uint64) []byte {
	b = append(b, wireMagic...)
	b = binary.LittleEndian.AppendUint16(b, wireVersion)
	b = binary.LittleEndian.AppendUint64(b, client)
	b = append(b, cn...)
	return append(b, proof(key, clientLabel, sn, cn, server, client)...)
}

// hello is a decoded client hello.
type hello struct {
	client uint64
	cn     []byte
	proof  []byte
}

// parseHello checks a hello's magic and version.
func parseHello(b []byte) (hello, error) {
	if len(b) != helloLen {
		return hello{}, fmt.Errorf("%w: hello of %d bytes, want %d", remote.ErrBadEndpoint, len(b), helloLen)
	}
	if string(b[:4]) != wireMagic {
		return hello{}, fmt.Errorf("%w: magic %q, want %q: not a kvbm TCP transport", remote.ErrBadEndpoint, b[:4], wireMagic)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != wireVersion {
		return hello{}, fmt.Errorf("%w: wire version %d, this library speaks %d", remote.ErrBadEndpoint, v, wireVersion)
	}
	return hello{client: binary.LittleEndian.Uint64(b[6:]), cn: b[14 : 14+nonceLen], proof: b[14+nonceLen:]}, nil
}

// verify finds the scope whose key made the hello's proof; ok is false
// when neither did. Both keys are always tried, each compared in constant
// time.
func (t *Transport) verify(h hello, sn []byte) (scope byte, key []byte, ok bool) {
	rw := proof(t.keyRW[:], clientLabel, sn, h.cn, t.m.WorkerID(), h.client)
	ro := proof(t.keyRO[:], clientLabel, sn, h.cn, t.m.WorkerID(), h.client)
	okRW, okRO := hmac.Equal(rw, h.proof), hmac.Equal(ro, h.proof)
	switch {
	case okRW:
		return scopeReadWrite, t.keyRW[:], true
	case okRO:
		return scopeReadOnly, t.keyRO[:], true
	}
	return 0, nil, false
}

// answerIn answers a request the scope allows, and refuses, keeping the
// connection, one it does not: a read-only peer may read, not write nor
// map (a mapping could be written).
func (t *Transport) answerIn(scope byte, c net.Conn, r io.Reader, q request) error {
	if scope == scopeReadWrite || q.op == opRead {
		return t.answer(c, r, q)
	}
	if q.op == opWrite { // its bytes are on the wire
		if _, err := io.CopyN(io.Discard, r, int64(q.bytes)); err != nil {
			return err
		}
	}
	err := fmt.Errorf("%w: the peer holds a read-only capability of worker %x: %s is refused (export read-write metadata to let it write)",
		transfer.ErrUnsupported, t.m.WorkerID(), q.op)
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
