package capability

import (
	"encoding/binary"
	"fmt"
)

// The hello's head, and its fixed part's size (up to the scope's length).
const (
	Magic    = "KVBT"
	Version  = 3 // 2: authenticated hello; 3: its scope descriptor
	HelloLen = 4 + 2 + 8 + NonceLen + ProofLen + 2
)

// Hello is a decoded client hello: its fixed part, then (set by the
// server once it read ScopeLen bytes more) its scope descriptor.
type Hello struct {
	Client   uint64
	CN       []byte
	Proof    []byte
	ScopeLen int
	Scope    []byte // a block scope's descriptor; nil for the others
}

// AppendHello appends a client's hello, proved under k, answering the
// server's nonce t.SN; desc is a block scope's descriptor (nil for the
// other scopes).
func (k HelloKey) AppendHello(b []byte, t Transcript, desc []byte) []byte {
	b = append(b, Magic...)
	b = binary.LittleEndian.AppendUint16(b, Version)
	b = binary.LittleEndian.AppendUint64(b, t.Client)
	b = append(b, t.CN...)
	b = append(b, k.proof(labelClient, t)...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(desc)))
	return append(b, desc...)
}

// ParseHello checks a hello's fixed part: its magic, version and scope
// length. Malformed input returns an error wrapping ErrMalformed and
// never panics.
func ParseHello(b []byte) (Hello, error) {
	if len(b) != HelloLen {
		return Hello{}, fmt.Errorf("%w: hello of %d bytes, want %d", ErrMalformed, len(b), HelloLen)
	}
	if string(b[:4]) != Magic {
		return Hello{}, fmt.Errorf("%w: magic %q, want %q: not a kvbm TCP transport", ErrMalformed, b[:4], Magic)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != Version {
		return Hello{}, fmt.Errorf("%w: wire version %d, this library speaks %d", ErrMalformed, v, Version)
	}
	h := Hello{Client: binary.LittleEndian.Uint64(b[6:]), CN: b[14 : 14+NonceLen], Proof: b[14+NonceLen : 14+NonceLen+ProofLen],
		ScopeLen: int(binary.LittleEndian.Uint16(b[14+NonceLen+ProofLen:]))}
	if h.ScopeLen > MaxScopeLen {
		return Hello{}, fmt.Errorf("%w: hello's scope of %d bytes, at most %d", ErrMalformed, h.ScopeLen, MaxScopeLen)
	}
	return h, nil
}
