package capability

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
)

// Secret is what a serving transport draws from the OS when it starts
// listening: every scope's key is derived from it, so that it keeps
// nothing per export and a restart revokes every key it gave.
type Secret struct {
	_ incomparable
	k [32]byte
}

// NewSecret draws a secret from the OS.
func NewSecret() (Secret, error) {
	var s Secret
	if _, err := rand.Read(s.k[:]); err != nil {
		return Secret{}, fmt.Errorf("tcp transport: draw a secret: %w", err)
	}
	return s, nil
}

// The labels of the scopes' keys.
const (
	labelReadWrite = "kvbm-tcp read-write"
	labelReadOnly  = "kvbm-tcp read-only"
	labelBlocks    = "kvbm-tcp block scope"
)

// ReadWrite is the read-write scope's key.
func (s Secret) ReadWrite() Key { return s.derive(labelReadWrite, nil) }

// ReadOnly is the read-only scope's key.
func (s Secret) ReadOnly() Key { return s.derive(labelReadOnly, nil) }

// Blocks is the key of the block scope whose descriptor is desc
// (blockscope.go).
func (s Secret) Blocks(desc []byte) Key { return s.derive(labelBlocks, desc) }

// derive is every scope key's derivation: HMAC-SHA256(secret, label | desc).
func (s Secret) derive(label string, desc []byte) (k Key) {
	m := hmac.New(sha256.New, s.k[:])
	m.Write([]byte(label))
	m.Write(desc)
	m.Sum(k.k[:0])
	return k
}

// MarshalText refuses: a secret is not marshalled.
func (Secret) MarshalText() ([]byte, error) { return nil, errMarshal }

// Format prints the secret redacted.
func (Secret) Format(f fmt.State, _ rune) { redact(f, "Secret") }
