package pool

import (
	"encoding/hex"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// Key.String is lowercase hex of the key's bytes, as encoding/hex writes it
// (the pool does without encoding/hex, which imports os).
func TestKeyStringIsHex(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= MaxKeyLen; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		k, err := NewKey(b)
		require.NoError(t, err)
		require.Equal(t, hex.EncodeToString(b), k.String())
	}
	require.Equal(t, "", Key{}.String())
}
