package remote

import (
	"testing"

	"github.com/kvbm/kvbm/core/transfer"
	"github.com/stretchr/testify/require"
)

// sizedMember is a ScopeMember that names the size of its reads.
type sizedMember struct {
	ScopeMember
	most uint64
}

func (m sizedMember) OpBytes() uint64 { return m.most }

// A scoped peer's reads are the size its own peer asks for, and of no
// size of its own when that asks for none.
func TestScopedPeerReadsTakeItsPeersSize(t *testing.T) {
	var s transfer.RemoteMemory = &ScopedPeer{own: sizedMember{most: 16 << 20}}
	sizer, ok := s.(transfer.OpSizer)
	require.True(t, ok)
	require.Equal(t, uint64(16<<20), sizer.OpBytes())
	require.Zero(t, (&ScopedPeer{own: struct{ ScopeMember }{}}).OpBytes())
}
