package layout

import (
	"errors"
	"strconv"
)

// Kind says how a layout arranges its blocks in memory.
type Kind uint8

const (
	// FullyContiguous is one region [block][layer][outer][page][inner].
	FullyContiguous Kind = 1
	// LayerSeparate is one region per layer, ordered by BlockDim.
	LayerSeparate Kind = 2
)

func (k Kind) String() string {
	switch k {
	case FullyContiguous:
		return "FullyContiguous"
	case LayerSeparate:
		return "LayerSeparate"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// BlockDim is the position of the block dimension inside each per-layer
// region of a LayerSeparate layout.
type BlockDim uint8

const (
	// BlockIsFirstDim is [block][outer][page][inner] per layer.
	BlockIsFirstDim BlockDim = 0
	// BlockIsSecondDim is [outer][block][page][inner] per layer: vLLM's
	// FlashAttention cache [2, num_blocks, block_size, heads, head_size].
	BlockIsSecondDim BlockDim = 1
)

func (d BlockDim) String() string {
	switch d {
	case BlockIsFirstDim:
		return "BlockIsFirstDim"
	case BlockIsSecondDim:
		return "BlockIsSecondDim"
	}
	return "BlockDim(" + strconv.Itoa(int(d)) + ")"
}

// Layout maps (block, layer, outer) to an address inside its regions. It is
// an immutable value; the memory behind the addresses is owned elsewhere.
type Layout struct {
	cfg      Config
	kind     Kind
	blockDim BlockDim
	bases    []uint64 // one per region
	// blockSize and blockStride are a whole block's bytes and the distance
	// between blocks of a FullyContiguous layout, computed once: every
	// transfer's plan asks for them.
	blockSize, blockStride uint64
	// regionSize is every region's size (RegionSizes; all are equal),
	// computed once: a peer's every request checks its ranges against it.
	regionSize uint64
}

// Region is a range of addresses.
type Region struct {
	Addr uint64
	Size uint64
}

// End is the first address after the region.
func (r Region) End() uint64 { return r.Addr + r.Size }

// RegionSizes returns the bytes each region of such a layout must have, in
// region order: one for FullyContiguous, NumLayers for LayerSeparate.
func RegionSizes(cfg Config, kind Kind, dim BlockDim) ([]uint64, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch kind {
	case FullyContiguous:
		return []uint64{uint64(cfg.NumBlocks) * cfg.align(uint64(cfg.BlockSize()))}, nil
	case LayerSeparate:
		var size uint64
		switch dim {
		case BlockIsFirstDim:
			size = uint64(cfg.NumBlocks) * cfg.align(uint64(cfg.OuterDim*cfg.FragmentSize()))
		case BlockIsSecondDim:
			size = uint64(cfg.OuterDim) * cfg.align(uint64(cfg.NumBlocks*cfg.FragmentSize()))
		default:
			return nil, errors.New("layout: BlockDim must be 0 (first) or 1 (second), got " + strconv.Itoa(int(dim)))
		}
		sizes := make([]uint64, cfg.NumLayers)
		for i := range sizes {
			sizes[i] = size
		}
		return sizes, nil
	}
	return nil, errors.New("layout: Kind must be 1 (FullyContiguous) or 2 (LayerSeparate), got " + strconv.Itoa(int(kind)))
}

// New makes a layout over regions starting at bases. The number of bases must
// match the kind (1 for FullyContiguous, NumLayers for LayerSeparate); dim is
// ignored for FullyContiguous.
func New(cfg Config, kind Kind, dim BlockDim, bases []uint64) (*Layout, error) {
	sizes, err := RegionSizes(cfg, kind, dim)
	if err != nil {
		return nil, err
	}
	if len(bases) != len(sizes) {
		return nil, errors.New("layout: " + kind.String() + " needs " + strconv.Itoa(len(sizes)) +
			" region bases, got " + strconv.Itoa(len(bases)))
	}
	for i, b := range bases {
		if b+sizes[i] < b {
			return nil, errors.New("layout: region " + strconv.Itoa(i) + " at 0x" + strconv.FormatUint(b, 16) +
				" with size " + strconv.FormatUint(sizes[i], 10) + " overflows the address space")
		}
	}
	if kind == FullyContiguous {
		dim = BlockIsFirstDim
	}
	size := uint64(cfg.BlockSize())
	return &Layout{cfg: cfg, kind: kind, blockDim: dim, bases: append([]uint64(nil), bases...),
		blockSize: size, blockStride: cfg.align(size), regionSize: sizes[0]}, nil
}

// NewFullyContiguous makes a FullyContiguous layout over one region at base.
func NewFullyContiguous(cfg Config, base uint64) (*Layout, error) {
	return New(cfg, FullyContiguous, BlockIsFirstDim, []uint64{base})
}

// NewLayerSeparate makes a LayerSeparate layout over one region per layer.
func NewLayerSeparate(cfg Config, dim BlockDim, bases []uint64) (*Layout, error) {
	return New(cfg, LayerSeparate, dim, bases)
}

// Config returns the layout's shape.
func (l *Layout) Config() Config { return l.cfg }

// Kind returns how the layout arranges blocks.
func (l *Layout) Kind() Kind { return l.kind }

// BlockDim returns the block dimension of a LayerSeparate layout.
func (l *Layout) BlockDim() BlockDim { return l.blockDim }

// NumRegions is 1 for FullyContiguous, NumLayers for LayerSeparate.
func (l *Layout) NumRegions() int { return len(l.bases) }

// Regions returns every region (base and size) in order.
func (l *Layout) Regions() []Region {
	out := make([]Region, len(l.bases))
	for i, b := range l.bases {
		out[i] = Region{Addr: b, Size: l.regionSize}
	}
	return out
}

// Contains reports whether [addr, addr+size) is a non-empty range inside
// one region: what a peer may ask to read or write.
func (l *Layout) Contains(addr, size uint64) bool {
	if size == 0 || addr+size < addr {
		return false
	}
	for _, b := range l.bases {
		if addr >= b && addr+size <= b+l.regionSize {
			return true
		}
	}
	return false
}

// BlocksTouched is the first and last block whose bytes [addr, addr+size)
// touches (alignment padding after a block counts as that block's), ok
// false when the range is not inside one region. A range that crosses
// from one outer index to the next of a BlockIsSecondDim layout touches
// every block. What a block-scoped capability checks a peer's request
// against.
func (l *Layout) BlocksTouched(addr, size uint64) (first, last int, ok bool) {
	if size == 0 || addr+size < addr {
		return 0, 0, false
	}
	c := l.cfg
	frag := uint64(c.FragmentSize())
	for _, base := range l.bases {
		if addr < base || addr+size > base+l.regionSize {
			continue
		}
		off, end := addr-base, addr-base+size-1
		var stride uint64 // the bytes from one block to the next
		switch {
		case l.kind == FullyContiguous:
			stride = l.blockStride
		case l.blockDim == BlockIsFirstDim:
			stride = c.align(uint64(c.OuterDim) * frag)
		default:
			row := c.align(uint64(c.NumBlocks) * frag) // one outer index: every block's fragment
			if off/row != end/row {
				return 0, c.NumBlocks - 1, true
			}
			off, end, stride = off%row, end%row, frag
		}
		first, last = int(off/stride), int(end/stride)
		return min(first, c.NumBlocks-1), min(last, c.NumBlocks-1), true
	}
	return 0, 0, false
}

// IsBlockContiguous reports whether each block's bytes (all layers, all
// outers) form one range, so that whole blocks can be copied at once.
func (l *Layout) IsBlockContiguous() bool { return l.kind == FullyContiguous }

// BlockRegion is the range of a whole block. It fails unless the layout is
// FullyContiguous.
func (l *Layout) BlockRegion(block int) (Region, error) {
	if l.kind != FullyContiguous {
		return Region{}, errors.New("layout: BlockRegion needs a FullyContiguous layout, this one is " + l.kind.String())
	}
	if block < 0 || block >= l.cfg.NumBlocks {
		return Region{}, outOfRange("block", block, l.cfg.NumBlocks)
	}
	return Region{Addr: l.bases[0] + uint64(block)*l.blockStride, Size: l.blockSize}, nil
}

// MemoryRegion is the range of one (block, layer, outer) fragment, with every
// index checked against the config.
func (l *Layout) MemoryRegion(block, layer, outer int) (Region, error) {
	switch {
	case block < 0 || block >= l.cfg.NumBlocks:
		return Region{}, outOfRange("block", block, l.cfg.NumBlocks)
	case layer < 0 || layer >= l.cfg.NumLayers:
		return Region{}, outOfRange("layer", layer, l.cfg.NumLayers)
	case outer < 0 || outer >= l.cfg.OuterDim:
		return Region{}, outOfRange("outer", outer, l.cfg.OuterDim)
	}
	return l.Fragment(block, layer, outer), nil
}

// Fragment is MemoryRegion without the bounds checks, for loops whose
// indices were validated once up front.
func (l *Layout) Fragment(block, layer, outer int) Region {
	c := l.cfg
	frag := uint64(c.FragmentSize())
	var addr uint64
	switch {
	case l.kind == FullyContiguous:
		stride := c.align(uint64(c.BlockSize()))
		addr = l.bases[0] + uint64(block)*stride + (uint64(layer*c.OuterDim+outer))*frag
	case l.blockDim == BlockIsFirstDim:
		stride := c.align(uint64(c.OuterDim) * frag)
		addr = l.bases[layer] + uint64(block)*stride + uint64(outer)*frag
	default:
		stride := c.align(uint64(c.NumBlocks) * frag)
		addr = l.bases[layer] + uint64(outer)*stride + uint64(block)*frag
	}
	return Region{Addr: addr, Size: frag}
}

// String is a one-line summary for logs and errors.
func (l *Layout) String() string {
	if l.kind == FullyContiguous {
		return l.kind.String() + l.shape("block", l.cfg.BlockSize())
	}
	return l.kind.String() + "/" + l.blockDim.String() + l.shape("fragment", l.cfg.FragmentSize())
}

// shape is String's "{blocks …, layers …, outer …, <unit> … B}".
func (l *Layout) shape(unit string, bytes int) string {
	return "{blocks " + strconv.Itoa(l.cfg.NumBlocks) + ", layers " + strconv.Itoa(l.cfg.NumLayers) +
		", outer " + strconv.Itoa(l.cfg.OuterDim) + ", " + unit + " " + strconv.Itoa(bytes) + " B}"
}

// outOfRange is the error of an index i of what beyond [0, n).
func outOfRange(what string, i, n int) error {
	return errors.New("layout: " + what + " " + strconv.Itoa(i) + " out of range [0, " + strconv.Itoa(n) + ")")
}
