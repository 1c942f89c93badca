package transfer

import (
	"fmt"
)

// What a persistent disk layout (Config.DiskName) needs of the manager so
// that its owner can vouch for its blocks across runs: the checksums its
// writes recorded, and setting them again in a new run, after which a read
// of the block (a transfer, or BlockIO.ReadBlock) fails unless its bytes
// are what was written then.

// DiskChecksums is the CRC32C of each layer of block as last written, or
// an error wrapping ErrNotFound when a layer was never written.
func (m *Manager) DiskChecksums(h LayoutHandle, block int) ([]uint32, error) {
	e, err := m.diskEntry(h, block)
	if err != nil {
		return nil, err
	}
	out := make([]uint32, e.crc.layers)
	for layer := range out {
		crc, written := e.crc.get(block, layer)
		if !written {
			return nil, fmt.Errorf("%w: disk block %d layer %d was never written", ErrNotFound, block, layer)
		}
		out[layer] = crc
	}
	return out, nil
}

// RestoreDiskChecksums records crcs (one per layer) as block's: what an
// earlier run wrote there, by its owner's account.
func (m *Manager) RestoreDiskChecksums(h LayoutHandle, block int, crcs []uint32) error {
	e, err := m.diskEntry(h, block)
	if err != nil {
		return err
	}
	if len(crcs) != e.crc.layers {
		return fmt.Errorf("%w: %d checksums for disk block %d, the layout has %d layers", ErrInvalidArgument, len(crcs), block, e.crc.layers)
	}
	for layer, crc := range crcs {
		e.crc.set(block, layer, crc)
	}
	return nil
}

// DiskNamed reports whether h is a disk layout whose file outlives the
// process, and whether its bytes are an earlier run's.
func (m *Manager) DiskNamed(h LayoutHandle) (named, reused bool, err error) {
	e, err := m.diskEntry(h, 0)
	if err != nil {
		return false, false, err
	}
	return e.disk.Named(), e.disk.Reused(), nil
}

func (m *Manager) diskEntry(h LayoutHandle, block int) (*entry, error) {
	e, err := m.lookup(h)
	if err != nil {
		return nil, err
	}
	if e.disk == nil {
		return nil, fmt.Errorf("%w: layout %v is not a disk layout", ErrInvalidArgument, h)
	}
	if n := e.layout.Config().NumBlocks; block < 0 || block >= n {
		return nil, fmt.Errorf("%w: disk block %d, the layout has blocks [0, %d)", ErrOutOfRange, block, n)
	}
	return e, nil
}

// DiskDir is where disk layouts keep their files (Config.DiskDir).
func (m *Manager) DiskDir() string { return m.cfg.DiskDir }
