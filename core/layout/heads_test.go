package layout

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// fragmentConfig is a one-fragment-per-(block, layer) config of heads
// heads of hb bytes over page tokens.
func fragmentConfig(heads, page, hb int) Config {
	return Config{NumBlocks: 1, NumLayers: 2, OuterDim: 1, PageSize: page, InnerDim: heads * hb, DtypeWidth: 1}
}

// Pieces moves exactly the slice's heads, every token, and nothing else,
// for every pair of orders and every slice of every size: checked against
// a copy head by head, token by token.
func TestHeadSlicePiecesMoveTheHeadsAndNothingElse(t *testing.T) {
	const page, hb = 4, 3
	orders := []HeadOrder{HeadsOuter, TokensOuter}
	for _, srcTotal := range []int{1, 2, 4} {
		for _, dstTotal := range []int{1, 2, 4} {
			for _, so := range orders {
				for _, do := range orders {
					for count := 1; count <= min(srcTotal, dstTotal); count++ {
						for sf := 0; sf+count <= srcTotal; sf++ {
							for df := 0; df+count <= dstTotal; df++ {
								s := HeadSlice{Src: Heads{srcTotal, so}, Dst: Heads{dstTotal, do}, SrcFirst: sf, DstFirst: df, Count: count}
								checkPieces(t, s, page, hb)
							}
						}
					}
				}
			}
		}
	}
}

func checkPieces(t *testing.T, s HeadSlice, page, hb int) {
	t.Helper()
	sc, dc := fragmentConfig(s.Src.Total, page, hb), fragmentConfig(s.Dst.Total, page, hb)
	require.NoError(t, s.Check(sc, dc), "%v", s)
	src := make([]byte, sc.FragmentSize())
	for i := range src {
		src[i] = byte(i + 1)
	}
	got := make([]byte, dc.FragmentSize())
	want := make([]byte, dc.FragmentSize())
	for i := range got {
		got[i], want[i] = 0xEE, 0xEE // a guard: what is not moved stays
	}
	offset := func(h Heads, head, token int) int {
		if h.Order == HeadsOuter {
			return (head*page + token) * hb
		}
		return (token*h.Total + head) * hb
	}
	for head := 0; head < s.Count; head++ {
		for token := 0; token < page; token++ {
			so, do := offset(s.Src, s.SrcFirst+head, token), offset(s.Dst, s.DstFirst+head, token)
			copy(want[do:do+hb], src[so:so+hb])
		}
	}
	pieces := 0
	s.Pieces(page, s.Src.HeadBytes(sc), func(so, do, size uint64) {
		pieces++
		require.LessOrEqual(t, so+size, uint64(len(src)), "%v", s)
		require.LessOrEqual(t, do+size, uint64(len(got)), "%v", s)
		copy(got[do:do+size], src[so:so+size])
	})
	require.Equal(t, want, got, "%v", s)
	if s.Src.Order == HeadsOuter && s.Dst.Order == HeadsOuter {
		require.Equal(t, 1, pieces, "%v: one range a fragment", s)
	}
	if s.Src.Order == TokensOuter && s.Dst.Order == TokensOuter && s.Count > 1 && s.Count < s.Src.Total {
		require.Equal(t, page, pieces, "%v: one range a token", s)
	}
}

func TestHeadSliceCheck(t *testing.T) {
	src, dst := fragmentConfig(4, 16, 256), fragmentConfig(2, 16, 256)
	ok := HeadSlice{Src: Heads{4, HeadsOuter}, Dst: Heads{2, TokensOuter}, SrcFirst: 2, DstFirst: 0, Count: 2}
	require.NoError(t, ok.Check(src, dst))
	for _, c := range []struct {
		name     string
		s        HeadSlice
		src, dst Config
		msg      string
	}{
		{"order", HeadSlice{Src: Heads{4, 0}, Dst: ok.Dst, SrcFirst: 2, Count: 2}, src, dst, "source head order must be 1"},
		{"total", HeadSlice{Src: Heads{3, HeadsOuter}, Dst: ok.Dst, Count: 1}, src, dst, "do not hold 3 heads"},
		{"zero total", HeadSlice{Src: ok.Src, Dst: Heads{0, HeadsOuter}, Count: 1}, src, dst, "destination fragments"},
		{"beyond", HeadSlice{Src: ok.Src, Dst: ok.Dst, SrcFirst: 3, Count: 2}, src, dst, "source heads [3, 5) are not within its 4 heads"},
		{"negative", HeadSlice{Src: ok.Src, Dst: ok.Dst, DstFirst: -1, Count: 1}, src, dst, "destination heads [-1, 0)"},
		{"no heads", HeadSlice{Src: ok.Src, Dst: ok.Dst}, src, dst, "heads [0, 0)"},
		{"head size", ok, src, fragmentConfig(2, 16, 128), "head size 256 vs 128 bytes per token"},
		{"page", ok, src, Config{NumBlocks: 1, NumLayers: 2, OuterDim: 1, PageSize: 32, InnerDim: 256, DtypeWidth: 1}, "PageSize 16 vs 32"},
		{"layers", ok, src, Config{NumBlocks: 1, NumLayers: 3, OuterDim: 1, PageSize: 16, InnerDim: 512, DtypeWidth: 1}, "NumLayers 2 vs 3"},
		// A page × heads product that would wrap to a divisor of the
		// fragment: refused, not planned outside it.
		{"wrapping heads", HeadSlice{Src: Heads{1<<24 + 1, HeadsOuter}, Dst: Heads{1<<24 + 1, HeadsOuter}, SrcFirst: 1, DstFirst: 5, Count: 1},
			Config{NumBlocks: 1, NumLayers: 1, OuterDim: 1, PageSize: 1 << 40, InnerDim: 1, DtypeWidth: 1},
			Config{NumBlocks: 1, NumLayers: 1, OuterDim: 1, PageSize: 1 << 40, InnerDim: 1, DtypeWidth: 1}, "do not hold 16777217 heads"},
		{"too many ranges", HeadSlice{Src: Heads{1, HeadsOuter}, Dst: Heads{1, HeadsOuter}, Count: 1},
			Config{NumBlocks: 1, NumLayers: 1, OuterDim: 1, PageSize: 1 << 20, InnerDim: 1, DtypeWidth: 1},
			Config{NumBlocks: 1, NumLayers: 1, OuterDim: 1, PageSize: 1 << 20, InnerDim: 1, DtypeWidth: 1}, "more than 65536 ranges a fragment"},
	} {
		err := c.s.Check(c.src, c.dst)
		require.ErrorContains(t, err, c.msg, c.name)
	}
}

// FuzzHeadSlice: whatever the ABI passes, a slice that Check accepts plans
// ranges inside one fragment on each side, writes each destination byte of
// its heads once, and nothing else.
func FuzzHeadSlice(f *testing.F) {
	f.Add(uint16(16), uint16(64), uint16(8), uint8(1), uint16(4), uint8(2), uint16(2), uint16(0), uint16(2))
	f.Fuzz(func(t *testing.T, page, hb, srcTotal uint16, srcOrder uint8, dstTotal uint16, dstOrder uint8, srcFirst, dstFirst, count uint16) {
		s := HeadSlice{Src: Heads{int(srcTotal), HeadOrder(srcOrder)}, Dst: Heads{int(dstTotal), HeadOrder(dstOrder)},
			SrcFirst: int(srcFirst), DstFirst: int(dstFirst), Count: int(count)}
		sc := Config{NumBlocks: 1, NumLayers: 1, OuterDim: 1, PageSize: int(page), InnerDim: int(hb) * 4, DtypeWidth: 1}
		dc := sc
		dc.InnerDim = int(hb) * 2
		if sc.Validate() != nil || dc.Validate() != nil || s.Check(sc, dc) != nil {
			return
		}
		written := make([]bool, dc.FragmentSize())
		var moved uint64
		s.Pieces(sc.PageSize, s.Src.HeadBytes(sc), func(so, do, size uint64) {
			if size == 0 || so+size > uint64(sc.FragmentSize()) || do+size > uint64(dc.FragmentSize()) {
				t.Fatalf("%v: range src %d dst %d size %d outside fragments of %d and %d", s, so, do, size, sc.FragmentSize(), dc.FragmentSize())
			}
			for i := do; i < do+size; i++ {
				if written[i] {
					t.Fatalf("%v: destination byte %d written twice", s, i)
				}
				written[i] = true
			}
			moved += size
		})
		if want := uint64(s.Count * sc.PageSize * s.Src.HeadBytes(sc)); moved != want {
			t.Fatalf("%v: moved %d bytes, want %d", s, moved, want)
		}
	})
}
