package pool

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClaimTakesThoseFreeBlocksOutOfAllocation(t *testing.T) {
	p, err := New(Config{Blocks: 6, Tier: 3})
	require.NoError(t, err)
	require.NoError(t, p.Claim([]int{4, 1}))
	require.Equal(t, 4, p.Available())
	got, err := p.Allocate(4, nil)
	require.NoError(t, err)
	require.ElementsMatch(t, []int{0, 2, 3, 5}, got)
	_, err = p.Allocate(1, nil)
	require.ErrorIs(t, err, ErrNoSpace)

	k, err := NewKey([]byte("restored"))
	require.NoError(t, err)
	require.NoError(t, p.Register([]Key{k}, []int{4}))
	id, ok := p.Get(k)
	require.True(t, ok)
	require.Equal(t, 4, id)
	require.NoError(t, p.Release([]int{1}))
	require.Equal(t, 2, p.Available()) // block 1 free again, block 4 evictable
}

func TestClaimOfABlockInUseChangesNothing(t *testing.T) {
	p, err := New(Config{Blocks: 4})
	require.NoError(t, err)
	got, err := p.Allocate(1, nil)
	require.NoError(t, err)
	err = p.Claim([]int{2, got[0]})
	require.ErrorIs(t, err, ErrState)
	require.Equal(t, 3, p.Available(), "block 2 is still free")
	require.ErrorIs(t, p.Claim([]int{2, 2}), ErrInvalidArgument)
	require.ErrorIs(t, p.Claim([]int{9}), ErrOutOfRange)
}
