package tcp

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
)

// A request-scoped capability dies with its request: once its blocks are
// revoked (P/D: the request released, its lease ended, or aborted) the
// server refuses the old scope's next read of them (counted, the
// connection kept), while its other blocks, and a scope made afterwards
// for the blocks' next owner, read on. On TCP and on the same host.
func TestARevokedScopeReadsNothingOfTheNextOwner(t *testing.T) {
	for _, sameHost := range []bool{false, true} {
		p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: !sameHost})
		bio, err := p.exp.BlockIO(p.remote["g2"])
		require.NoError(t, err)
		require.NoError(t, bio.WriteBlock(2, pattern(bio.BlockSize(), 0xA0, 2)))
		scope := remote.Scope{Layouts: []remote.ScopedLayout{{Layout: p.remote["g2"], Blocks: []int{2, 3}}}}
		old := connectScoped(t, p, scope)
		bs := uint64(p.cfg.BlockSize())
		got, err := scopedRead(t, p, old, "g2", 2*bs, bs)
		require.NoError(t, err)
		require.Equal(t, pattern(bio.BlockSize(), 0xA0, 2), got)

		require.NoError(t, p.expTCP.RevokeBlocks([]remote.ScopedLayout{{Layout: p.remote["g2"], Blocks: []int{2}}}))
		require.NoError(t, bio.WriteBlock(2, pattern(bio.BlockSize(), 0xB0, 2))) // the next owner's
		before := p.expTCP.RefusedOutOfScope()
		_, err = scopedRead(t, p, old, "g2", 2*bs, bs)
		require.ErrorIs(t, err, transfer.ErrUnsupported)
		require.ErrorContains(t, err, "revoked")
		require.Equal(t, before+1, p.expTCP.RefusedOutOfScope())
		_, err = scopedRead(t, p, old, "g2", 2*bs, 2*bs)
		require.ErrorContains(t, err, "revoked", "a range that reaches a revoked block")
		got, err = scopedRead(t, p, old, "g2", 3*bs, bs)
		require.NoError(t, err, "block 3 was not revoked: the connection reads on")
		require.Equal(t, block(t, p.exp, p.remote["g2"], 3), got)

		next := connectScoped(t, p, scope)
		got, err = scopedRead(t, p, next, "g2", 2*bs, bs)
		require.NoError(t, err, "a scope made after the revocation")
		require.Equal(t, pattern(bio.BlockSize(), 0xB0, 2), got)
	}
}

// Revoking checks everything before it revokes anything.
func TestARevocationOfBlocksOutsideTheLayoutIsRefusedWhole(t *testing.T) {
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true})
	sp := connectScoped(t, p, remote.Scope{Layouts: []remote.ScopedLayout{{Layout: p.remote["g2"], Blocks: []int{1}}}})
	err := p.expTCP.RevokeBlocks([]remote.ScopedLayout{{Layout: p.remote["g2"], Blocks: []int{1}}, {Layout: p.remote["g1"], Blocks: []int{p.cfg.NumBlocks}}})
	require.ErrorIs(t, err, transfer.ErrOutOfRange)
	err = p.expTCP.RevokeBlocks([]remote.ScopedLayout{{Layout: transfer.LayoutHandle{Worker: 0xE1, Layout: 99}, Blocks: []int{1}}})
	require.ErrorIs(t, err, transfer.ErrNotFound)
	_, err = scopedRead(t, p, sp, "g2", uint64(p.cfg.BlockSize()), uint64(p.cfg.BlockSize()))
	require.NoError(t, err, "nothing was revoked")
}

// A read racing the revocation of its block returns the old owner's bytes
// or an error, never the next owner's, which are written as soon as the
// revocation returns: 1,000 times, each with a scope of its own.
func TestAReadRacingARevocationNeverReturnsTheNextOwnersBytes(t *testing.T) {
	p := newTCPPair(t, 5*time.Second, Config{Listen: "127.0.0.1:0", NoSameHost: true})
	bio, err := p.exp.BlockIO(p.remote["g2"])
	require.NoError(t, err)
	bs := uint64(p.cfg.BlockSize())
	scope := remote.Scope{Layouts: []remote.ScopedLayout{{Layout: p.remote["g2"], Blocks: []int{2}}}}
	runs := 1000
	if testing.Short() {
		runs = 100
	}
	var oldBytes, refused int
	for i := range runs {
		mine := pattern(bio.BlockSize(), byte(i), 2)
		require.NoError(t, bio.WriteBlock(2, mine))
		sp := connectScoped(t, p, scope)
		revoked := make(chan struct{})
		go func() {
			defer close(revoked)
			if err := p.expTCP.RevokeBlocks(scope.Layouts); err != nil {
				panic(err)
			}
			if err := bio.WriteBlock(2, pattern(bio.BlockSize(), byte(i)^0x80, 2)); err != nil { // the next owner's
				panic(err)
			}
		}()
		for {
			got, err := scopedRead(t, p, sp.Own().(*tcpPeer), "g2", 2*bs, bs)
			if err != nil {
				require.ErrorContains(t, err, "revoked", "run %d", i)
				refused++
				break
			}
			require.Equal(t, mine, got, "run %d: a read allowed returned bytes that are not the old owner's", i)
			oldBytes++
		}
		<-revoked
		sp.Close()
	}
	t.Logf("%d runs: %d reads of the old owner's bytes, %d refused", runs, oldBytes, refused)
}
