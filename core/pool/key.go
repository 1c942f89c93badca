package pool

import (
	"strconv"

	"github.com/kvbm/kvbm/kvbmerr"
)

// MaxKeyLen is the longest key, in bytes: a SHA-256 written as hex
// (SGLang's page keys), twice the raw SHA-256 vLLM uses.
const MaxKeyLen = 64

// Key names the KV of one full block given its whole prefix (a sequence
// hash). It is opaque bytes, 1 to MaxKeyLen long, held by value so that a
// pool keeps keys without allocating and a Key is comparable; the zero Key
// is invalid.
type Key struct {
	n uint8
	b [MaxKeyLen]byte
}

// NewKey returns the key made of a copy of b, or an error unless b is 1 to
// MaxKeyLen bytes long.
func NewKey(b []byte) (Key, error) { return keyOf(b) }

// KeyOf is NewKey over a string's bytes (SGLang's hex keys are strings).
func KeyOf(s string) (Key, error) { return keyOf(s) }

func keyOf[T string | []byte](b T) (Key, error) {
	if len(b) < 1 || len(b) > MaxKeyLen {
		return Key{}, kvbmerr.Detail(ErrInvalidArgument, "key is "+strconv.Itoa(len(b))+" bytes, want 1 to "+strconv.Itoa(MaxKeyLen))
	}
	var k Key
	k.n = uint8(len(b))
	copy(k.b[:], b)
	return k, nil
}

// Keys converts byte strings to keys; the error names the first bad index.
func Keys(bs [][]byte) ([]Key, error) {
	ks := make([]Key, len(bs))
	for i, b := range bs {
		k, err := NewKey(b)
		if err != nil {
			return nil, kvbmerr.Context("keys["+strconv.Itoa(i)+"]", err)
		}
		ks[i] = k
	}
	return ks, nil
}

// Bytes returns a copy of the key's bytes.
func (k Key) Bytes() []byte { return append([]byte(nil), k.b[:k.n]...) }

// Len is the key's length in bytes; 0 for the zero Key.
func (k Key) Len() int { return int(k.n) }

// IsZero reports whether k is the zero Key, which no pool accepts.
func (k Key) IsZero() bool { return k.n == 0 }

// String is the key as lowercase hex.
func (k Key) String() string {
	const digits = "0123456789abcdef"
	var s [2 * MaxKeyLen]byte
	for i, c := range k.b[:k.n] {
		s[2*i], s[2*i+1] = digits[c>>4], digits[c&0xf]
	}
	return string(s[:2*k.n])
}

// equal compares the key's bytes only, not the unused tail of the array.
func (k *Key) equal(o *Key) bool {
	return k.n == o.n && string(k.b[:k.n]) == string(o.b[:o.n])
}
