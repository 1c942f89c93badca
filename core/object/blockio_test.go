package object

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMemoryBlocks(t *testing.T) {
	m, err := NewMemoryBlocks(3, 4)
	require.NoError(t, err)
	require.Equal(t, 3, m.NumBlocks())
	require.Equal(t, 4, m.BlockSize())
	require.Len(t, m.Bytes(), 12)

	require.NoError(t, m.WriteBlock(1, []byte{1, 2, 3, 4}))
	require.Equal(t, []byte{0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0}, m.Bytes())
	got := make([]byte, 4)
	require.NoError(t, m.ReadBlock(1, got))
	require.Equal(t, []byte{1, 2, 3, 4}, got)
	require.Equal(t, []byte{1, 2, 3, 4}, m.Block(1))
	require.Nil(t, m.Block(3))
	require.Nil(t, m.Block(-1))

	require.ErrorContains(t, m.ReadBlock(3, got), "block id 3 out of range [0, 3)")
	require.ErrorContains(t, m.WriteBlock(-1, got), "block id -1 out of range")
	require.ErrorContains(t, m.ReadBlock(0, make([]byte, 5)), "buffer is 5 bytes, block size is 4")

	// A block view cannot be appended into its neighbour.
	v := m.Block(0)
	_ = append(v, 9)
	require.Equal(t, byte(1), m.Block(1)[0])
}

func TestNewMemoryBlocksErrors(t *testing.T) {
	_, err := NewMemoryBlocks(-1, 4)
	require.ErrorContains(t, err, "invalid block count -1")
	_, err = NewMemoryBlocks(1, 0)
	require.ErrorContains(t, err, "invalid block size 0")
	_, err = NewMemoryBlocks(1<<40, 1<<40)
	require.ErrorContains(t, err, "overflow")
	m, err := NewMemoryBlocks(0, 8)
	require.NoError(t, err)
	require.Equal(t, 0, m.NumBlocks())
}
