package transfer

import (
	"errors"
	"fmt"
	"io"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
)

// Shape is how a layout arranges blocks: its kind and, for LayerSeparate,
// where the block dimension sits.
type Shape struct {
	Kind     layout.Kind
	BlockDim layout.BlockDim
}

// FullyContiguous is the shape of one region [block][layer][outer][page][inner].
var FullyContiguous = Shape{Kind: layout.FullyContiguous}

// AllocateLayout allocates storage of the given kind for a layout and
// registers it. Disk layouts get one file in Config.DiskDir, with blocks
// aligned to 4 KiB for O_DIRECT.
func (m *Manager) AllocateLayout(kind storage.Kind, cfg layout.Config, shape Shape) (LayoutHandle, error) {
	if kind == storage.Disk {
		cfg.Alignment = max(cfg.Alignment, storage.DirectIOAlignment)
	}
	sizes, err := layout.RegionSizes(cfg, shape.Kind, shape.BlockDim)
	if err != nil {
		return LayoutHandle{}, fmt.Errorf("%w: allocate %v layout: %w", ErrInvalidArgument, kind, err)
	}
	var total uint64
	offsets := make([]uint64, len(sizes))
	for i, s := range sizes {
		offsets[i] = total
		total += alignUp(s, storage.DirectIOAlignment)
	}

	e := &entry{kind: kind, device: m.cfg.Device}
	var base uint64
	switch kind {
	case storage.System, storage.Pinned, storage.Device:
		var mem *storage.Memory
		switch kind {
		case storage.System, storage.Pinned:
			mem, err = m.allocHost(kind, total)
			if kind == storage.System {
				e.device = -1
			}
		default:
			mem, err = storage.AllocDevice(m.drv, m.cfg.Device, total)
		}
		if err != nil {
			return LayoutHandle{}, err
		}
		e.owned = append(e.owned, mem)
		base = mem.Addr()
	case storage.Disk:
		if m.cfg.DiskDir == "" {
			return LayoutHandle{}, fmt.Errorf("%w: allocate disk layout: the worker has no disk directory configured", ErrInvalidArgument)
		}
		var d *storage.DiskFile
		if m.cfg.DiskName != "" {
			d, err = storage.OpenNamedDiskFile(m.cfg.DiskDir, m.cfg.DiskName, total)
		} else {
			d, err = storage.CreateDiskFile(m.cfg.DiskDir, total)
		}
		if err != nil {
			return LayoutHandle{}, fmt.Errorf("allocate disk layout: %w", err)
		}
		e.owned = append(e.owned, d)
		e.disk = d
		e.crc = newChecksums(cfg.NumBlocks, cfg.NumLayers)
		m.bounce.warm(cfg)
	default:
		return LayoutHandle{}, fmt.Errorf("%w: allocate layout: unknown storage kind %v", ErrInvalidArgument, kind)
	}
	bases := make([]uint64, len(offsets))
	for i, off := range offsets {
		bases[i] = base + off
	}
	return m.register(e, cfg, shape, bases)
}

// RegisterExternal registers memory the caller owns — the engine's KV cache
// tensors — as a layout: one pointer for FullyContiguous, one per layer for
// LayerSeparate. Device memory is declared to the driver; host memory of
// kind Pinned is pinned with the driver (System is used as is). The memory
// must outlive the registration.
func (m *Manager) RegisterExternal(kind storage.Kind, cfg layout.Config, shape Shape, ptrs []uint64) (LayoutHandle, error) {
	sizes, err := layout.RegionSizes(cfg, shape.Kind, shape.BlockDim)
	if err != nil {
		return LayoutHandle{}, fmt.Errorf("%w: register external layout: %w", ErrInvalidArgument, err)
	}
	if len(ptrs) != len(sizes) {
		return LayoutHandle{}, fmt.Errorf("%w: register external %v layout: %d pointers given, the shape needs %d",
			ErrInvalidArgument, shape.Kind, len(ptrs), len(sizes))
	}
	// The engine may take its memory back while the worker lives: the
	// layout can be withdrawn (withdraw.go).
	e := &entry{kind: kind, device: m.cfg.Device, gate: newInflight()}
	for i, p := range ptrs {
		if p == 0 {
			return LayoutHandle{}, errors.Join(fmt.Errorf("%w: register external layout: pointer %d is NULL", ErrInvalidArgument, i), e.release())
		}
		var mem io.Closer
		switch kind {
		case storage.Device:
			mem, err = storage.RegisterDevice(m.drv, m.cfg.Device, p, sizes[i])
		case storage.Pinned:
			mem, err = storage.RegisterPinned(m.drv, m.cfg.Device, p, sizes[i])
		case storage.System:
			e.device = -1
		default:
			err = fmt.Errorf("%w: register external layout: storage kind %v cannot be registered by pointer", ErrInvalidArgument, kind)
		}
		if err != nil {
			return LayoutHandle{}, errors.Join(err, e.release())
		}
		if mem != nil {
			e.owned = append(e.owned, mem)
		}
	}
	e.leaveWith = func() { e.gate.leave(); m.inflight.leave() }
	return m.register(e, cfg, shape, ptrs)
}

// register lays the layout over its regions and enters it in the
// registry; on failure it releases what e owns.
func (m *Manager) register(e *entry, cfg layout.Config, shape Shape, bases []uint64) (LayoutHandle, error) {
	l, err := layout.New(cfg, shape.Kind, shape.BlockDim, bases)
	if err == nil {
		e.layout = l
		var h LayoutHandle
		if h, err = m.insert(e); err == nil {
			return h, nil
		}
	}
	return LayoutHandle{}, errors.Join(err, e.release())
}

func alignUp(n, a uint64) uint64 { return (n + a - 1) &^ (a - 1) }
