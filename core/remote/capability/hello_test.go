package capability

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/kvbmerr"
)

// zeroHello is a hello under the zero key, client 2 answering server 1.
func zeroHello(desc []byte) []byte {
	t := Transcript{SN: make([]byte, NonceLen), CN: make([]byte, NonceLen), Server: 1, Client: 2}
	return Key{}.HelloKey(Deployment{}).AppendHello(nil, t, desc)
}

// FuzzParseHello: a hello comes from whoever reaches the port.
func FuzzParseHello(f *testing.F) {
	f.Add(zeroHello(nil))
	f.Add(zeroHello([]byte{ScopeVersion}))
	f.Add([]byte("KVBT"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHello(b)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			require.ErrorIs(t, err, kvbmerr.ErrInvalidArgument)
			return
		}
		require.Len(t, h.CN, NonceLen)
		require.Len(t, h.Proof, ProofLen)
	})
}

// A hello of another protocol, or a truncated one, is refused with the
// reason.
func TestTheHelloIsChecked(t *testing.T) {
	_, err := ParseHello(append([]byte("KVBX"), make([]byte, HelloLen-4)...))
	require.ErrorContains(t, err, "not a kvbm TCP transport")
	_, err = ParseHello(HelloKey{}.AppendHello(nil, Transcript{CN: make([]byte, NonceLen), Server: 1, Client: 2}, nil)[:5])
	require.ErrorIs(t, err, ErrMalformed)
	_, err = ParseHello(zeroHello(nil)[:HelloLen-1])
	require.ErrorContains(t, err, "bad transport endpoint: hello of 79 bytes, want 80", "reads as remote.ErrBadEndpoint's")
	long := zeroHello(nil)
	binary.LittleEndian.PutUint16(long[HelloLen-2:], MaxScopeLen+1)
	_, err = ParseHello(long)
	require.ErrorContains(t, err, "at most 32768")
}

// The hello's bytes and both proofs are those of the wire format, byte
// for byte: magic, version, client, nonce, the client's MAC, the scope's
// length and descriptor; each MAC over its label, both nonces and both
// workers.
func TestTheHelloOnTheWire(t *testing.T) {
	key := KeyFromRaw32([KeyLen]byte{1, 2, 3})
	sn, cn := make([]byte, NonceLen), make([]byte, NonceLen)
	sn[0], cn[31] = 0xAA, 0xBB
	tr := Transcript{SN: sn, CN: cn, Server: 0xE1, Client: 0x11}
	mac := func(label string) []byte {
		m := hmac.New(sha256.New, key.k[:])
		m.Write([]byte(label))
		m.Write(sn)
		m.Write(cn)
		m.Write([]byte{0xE1, 0, 0, 0, 0, 0, 0, 0, 0x11, 0, 0, 0, 0, 0, 0, 0})
		return m.Sum(nil)
	}
	desc := []byte{ScopeVersion, 9, 9}
	want := append([]byte("KVBT\x03\x00\x11\x00\x00\x00\x00\x00\x00\x00"), cn...)
	want = append(append(want, mac("kvbm-tcp client")...), 3, 0)
	want = append(want, desc...)
	hk := key.HelloKey(Deployment{})
	got := hk.AppendHello(nil, tr, desc)
	require.Equal(t, want, got)
	require.Equal(t, mac("kvbm-tcp server"), hk.ServerProof(tr))
	require.True(t, hk.CheckServerProof(tr, mac("kvbm-tcp server")))
	require.False(t, hk.CheckServerProof(tr, mac("kvbm-tcp client")))

	h, err := ParseHello(got[:HelloLen])
	require.NoError(t, err)
	require.Equal(t, Hello{Client: 0x11, CN: cn, Proof: mac("kvbm-tcp client"), ScopeLen: 3}, h)
	require.True(t, hk.checkClientProof(tr, h.Proof))
}
