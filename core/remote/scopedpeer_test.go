package remote

import (
	"context"
	"sync"
	"testing"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/kvbmerr"
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

// readsMember is a ScopeMember that records the ops of each read.
type readsMember struct {
	ScopeMember
	name   string
	broken error
	mu     *sync.Mutex
	reads  *[]string
}

func (m readsMember) Broken() error { return m.broken }

func (m readsMember) Worker() uint64 { return 0xE1 }

func (m readsMember) Read(_ context.Context, _ transfer.LayoutHandle, ops []transfer.RemoteOp) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, o := range ops {
		*m.reads = append(*m.reads, m.name+":"+string(rune('0'+o.Remote/blockBytes)))
	}
	*m.reads = append(*m.reads, "|")
	return nil
}

const blockBytes = 1024

// A read of blocks of more than one request goes through each request's
// member for its blocks, in runs; one covered by a single member goes in
// one read through the newest that is not broken; one with a block no
// member covers reads nothing.
func TestScopedPeerReadsEachRequestsBlocksThroughItsScope(t *testing.T) {
	h := transfer.LayoutHandle{Worker: 0xE1, Layout: 3}
	cfg := layout.Config{NumBlocks: 8, NumLayers: 1, OuterDim: 1, PageSize: 1, InnerDim: blockBytes, DtypeWidth: 1}
	l, err := layout.New(cfg, layout.FullyContiguous, 0, []uint64{0})
	require.NoError(t, err)
	var mu sync.Mutex
	var reads []string
	member := func(name string, first, count uint64, broken error) *ScopedPeer {
		return &ScopedPeer{
			own:   readsMember{name: name, broken: broken, mu: &mu, reads: &reads},
			scope: capability.BlockScope{Layouts: []capability.LayoutRanges{{Layout: h.Layout, Ranges: capability.Ranges{{First: first, Count: count}}}}},
		}
	}
	s := member("a", 0, 4, nil)
	s.members = []*ScopedPeer{s, member("b", 4, 3, nil), member("b2", 4, 3, kvbmerr.ErrIO)}
	s.layouts = map[transfer.LayoutHandle]*layout.Layout{h: l}
	op := func(block uint64) transfer.RemoteOp {
		return transfer.RemoteOp{Remote: block * blockBytes, Size: blockBytes}
	}
	for _, c := range []struct {
		name   string
		blocks []uint64
		want   []string
	}{
		{"one request's", []uint64{1, 2, 3}, []string{"a:1", "a:2", "a:3", "|"}},
		{"the newest that is not broken", []uint64{4, 5}, []string{"b:4", "b:5", "|"}},
		{"two requests', in runs", []uint64{2, 3, 4, 5, 0, 6}, []string{"a:2", "a:3", "|", "b:4", "b:5", "|", "a:0", "|", "b:6", "|"}},
		{"a block of none", []uint64{3, 7}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			reads = nil
			ops := make([]transfer.RemoteOp, len(c.blocks))
			for i, b := range c.blocks {
				ops[i] = op(b)
			}
			err := s.Read(context.Background(), h, ops)
			if c.want == nil {
				require.ErrorIs(t, err, kvbmerr.ErrUnsupported)
				require.ErrorContains(t, err, "no request-scoped capability")
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, c.want, reads)
		})
	}
}
