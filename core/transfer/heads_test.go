package transfer

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
)

// headConfig is a KV shape of heads heads of 8 bytes a token: 4 tokens,
// 3 layers, K and V.
func headConfig(blocks, heads int) layout.Config {
	return layout.Config{NumBlocks: blocks, NumLayers: 3, OuterDim: 2, PageSize: 4, InnerDim: heads * 8, DtypeWidth: 1}
}

// sliceInto is what a head slice does to one destination block: want is
// dst (a whole block, in ReadBlock's order) with the slice's heads of src
// written over, fragment by fragment, head by head, token by token.
func sliceInto(s layout.HeadSlice, sc, dc layout.Config, src, dst []byte) []byte {
	want := append([]byte(nil), dst...)
	const hb = 8
	at := func(h layout.Heads, head, token int) int {
		if h.Order == layout.HeadsOuter {
			return (head*sc.PageSize + token) * hb
		}
		return (token*h.Total + head) * hb
	}
	for frag := 0; frag < sc.NumLayers*sc.OuterDim; frag++ {
		sf, df := frag*sc.FragmentSize(), frag*dc.FragmentSize()
		for head := 0; head < s.Count; head++ {
			for token := 0; token < sc.PageSize; token++ {
				so, do := sf+at(s.Src, s.SrcFirst+head, token), df+at(s.Dst, s.DstFirst+head, token)
				copy(want[do:do+hb], src[so:so+hb])
			}
		}
	}
	return want
}

// A head slice moves exactly its heads of every fragment of the blocks
// named, between every pair of memory kinds and shapes (the device through
// its copies, host memory through memcpy), in every order; the other heads
// and the other blocks keep their bytes.
func TestHeadSliceMovesItsHeadsOnly(t *testing.T) {
	f := newFixture(t)
	const blocks = 4
	sc, dc := headConfig(blocks, 4), headConfig(blocks, 2)
	srcIDs, dstIDs := []int{0, 3}, []int{2, 1}
	memory := []storage.Kind{storage.System, storage.Pinned, storage.Device}
	orders := []layout.HeadOrder{layout.HeadsOuter, layout.TokensOuter}
	for _, sk := range memory {
		for _, dk := range memory {
			if (sk == storage.System) != (dk == storage.System) && (sk == storage.Device || dk == storage.Device) {
				continue // system memory never meets the device
			}
			for _, shape := range []string{"fc", "ls-first", "ls-second"} {
				src := f.alloc(sk, sc, shapes[shape])
				dst := f.alloc(dk, dc, shapes["ls-first"])
				for _, so := range orders {
					for _, do := range orders {
						s := layout.HeadSlice{Src: layout.Heads{Total: 4, Order: so}, Dst: layout.Heads{Total: 2, Order: do},
							SrcFirst: 2, DstFirst: 0, Count: 2}
						name := fmt.Sprintf("%v-%s/%v %v", sk, shape, dk, s)
						f.fill(src, 100)
						f.fill(dst, 900)
						require.NoError(t, f.transfer(src, srcIDs, dst, dstIDs, Options{Heads: &s}), name)
						for id := range blocks {
							want := pattern(dc.BlockSize(), 900+uint64(id))
							for i, d := range dstIDs {
								if d == id {
									want = sliceInto(s, sc, dc, pattern(sc.BlockSize(), 100+uint64(srcIDs[i])), want)
								}
							}
							require.Equal(t, want, f.readBlock(dst, id), "%s: block %d", name, id)
						}
					}
				}
				require.NoError(t, f.m.Unregister(src))
				require.NoError(t, f.m.Unregister(dst))
			}
		}
	}
}

// Two slices fill a decode's block from two prefill ranks' halves, as a
// decode of tensor-parallel size 1 takes its 4 heads from two ranks of 2.
func TestHeadSlicesFillABlockFromTwoSources(t *testing.T) {
	f := newFixture(t)
	rank0, rank1 := f.alloc(storage.Pinned, headConfig(2, 2), FullyContiguous), f.alloc(storage.Pinned, headConfig(2, 2), FullyContiguous)
	dst := f.alloc(storage.Device, headConfig(2, 4), shapes["ls-second"])
	f.fill(rank0, 10)
	f.fill(rank1, 20)
	f.fill(dst, 90)
	sc, dc := headConfig(2, 2), headConfig(2, 4)
	want := pattern(dc.BlockSize(), 91)
	for r, src := range []LayoutHandle{rank0, rank1} {
		s := layout.HeadSlice{Src: layout.Heads{Total: 2, Order: layout.TokensOuter}, Dst: layout.Heads{Total: 4, Order: layout.TokensOuter},
			SrcFirst: 0, DstFirst: 2 * r, Count: 2}
		require.NoError(t, f.transfer(src, []int{1}, dst, []int{1}, Options{Heads: &s}))
		want = sliceInto(s, sc, dc, pattern(sc.BlockSize(), uint64(10*(r+1)+1)), want)
	}
	require.Equal(t, want, f.readBlock(dst, 1))
	require.Equal(t, pattern(dc.BlockSize(), 90), f.readBlock(dst, 0), "the other block is untouched")
}

// A head slice is refused, before a byte moves, when it does not fit the
// layouts, and with a disk on either side (a disk block is checksummed
// whole); a slice never passes for a whole fragment.
func TestHeadSliceRefusals(t *testing.T) {
	f := newFixture(t)
	src := f.alloc(storage.Pinned, headConfig(2, 4), FullyContiguous)
	dst := f.alloc(storage.Pinned, headConfig(2, 2), FullyContiguous)
	disk := f.alloc(storage.Disk, headConfig(2, 2), FullyContiguous)
	ok := layout.HeadSlice{Src: layout.Heads{Total: 4, Order: layout.HeadsOuter}, Dst: layout.Heads{Total: 2, Order: layout.HeadsOuter}, Count: 2}
	_, err := f.m.ExecuteTransfer(src, []int{0}, dst, []int{0}, Options{})
	require.ErrorIs(t, err, ErrInvalidArgument, "fragments of 4 heads and of 2 are incompatible without a slice")
	bad := ok
	bad.SrcFirst = 3
	_, err = f.m.ExecuteTransfer(src, []int{0}, dst, []int{0}, Options{Heads: &bad})
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorContains(t, err, "source heads [3, 5) are not within its 4 heads")
	_, err = f.m.ExecuteTransfer(src, []int{0}, disk, []int{0}, Options{Heads: &ok})
	require.ErrorIs(t, err, ErrUnsupported)
	require.ErrorContains(t, err, "memory layouts only")
}

// hostPeer reaches another manager's host layouts by address, as a
// transport's peer does (its memory in another process).
type hostPeer struct{}

func (hostPeer) Attach(Descriptor) (Attachment, error) { return Attachment{Memory: hostPeer{}}, nil }

func (hostPeer) Read(_ context.Context, _ LayoutHandle, ops []RemoteOp) error {
	for _, o := range ops {
		copy(storage.HostBytes(o.Local, o.Size), storage.HostBytes(o.Remote, o.Size))
	}
	return nil
}

func (hostPeer) Write(_ context.Context, _ LayoutHandle, ops []RemoteOp) error {
	for _, o := range ops {
		copy(storage.HostBytes(o.Remote, o.Size), storage.HostBytes(o.Local, o.Size))
	}
	return nil
}

// A pull of a slice of a peer's heads into device memory goes in two hops,
// through a bounce buffer shaped as the peer's blocks in a shape of its
// own: the slice is taken on the second hop in the peer's geometry. Pulls
// into host memory take it in their one hop.
func TestHeadSliceFromAPeer(t *testing.T) {
	exp, dec := newFixture(t), newFixture(t)
	dec.m.cfg.WorkerID = 0xD1 // another worker than exp's
	sc, dc := headConfig(3, 4), headConfig(3, 2)
	src := exp.alloc(storage.Pinned, sc, shapes["ls-first"])
	exp.fill(src, 40)
	d, err := exp.m.Describe(src)
	require.NoError(t, err)
	hs, err := dec.m.Import(hostPeer{}, []Descriptor{d})
	require.NoError(t, err)
	s := layout.HeadSlice{Src: layout.Heads{Total: 4, Order: layout.TokensOuter}, Dst: layout.Heads{Total: 2, Order: layout.HeadsOuter},
		SrcFirst: 1, DstFirst: 0, Count: 2}
	for _, kind := range []storage.Kind{storage.Device, storage.Pinned, storage.System} {
		dst := dec.alloc(kind, dc, FullyContiguous)
		dec.fill(dst, 70)
		require.NoError(t, dec.transfer(hs[0], []int{2, 0}, dst, []int{0, 1}, Options{Heads: &s}), "%v", kind)
		want := sliceInto(s, sc, dc, pattern(sc.BlockSize(), 42), pattern(dc.BlockSize(), 70))
		require.Equal(t, want, dec.readBlock(dst, 0), "%v", kind)
		want = sliceInto(s, sc, dc, pattern(sc.BlockSize(), 40), pattern(dc.BlockSize(), 71))
		require.Equal(t, want, dec.readBlock(dst, 1), "%v", kind)
		require.Equal(t, pattern(dc.BlockSize(), 72), dec.readBlock(dst, 2), "%v: untouched", kind)
		require.NoError(t, dec.m.Unregister(dst))
	}
}
