package transfer

import (
	"fmt"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/cuda"
)

// strategy is how bytes move between two kinds of storage.
type strategy uint8

const (
	// hostCopy: memcpy, parallel over the bounded host pool.
	hostCopy strategy = iota + 1
	// deviceCopy: async copies on a device stream (H2D, D2H, D2D).
	deviceCopy
	// diskWrite: pwrite from host memory, with checksums recorded.
	diskWrite
	// diskRead: pread into host memory, with checksums verified.
	diskRead
	// twoHop: through a pinned bounce buffer (disk↔device, disk↔disk, and
	// another process's memory ↔ device or disk).
	twoHop
	// remoteRead: a peer's memory into host memory, through its transport.
	remoteRead
	// remoteWrite: host memory into a peer's memory.
	remoteWrite
)

func (s strategy) String() string {
	return [...]string{"?", "host memcpy", "device copy", "disk write", "disk read", "two hops via bounce", "remote read", "remote write"}[s]
}

// strategyOf is the strategy between two layouts: through the transport
// where one lives in another process, otherwise by their storage kinds.
func strategyOf(src, dst *entry) (strategy, cuda.CopyKind, error) {
	switch {
	case src.remote != nil && dst.remote != nil:
		return 0, 0, fmt.Errorf("%w: %v -> %v: both layouts live in other processes; move blocks between a peer and this worker",
			ErrUnsupported, src.handle, dst.handle)
	case src.remote != nil && dst.kind.IsHost():
		return remoteRead, 0, nil
	case dst.remote != nil && src.kind.IsHost():
		return remoteWrite, 0, nil
	case src.remote != nil || dst.remote != nil:
		return twoHop, 0, nil
	}
	return strategyFor(src.kind, dst.kind)
}

// strategyFor is the strategy table: one entry per (source, destination)
// storage kind pair.
func strategyFor(src, dst storage.Kind) (strategy, cuda.CopyKind, error) {
	switch {
	case src.IsHost() && dst.IsHost():
		return hostCopy, 0, nil
	case src == storage.Pinned && dst == storage.Device:
		return deviceCopy, cuda.HostToDevice, nil
	case src == storage.Device && dst == storage.Pinned:
		return deviceCopy, cuda.DeviceToHost, nil
	case src == storage.Device && dst == storage.Device:
		return deviceCopy, cuda.DeviceToDevice, nil
	case src == storage.System && dst == storage.Device, src == storage.Device && dst == storage.System:
		return 0, 0, fmt.Errorf("%w: %v -> %v: system memory is not pinned, so the device cannot copy it; use a pinned (G2) layout",
			ErrUnsupported, src, dst)
	case src.IsHost() && dst == storage.Disk:
		return diskWrite, 0, nil
	case src == storage.Disk && dst.IsHost():
		return diskRead, 0, nil
	case src == storage.Disk && (dst == storage.Device || dst == storage.Disk), src == storage.Device && dst == storage.Disk:
		return twoHop, 0, nil
	}
	return 0, 0, fmt.Errorf("%w: no transfer strategy from %v to %v", ErrUnsupported, src, dst)
}
