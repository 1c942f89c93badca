// Package worker is the per-GPU worker that executes transfers
// (PhysicalWorker), the leader's view of a worker (CoordinatedWorker), and
// the layout metadata workers export and import so that instances can pull
// blocks from each other.
package worker

import (
	"fmt"

	"github.com/kvbm/kvbm/core/transfer"
)

// Tier is a logical layout: which of a worker's layouts a transfer means.
type Tier uint8

const (
	// G1 is the engine's KV cache in GPU memory.
	G1 Tier = 1
	// G2 is pinned host memory.
	G2 Tier = 2
	// G3 is local disk.
	G3 Tier = 3
	// G4 is object storage; it has no layout handle.
	G4 Tier = 4
)

func (t Tier) String() string {
	switch t {
	case G1, G2, G3, G4:
		return fmt.Sprintf("G%d", uint8(t))
	}
	return fmt.Sprintf("Tier(%d)", uint8(t))
}

func (t Tier) valid() bool { return t >= G1 && t <= G3 }

// InstanceID names a serving instance (a leader) across the cluster.
type InstanceID uint64

// Handles are the layout handles of a worker's tiers; a zero handle means
// the tier is not registered.
type Handles struct {
	G1, G2, G3 *transfer.LayoutHandle
}

func (h Handles) get(t Tier) *transfer.LayoutHandle {
	switch t {
	case G1:
		return h.G1
	case G2:
		return h.G2
	case G3:
		return h.G3
	}
	return nil
}

func (h *Handles) slot(t Tier) **transfer.LayoutHandle {
	switch t {
	case G1:
		return &h.G1
	case G2:
		return &h.G2
	case G3:
		return &h.G3
	}
	return nil
}
