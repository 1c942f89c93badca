//go:build cgo

package ucx

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
)

// regions counts the transport's registrations of layout h.
func (s *side) regions(t *testing.T, h transfer.LayoutHandle) int {
	t.Helper()
	n := 0
	require.NoError(t, s.tr.do(func() error {
		for k := range s.tr.regs {
			if k.h == h {
				n++
			}
		}
		return nil
	}))
	return n
}

// A layout its owner withdrew (its memory goes to another use) is unmapped
// from UCX, and the endpoint exported afterwards no longer lists it; the
// transport's other layouts keep theirs.
func TestWithdrawnLayoutIsUnmapped(t *testing.T) {
	needUCX(t)
	emu := newEmu(t)
	exp := newSide(t, emu, 0xE, Config{OneSided: true}, 10*time.Second)
	cfg := smallConfig(4)
	mem, err := storage.AllocDevice(emu, 0, uint64(cfg.BlockSize()*cfg.NumBlocks))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, mem.Close()) })
	g1, err := exp.m.RegisterExternal(storage.Device, cfg, transfer.FullyContiguous, []uint64{mem.Addr()})
	require.NoError(t, err)
	g2 := exp.alloc(t, storage.Pinned, cfg, transfer.FullyContiguous)
	_, err = exp.tr.Endpoint()
	require.NoError(t, err)
	require.Equal(t, 1, exp.regions(t, g1))
	require.Equal(t, 1, exp.regions(t, g2))

	stale, err := exp.m.Describe(g1) // an Endpoint under way described it already
	require.NoError(t, err)
	require.NoError(t, exp.m.Withdraw(g1, "sleep mode"))
	require.NoError(t, exp.tr.Withdrawn(g1))
	require.Zero(t, exp.regions(t, g1))
	require.Equal(t, 1, exp.regions(t, g2))
	ep, err := exp.tr.Endpoint()
	require.NoError(t, err)
	info, err := decodeEndpoint(ep)
	require.NoError(t, err)
	for _, l := range info.layouts {
		require.NotEqual(t, g1, l.handle, "the withdrawn layout is not exported")
	}
	require.NoError(t, exp.tr.Withdrawn(g1), "twice: nothing left to unmap")
	// The Endpoint that described G1 before its withdrawal maps it no more.
	info, err = exp.tr.endpointOf([]transfer.Descriptor{stale})
	require.NoError(t, err)
	require.Empty(t, info.layouts)
	require.Zero(t, exp.regions(t, g1))
}
