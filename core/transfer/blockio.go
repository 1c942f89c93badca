package transfer

import (
	"fmt"

	"github.com/kvbm/kvbm/core/storage"
)

// BlockIO reads and writes whole blocks of one registered layout as
// contiguous bytes, in [layer][outer][page][inner] order: the form blocks
// take in an object store. Host layouts are gathered and scattered
// directly; device and disk layouts go through a pinned bounce buffer (disk
// reads verify checksums). Safe for concurrent use on distinct blocks; the
// manager's Close waits for calls in progress and later calls fail.
type BlockIO struct {
	m *Manager
	e *entry
}

// BlockIO returns block access to a registered layout.
func (m *Manager) BlockIO(h LayoutHandle) (*BlockIO, error) {
	e, err := m.lookup(h)
	if err != nil {
		return nil, err
	}
	return &BlockIO{m: m, e: e}, nil
}

// BlockSize is the bytes of one block.
func (b *BlockIO) BlockSize() int { return b.e.layout.Config().BlockSize() }

// NumBlocks is the number of blocks in the layout.
func (b *BlockIO) NumBlocks() int { return b.e.layout.Config().NumBlocks }

// ReadBlock copies block id into dst, which must be BlockSize bytes.
func (b *BlockIO) ReadBlock(id int, dst []byte) error {
	return b.move(id, dst, false)
}

// WriteBlock copies src, BlockSize bytes, into block id.
func (b *BlockIO) WriteBlock(id int, src []byte) error {
	return b.move(id, src, true)
}

// HostBlock lends block id's memory in place when the layout is host memory
// (system or pinned): the block's fragments in ReadBlock's order, adjacent
// ones merged (a fully contiguous layout's block is one span). The layout
// is held until release, as a ReadBlock or WriteBlock would hold it. For
// device and disk layouts ok is false: those go through the bounce buffer.
func (b *BlockIO) HostBlock(id int) (spans [][]byte, release func(), ok bool, err error) {
	if !b.e.kind.IsHost() {
		return nil, nil, false, nil
	}
	release, err = b.m.hold(b.e)
	if err != nil {
		return nil, nil, false, err
	}
	cfg := b.e.layout.Config()
	if id < 0 || id >= cfg.NumBlocks {
		release()
		return nil, nil, false, fmt.Errorf("%w: block id %d out of range [0, %d)", ErrOutOfRange, id, cfg.NumBlocks)
	}
	var start, end uint64 // the span being merged, [start, end)
	for layer := range cfg.NumLayers {
		for outer := range cfg.OuterDim {
			r := b.e.layout.Fragment(id, layer, outer)
			if end != 0 && r.Addr == end {
				end = r.End()
				continue
			}
			if end != 0 {
				spans = append(spans, storage.HostBytes(start, end-start))
			}
			start, end = r.Addr, r.End()
		}
	}
	if end != 0 {
		spans = append(spans, storage.HostBytes(start, end-start))
	}
	return spans, release, true, nil
}

func (b *BlockIO) move(id int, buf []byte, write bool) error {
	release, err := b.m.hold(b.e)
	if err != nil {
		return err
	}
	defer release()
	cfg := b.e.layout.Config()
	if id < 0 || id >= cfg.NumBlocks {
		return fmt.Errorf("%w: block id %d out of range [0, %d)", ErrOutOfRange, id, cfg.NumBlocks)
	}
	if len(buf) != cfg.BlockSize() {
		return fmt.Errorf("%w: block buffer is %d bytes, a block is %d", ErrInvalidArgument, len(buf), cfg.BlockSize())
	}
	host, hostID := b.e, id
	if !b.e.kind.IsHost() {
		stage, err := b.m.bounce.get(cfg)
		if err != nil {
			return err
		}
		defer b.m.bounce.put(stage)
		host, hostID = stage, 0
		if !write {
			if err := b.m.runHop(subPlan(b.e, stage, []int{id}, []int{0}, LayerRange{0, cfg.NumLayers}), Options{}); err != nil {
				return fmt.Errorf("read block %d: %w", id, err)
			}
		}
	}
	frag := uint64(cfg.FragmentSize())
	off := uint64(0)
	for layer := range cfg.NumLayers {
		for outer := range cfg.OuterDim {
			r := host.layout.Fragment(hostID, layer, outer)
			mem := storage.HostBytes(r.Addr, r.Size)
			if write {
				copy(mem, buf[off:off+frag])
			} else {
				copy(buf[off:off+frag], mem)
			}
			off += frag
		}
	}
	if write && host != b.e {
		if err := b.m.runHop(subPlan(host, b.e, []int{0}, []int{id}, LayerRange{0, cfg.NumLayers}), Options{}); err != nil {
			return fmt.Errorf("write block %d: %w", id, err)
		}
	}
	return nil
}
