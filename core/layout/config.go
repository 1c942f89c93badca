// Package layout describes where each block's bytes live: the shape of a KV
// cache (blocks × layers × outer × page × inner × dtype) and the address
// arithmetic that maps a (block, layer, outer) triple to a memory region.
//
// The package is pure: no cgo, goroutines, clocks or I/O. Addresses are plain
// integers in the address space of whatever backs the layout (host or device
// pointers for memory, byte offsets for a disk file).
package layout

import (
	"errors"
	"strconv"
)

// Config is the shape of one KV cache.
type Config struct {
	// NumBlocks is the number of blocks the layout holds.
	NumBlocks int
	// NumLayers is the number of attention layers.
	NumLayers int
	// OuterDim is 2 for separate K and V, 1 for MLA's joint latent cache.
	OuterDim int
	// PageSize is the number of tokens in one block; a power of two.
	PageSize int
	// InnerDim is the number of elements per token per layer per outer
	// (heads × head size).
	InnerDim int
	// DtypeWidth is the width of one element in bytes: 1, 2, 4 or 8.
	DtypeWidth int
	// Alignment, when not 0 or 1, rounds the stride between consecutive
	// blocks up to a multiple of it (a power of two). Disk layouts use 4096
	// so that every block is O_DIRECT-aligned.
	Alignment int
}

// Validate reports the first invalid field, naming it and its value.
func (c Config) Validate() error {
	switch {
	case c.NumBlocks <= 0:
		return invalidField("NumBlocks must be > 0", c.NumBlocks)
	case c.NumLayers <= 0:
		return invalidField("NumLayers must be > 0", c.NumLayers)
	case c.OuterDim != 1 && c.OuterDim != 2:
		return invalidField("OuterDim must be 1 or 2", c.OuterDim)
	case c.PageSize <= 0 || !isPowerOfTwo(c.PageSize):
		return invalidField("PageSize must be a power of two", c.PageSize)
	case c.InnerDim <= 0:
		return invalidField("InnerDim must be > 0", c.InnerDim)
	case c.DtypeWidth != 1 && c.DtypeWidth != 2 && c.DtypeWidth != 4 && c.DtypeWidth != 8:
		return invalidField("DtypeWidth must be 1, 2, 4 or 8", c.DtypeWidth)
	case c.Alignment < 0 || (c.Alignment > 1 && !isPowerOfTwo(c.Alignment)):
		return invalidField("Alignment must be 0, 1 or a power of two", c.Alignment)
	}
	// Guard the products against overflow: a region must fit in int64.
	const limit = 1 << 62
	size := uint64(c.FragmentSize())
	for _, f := range []int{c.NumLayers, c.OuterDim, c.NumBlocks} {
		if size > limit/uint64(f) {
			return errors.New("layout config: total size overflows (NumBlocks " + strconv.Itoa(c.NumBlocks) +
				", NumLayers " + strconv.Itoa(c.NumLayers) + ", fragment " + strconv.Itoa(c.FragmentSize()) + " bytes)")
		}
		size *= uint64(f)
	}
	return nil
}

// FragmentSize is the bytes of one (block, layer, outer) region:
// PageSize × InnerDim × DtypeWidth.
func (c Config) FragmentSize() int { return c.PageSize * c.InnerDim * c.DtypeWidth }

// BlockSize is the bytes of one block across all layers and outers.
func (c Config) BlockSize() int { return c.NumLayers * c.OuterDim * c.FragmentSize() }

// Compatible reports whether blocks can be copied between layouts of the two
// configs: the same shape per block, regardless of block count and alignment.
func (c Config) Compatible(o Config) error {
	switch {
	case c.NumLayers != o.NumLayers:
		return incompatible("NumLayers ", c.NumLayers, o.NumLayers, "")
	case c.OuterDim != o.OuterDim:
		return incompatible("OuterDim ", c.OuterDim, o.OuterDim, "")
	case c.FragmentSize() != o.FragmentSize():
		return incompatible("fragment size ", c.FragmentSize(), o.FragmentSize(), " bytes (PageSize×InnerDim×DtypeWidth)")
	}
	return nil
}

func (c Config) align(n uint64) uint64 {
	if c.Alignment <= 1 {
		return n
	}
	a := uint64(c.Alignment)
	return (n + a - 1) &^ (a - 1)
}

func isPowerOfTwo(n int) bool { return n > 0 && n&(n-1) == 0 }

// invalidField is Validate's error: rule broken, and the value given.
func invalidField(rule string, got int) error {
	return errors.New("layout config: " + rule + ", got " + strconv.Itoa(got))
}

// incompatible is Compatible's error: what differs, both values, and what
// follows them.
func incompatible(what string, a, b int, after string) error {
	return errors.New("incompatible layouts: " + what + strconv.Itoa(a) + " vs " + strconv.Itoa(b) + after)
}
