package capability

import (
	"crypto/subtle"
	"fmt"
)

// KeyLen is the size of a scope's key.
const KeyLen = 32

// Key is a scope's key, derived from the server's secret (secret.go):
// what an endpoint carries, and so the capability itself. Whoever holds
// it may do what its scope allows.
type Key struct {
	_ incomparable
	k [KeyLen]byte
}

// KeyFromRaw32 is the key whose bytes are raw (an endpoint's).
func KeyFromRaw32(raw [KeyLen]byte) Key { return Key{k: raw} }

// AppendTo appends the key's bytes to b: for an endpoint, the one place
// they are written out.
func (k Key) AppendTo(b []byte) []byte { return append(b, k.k[:]...) }

// Equal compares two keys in constant time.
func (k Key) Equal(o Key) bool { return subtle.ConstantTimeCompare(k.k[:], o.k[:]) == 1 }

// MarshalText refuses: a key goes into an endpoint through AppendTo only.
func (Key) MarshalText() ([]byte, error) { return nil, errMarshal }

// Format prints the key redacted.
func (Key) Format(f fmt.State, _ rune) { redact(f, "Key") }
