package object

import (
	"encoding/hex"
	"fmt"
)

// MaxKeyLen is the longest key a store accepts, in bytes. It fits a SHA-256
// written as hex (SGLang) and leaves a 128-character object name, well under
// the 255-byte file name limit of common filesystems.
const MaxKeyLen = 64

// Key names one block in an object store. It is opaque bytes, 1 to MaxKeyLen
// long: vLLM's block hashes are raw bytes, SGLang's are hex strings, and both
// are used as given. Keys are comparable and immutable; the zero Key is
// invalid.
type Key struct {
	// A string rather than a slice so that a Key is comparable, usable as a
	// map key and cannot be changed through an alias.
	b string
}

// NewKey returns the key made of a copy of b. It fails unless b is 1 to
// MaxKeyLen bytes long.
func NewKey(b []byte) (Key, error) {
	if err := checkKeyLen(len(b)); err != nil {
		return Key{}, err
	}
	return Key{b: string(b)}, nil
}

// ParseKey is the inverse of Key.String: it decodes a key from its lowercase
// or uppercase hex form, as found in an object's name.
func ParseKey(s string) (Key, error) {
	b, err := hex.DecodeString(s)
	if err != nil {
		return Key{}, fmt.Errorf("parse key %q: %w", s, err)
	}
	k, err := NewKey(b)
	if err != nil {
		return Key{}, fmt.Errorf("parse key %q: %w", s, err)
	}
	return k, nil
}

func checkKeyLen(n int) error {
	if n < 1 || n > MaxKeyLen {
		return fmt.Errorf("invalid key length %d: want 1 to %d bytes", n, MaxKeyLen)
	}
	return nil
}

// Bytes returns a copy of the key's bytes.
func (k Key) Bytes() []byte { return []byte(k.b) }

// Len returns the key's length in bytes; 0 for the zero Key.
func (k Key) Len() int { return len(k.b) }

// IsZero reports whether k is the zero Key, which no store accepts.
func (k Key) IsZero() bool { return k.b == "" }

// String returns the key as lowercase hex, the form used in object names.
func (k Key) String() string { return hex.EncodeToString([]byte(k.b)) }

// valid is the check every store applies to each key of a batch, so that a
// zero Key fails its own block instead of naming an object "".
func (k Key) valid() error { return checkKeyLen(len(k.b)) }
