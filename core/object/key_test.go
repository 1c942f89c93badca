package object

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNewKeyLengths(t *testing.T) {
	for _, n := range []int{1, 32, MaxKeyLen} {
		b := bytes.Repeat([]byte{0xab}, n)
		k, err := NewKey(b)
		require.NoError(t, err, "length %d", n)
		require.Equal(t, n, k.Len())
		require.Equal(t, b, k.Bytes())
		require.Equal(t, strings.Repeat("ab", n), k.String())
	}
	for _, n := range []int{0, MaxKeyLen + 1} {
		_, err := NewKey(make([]byte, n))
		require.Error(t, err, "length %d", n)
		require.Contains(t, err.Error(), "invalid key length "+strconv.Itoa(n))
	}
	require.True(t, Key{}.IsZero())
}

func TestNewKeyCopies(t *testing.T) {
	b := []byte("abc")
	k, err := NewKey(b)
	require.NoError(t, err)
	b[0] = 'x'
	require.Equal(t, []byte("abc"), k.Bytes())
	k.Bytes()[1] = 'y'
	require.Equal(t, []byte("abc"), k.Bytes())
}

func TestParseKey(t *testing.T) {
	// SGLang hands over hex strings; they are keys as they are.
	k, err := NewKey([]byte("0f3a"))
	require.NoError(t, err)
	back, err := ParseKey(k.String())
	require.NoError(t, err)
	require.Equal(t, k, back)

	back, err = ParseKey("0A0b")
	require.NoError(t, err)
	require.Equal(t, []byte{0x0a, 0x0b}, back.Bytes())

	_, err = ParseKey("xyz")
	require.ErrorContains(t, err, `parse key "xyz"`)
	_, err = ParseKey("")
	require.ErrorContains(t, err, "invalid key length 0")
	_, err = ParseKey(strings.Repeat("00", MaxKeyLen+1))
	require.ErrorContains(t, err, "invalid key length 65")
}
