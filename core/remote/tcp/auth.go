package tcp

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"

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
//	                    nonce cn [32] | HMAC(key, "kvbm-tcp client" | sn | cn | server worker u64 | client worker u64) |
//	                    scope length u16 | scope descriptor (a block scope's, scope.go; none for the others)
//	server → proof:     HMAC(key, "kvbm-tcp server" | sn | cn | server worker u64 | client worker u64)
//
// The key is the scope's (with a deployment key, derived from both:
// helloKey, authkey.go). A block scope's key is HMAC(secret, descriptor),
// so the server keeps nothing per export: the descriptor the hello
// carries is the one whose key proved it.
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
	scopeBlocks    byte = 2 // read only, some blocks of some layouts (scope.go)
)

// scopeKeys derives the read-write and read-only scopes' keys from the
// secret.
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
// The hello's key is made under; desc is a block scope's descriptor (nil
// for the other scopes).
func appendHello(b []byte, key []byte, sn, cn []byte, server, client uint64, desc []byte) []byte {
	b = append(b, wireMagic...)
	b = binary.LittleEndian.AppendUint16(b, wireVersion)
	b = binary.LittleEndian.AppendUint64(b, client)
	b = append(b, cn...)
	b = append(b, proof(key, clientLabel, sn, cn, server, client)...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(desc)))
	return append(b, desc...)
}

// hello is a decoded client hello (its fixed part: the scope descriptor,
// scopeLen bytes of it, follows).
type hello struct {
	client   uint64
	cn       []byte
	proof    []byte
	scopeLen int
}

// parseHello checks a hello's magic, version and scope length.
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
	h := hello{client: binary.LittleEndian.Uint64(b[6:]), cn: b[14 : 14+nonceLen], proof: b[14+nonceLen : 14+nonceLen+proofLen],
		scopeLen: int(binary.LittleEndian.Uint16(b[14+nonceLen+proofLen:]))}
	if h.scopeLen > maxScopeLen {
		return hello{}, fmt.Errorf("%w: hello's scope of %d bytes, at most %d", remote.ErrBadEndpoint, h.scopeLen, maxScopeLen)
	}
	return h, nil
}

// grant is what a connection's hello proved: a scope, and for a block
// scope its descriptor.
type grant struct {
	scope  byte
	blocks *blockScope // scopeBlocks only
}

// verify finds the scope whose key made the hello's proof; why says, for
// the server's log, why none did. Both fixed scopes' keys are always
// tried, each compared in constant time; a block scope's descriptor names
// its key.
func (t *Transport) verify(h hello, desc, sn []byte) (g grant, key []byte, why string) {
	server := t.m.WorkerID()
	matches := func(k []byte) bool { return hmac.Equal(proof(k, clientLabel, sn, h.cn, server, h.client), h.proof) }
	if len(desc) > 0 {
		bs, err := parseScope(desc)
		if err != nil {
			return grant{}, nil, err.Error()
		}
		capKey := blockScopeKey(t.secret, desc)
		if key = helloKey(t.authKey, capKey[:]); !matches(key) {
			return grant{}, nil, t.whyNot(matches, capKey[:])
		}
		if bs.expired(time.Now()) {
			return grant{}, nil, "the hello's block-scoped capability expired"
		}
		return grant{scope: scopeBlocks, blocks: &bs}, key, ""
	}
	okRW, okRO := matches(t.helloRW), matches(t.helloRO)
	switch {
	case okRW:
		return grant{scope: scopeReadWrite}, t.helloRW, ""
	case okRO:
		return grant{scope: scopeReadOnly}, t.helloRO, ""
	}
	return grant{}, nil, t.whyNot(matches, t.keyRW[:], t.keyRO[:])
}

// whyNot says why a hello's proof did not verify, for the server's log
// only (the client is told nothing): with a deployment key, a proof made
// under a capability's key alone is a client without KVBM_AUTH_KEY.
func (t *Transport) whyNot(matches func([]byte) bool, capKeys ...[]byte) string {
	if t.authKey != nil {
		for _, k := range capKeys {
			if matches(k) {
				return "the client holds this worker's metadata but no " + EnvAuthKey + " (this worker has one): not of this deployment"
			}
		}
		return "the hello's proof does not verify: not this worker's current metadata (stale, another worker's, tampered, or replayed), or another " + EnvAuthKey
	}
	return "the hello's proof does not verify: not this worker's current metadata (stale, another worker's, tampered, or replayed), or the client has " +
		EnvAuthKey + " set and this worker has not"
}

// answerIn answers a request the scope allows, and refuses, keeping the
// connection, one it does not: a read-only peer may read, not write nor
// map (a mapping could be written).
func (t *Transport) answerIn(g grant, c net.Conn, r io.Reader, q request) error {
	if g.scope == scopeBlocks {
		if err := t.inScope(g.blocks, c, q); err != nil {
			return t.refuseRequest(c, r, q, err)
		}
		return t.answer(c, r, q)
	}
	if g.scope == scopeReadWrite || q.op == opRead {
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
