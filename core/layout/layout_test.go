package layout

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func llamaConfig(blocks int) Config {
	return Config{NumBlocks: blocks, NumLayers: 32, OuterDim: 2, PageSize: 16, InnerDim: 8 * 128, DtypeWidth: 2}
}

func TestConfigSizes(t *testing.T) {
	c := llamaConfig(4)
	require.NoError(t, c.Validate())
	require.Equal(t, 32<<10, c.FragmentSize())
	require.Equal(t, 2<<20, c.BlockSize())
}

func TestConfigValidateNamesFieldAndValue(t *testing.T) {
	base := llamaConfig(4)
	cases := []struct {
		mutate func(*Config)
		want   string
	}{
		{func(c *Config) { c.NumBlocks = 0 }, "NumBlocks must be > 0, got 0"},
		{func(c *Config) { c.NumLayers = -1 }, "NumLayers must be > 0, got -1"},
		{func(c *Config) { c.OuterDim = 3 }, "OuterDim must be 1 or 2, got 3"},
		{func(c *Config) { c.PageSize = 12 }, "PageSize must be a power of two, got 12"},
		{func(c *Config) { c.InnerDim = 0 }, "InnerDim must be > 0, got 0"},
		{func(c *Config) { c.DtypeWidth = 3 }, "DtypeWidth must be 1, 2, 4 or 8, got 3"},
		{func(c *Config) { c.Alignment = 3000 }, "Alignment must be 0, 1 or a power of two, got 3000"},
		{func(c *Config) { c.NumBlocks = 1 << 50 }, "overflows"},
	}
	for _, tc := range cases {
		c := base
		tc.mutate(&c)
		err := c.Validate()
		require.Error(t, err)
		require.Contains(t, err.Error(), tc.want)
	}
}

func TestCompatible(t *testing.T) {
	a := llamaConfig(4)
	b := llamaConfig(100)
	b.Alignment = 4096
	require.NoError(t, a.Compatible(b))
	b.NumLayers = 31
	require.ErrorContains(t, a.Compatible(b), "NumLayers 32 vs 31")
	b = a
	b.InnerDim = 512
	require.ErrorContains(t, a.Compatible(b), "fragment size")
}

// Each layout must place every fragment inside its regions, without overlap,
// at the offset its formula says.
func TestFragmentsTileRegions(t *testing.T) {
	cfg := Config{NumBlocks: 5, NumLayers: 3, OuterDim: 2, PageSize: 4, InnerDim: 3, DtypeWidth: 2}
	frag := uint64(cfg.FragmentSize())
	for _, tc := range []struct {
		name string
		kind Kind
		dim  BlockDim
		off  func(b, l, o int) (region int, off uint64)
	}{
		{"fc", FullyContiguous, BlockIsFirstDim, func(b, l, o int) (int, uint64) {
			return 0, uint64(((b*cfg.NumLayers)+l)*cfg.OuterDim+o) * frag
		}},
		{"ls-first", LayerSeparate, BlockIsFirstDim, func(b, l, o int) (int, uint64) {
			return l, uint64(b*cfg.OuterDim+o) * frag
		}},
		{"ls-second", LayerSeparate, BlockIsSecondDim, func(b, l, o int) (int, uint64) {
			return l, uint64(o*cfg.NumBlocks+b) * frag
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sizes, err := RegionSizes(cfg, tc.kind, tc.dim)
			require.NoError(t, err)
			bases := make([]uint64, len(sizes))
			next := uint64(1 << 20)
			for i := range bases {
				bases[i] = next
				next += sizes[i] + 4096
			}
			l, err := New(cfg, tc.kind, tc.dim, bases)
			require.NoError(t, err)
			seen := map[uint64]bool{}
			var total uint64
			for b := 0; b < cfg.NumBlocks; b++ {
				for ly := 0; ly < cfg.NumLayers; ly++ {
					for o := 0; o < cfg.OuterDim; o++ {
						r, err := l.MemoryRegion(b, ly, o)
						require.NoError(t, err)
						ri, off := tc.off(b, ly, o)
						require.Equal(t, bases[ri]+off, r.Addr)
						require.Equal(t, frag, r.Size)
						require.LessOrEqual(t, r.End(), bases[ri]+sizes[ri])
						require.False(t, seen[r.Addr])
						seen[r.Addr] = true
						total += r.Size
					}
				}
			}
			var want uint64
			for _, s := range sizes {
				want += s
			}
			require.Equal(t, want, total, "fragments tile the regions exactly without alignment")
		})
	}
}

func TestAlignmentPadsBlockStride(t *testing.T) {
	cfg := Config{NumBlocks: 3, NumLayers: 2, OuterDim: 1, PageSize: 2, InnerDim: 5, DtypeWidth: 1, Alignment: 4096}
	l, err := NewFullyContiguous(cfg, 0)
	require.NoError(t, err)
	for b := 0; b < 3; b++ {
		r, err := l.BlockRegion(b)
		require.NoError(t, err)
		require.Equal(t, uint64(b*4096), r.Addr)
		require.Equal(t, uint64(20), r.Size)
	}
	require.Equal(t, uint64(3*4096), l.Regions()[0].Size)
}

func TestMemoryRegionBounds(t *testing.T) {
	cfg := Config{NumBlocks: 2, NumLayers: 2, OuterDim: 2, PageSize: 2, InnerDim: 2, DtypeWidth: 2}
	l, err := NewLayerSeparate(cfg, BlockIsSecondDim, []uint64{0, 1000})
	require.NoError(t, err)
	_, err = l.MemoryRegion(2, 0, 0)
	require.ErrorContains(t, err, "block 2 out of range [0, 2)")
	_, err = l.MemoryRegion(0, -1, 0)
	require.ErrorContains(t, err, "layer -1 out of range")
	_, err = l.MemoryRegion(0, 0, 2)
	require.ErrorContains(t, err, "outer 2 out of range")
	_, err = l.BlockRegion(0)
	require.ErrorContains(t, err, "needs a FullyContiguous layout")
	_, err = New(cfg, LayerSeparate, BlockIsFirstDim, []uint64{0})
	require.ErrorContains(t, err, "needs 2 region bases, got 1")
	_, err = New(cfg, Kind(9), BlockIsFirstDim, []uint64{0})
	require.ErrorContains(t, err, "Kind must be")
	_, err = New(cfg, LayerSeparate, BlockDim(7), []uint64{0, 1})
	require.ErrorContains(t, err, "BlockDim must be")
	_, err = NewFullyContiguous(cfg, ^uint64(0)-10)
	require.ErrorContains(t, err, "overflows the address space")
}

func TestContainsOnlyRangesInsideOneRegion(t *testing.T) {
	cfg := Config{NumBlocks: 2, NumLayers: 2, OuterDim: 1, PageSize: 1, InnerDim: 8, DtypeWidth: 1}
	// Two layer regions of 16 bytes, far apart.
	l, err := New(cfg, LayerSeparate, BlockIsFirstDim, []uint64{0x1000, 0x2000})
	require.NoError(t, err)
	require.True(t, l.Contains(0x1000, 16))
	require.True(t, l.Contains(0x2008, 8))
	require.False(t, l.Contains(0x1000, 17), "runs past the region's end")
	require.False(t, l.Contains(0x0fff, 2), "starts before the region")
	require.False(t, l.Contains(0x1000, 0), "empty")
	require.False(t, l.Contains(0x1010, 1), "between regions")
	require.False(t, l.Contains(^uint64(0)-1, 4), "wraps around")
}

// Every fragment touches its own block only, in every kind of layout; a
// range over two blocks' bytes touches both; one outside every region is
// refused.
func TestBlocksTouchedNamesTheBlocksOfARange(t *testing.T) {
	cfg := Config{NumBlocks: 5, NumLayers: 3, OuterDim: 2, PageSize: 4, InnerDim: 8, DtypeWidth: 2, Alignment: 256}
	for _, k := range []struct {
		kind Kind
		dim  BlockDim
	}{{FullyContiguous, BlockIsFirstDim}, {LayerSeparate, BlockIsFirstDim}, {LayerSeparate, BlockIsSecondDim}} {
		sizes, err := RegionSizes(cfg, k.kind, k.dim)
		require.NoError(t, err)
		bases := make([]uint64, len(sizes))
		for i := range bases {
			bases[i] = 1<<20 + uint64(i)<<16
		}
		l, err := New(cfg, k.kind, k.dim, bases)
		require.NoError(t, err)
		for b := range cfg.NumBlocks {
			for layer := range cfg.NumLayers {
				for o := range cfg.OuterDim {
					f := l.Fragment(b, layer, o)
					first, last, ok := l.BlocksTouched(f.Addr, f.Size)
					require.True(t, ok)
					require.Equal(t, [2]int{b, b}, [2]int{first, last}, "%v/%v block %d layer %d outer %d", k.kind, k.dim, b, layer, o)
				}
			}
			if b+1 < cfg.NumBlocks && !(k.kind == LayerSeparate && k.dim == BlockIsSecondDim) {
				a, z := l.Fragment(b, 0, cfg.OuterDim-1), l.Fragment(b+1, 0, 0)
				first, last, ok := l.BlocksTouched(a.Addr, z.End()-a.Addr)
				require.True(t, ok)
				require.Equal(t, [2]int{b, b + 1}, [2]int{first, last}, "%v/%v blocks %d and %d", k.kind, k.dim, b, b+1)
			}
		}
		_, _, ok := l.BlocksTouched(bases[0]-1, 2)
		require.False(t, ok, "starts before the region")
		_, _, ok = l.BlocksTouched(bases[0], 0)
		require.False(t, ok, "empty")
		last := l.Regions()[len(sizes)-1]
		_, _, ok = l.BlocksTouched(last.End()-1, 2)
		require.False(t, ok, "ends past the last region")
		_, _, ok = l.BlocksTouched(last.End()-1, 1)
		require.True(t, ok, "the last byte")
	}
	// A BlockIsSecondDim range across two outer indices touches every block.
	sizes, _ := RegionSizes(cfg, LayerSeparate, BlockIsSecondDim)
	l, err := New(cfg, LayerSeparate, BlockIsSecondDim, make([]uint64, len(sizes)))
	require.NoError(t, err)
	last0, first1 := l.Fragment(cfg.NumBlocks-1, 0, 0), l.Fragment(0, 0, 1)
	first, last, ok := l.BlocksTouched(last0.Addr, first1.End()-last0.Addr)
	require.True(t, ok)
	require.Equal(t, [2]int{0, cfg.NumBlocks - 1}, [2]int{first, last})
}
