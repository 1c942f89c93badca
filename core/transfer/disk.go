package transfer

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/internal/crc32c"
)

// checksums holds a CRC32C for every (block, layer) of a disk layout: the
// checksum of the layer's outer fragments in order, as written. A block
// fails on read when any of its layers does not match.
type checksums struct {
	layers int
	// bit 32 set = written; low 32 bits = CRC32C.
	v []atomic.Uint64
}

func newChecksums(blocks, layers int) *checksums {
	return &checksums{layers: layers, v: make([]atomic.Uint64, blocks*layers)}
}

func (c *checksums) set(block, layer int, crc uint32) {
	c.v[block*c.layers+layer].Store(1<<32 | uint64(crc))
}

func (c *checksums) get(block, layer int) (uint32, bool) {
	v := c.v[block*c.layers+layer].Load()
	return uint32(v), v&(1<<32) != 0
}

// layerCRC is the CRC32C of one block's layer in a host layout.
func layerCRC(e *entry, block, layer int) uint32 {
	var crc uint32
	for outer := 0; outer < e.layout.Config().OuterDim; outer++ {
		r := e.layout.Fragment(block, layer, outer)
		crc = crc32c.Update(crc, storage.HostBytes(r.Addr, r.Size))
	}
	return crc
}

// writeDisk writes host blocks to a disk layout and records their checksums.
// Blocks adjacent on both sides go in one request (coalesce).
func (m *Manager) writeDisk(p *plan) error {
	disk := p.dst
	return forEachChunk(m.disk, p, func(lo, hi int, failed *Failures) {
		for _, r := range coalesce(p, lo, hi) {
			if err := disk.disk.WriteAt(storage.HostBytes(r.op.src, r.op.size), r.op.dst); err != nil {
				// Block by block, so that only the blocks that fail are named.
				for i := r.first; i < r.end; i++ {
					if err := m.writeDiskBlock(p, i); err != nil {
						failed.Add(err, i)
						continue
					}
					for layer := p.layers.Start; layer < p.layers.End; layer++ {
						disk.crc.set(p.dstIDs[i], layer, layerCRC(p.src, p.srcIDs[i], layer))
					}
				}
				continue
			}
			for i := r.first; i < r.end; i++ {
				for layer := p.layers.Start; layer < p.layers.End; layer++ {
					disk.crc.set(p.dstIDs[i], layer, layerCRC(p.src, p.srcIDs[i], layer))
				}
			}
		}
	})
}

func (m *Manager) writeDiskBlock(p *plan, i int) error {
	for _, op := range p.blockCopies(i) {
		if err := p.dst.disk.WriteAt(storage.HostBytes(op.src, op.size), op.dst); err != nil {
			return fmt.Errorf("disk block %d: %w", p.dstIDs[i], err)
		}
	}
	return nil
}

// diskRun is one disk request: a copy covering the plan's blocks first to
// end-1, whole.
type diskRun struct {
	op         copyOp
	first, end int
}

// maxDiskRequest caps a coalesced request: small blocks merge into
// requests of about this size, larger blocks stay one request each (on the
// disks measured here, requests above a few MiB were no faster and
// sometimes slower than 2 MiB ones).
const maxDiskRequest = 1 << 20

// coalesce merges the copies of blocks lo to hi-1 into as few requests as
// possible: a block's copies join the previous request when both its
// source and destination continue it and the request stays within
// maxDiskRequest. A request holds whole blocks only, so that a failed one
// names exactly its blocks.
func coalesce(p *plan, lo, hi int) []diskRun {
	var runs []diskRun
	for i := lo; i < hi; i++ {
		ops := p.blockCopies(i)
		if len(ops) == 1 && len(runs) > 0 {
			last := &runs[len(runs)-1]
			if last.end == i && last.op.src+last.op.size == ops[0].src && last.op.dst+last.op.size == ops[0].dst &&
				last.op.size+ops[0].size <= maxDiskRequest {
				last.op.size += ops[0].size
				last.end = i + 1
				continue
			}
		}
		if len(ops) == 1 {
			runs = append(runs, diskRun{op: ops[0], first: i, end: i + 1})
			continue
		}
		for _, op := range ops { // a block of several ranges: one request each, not merged
			runs = append(runs, diskRun{op: op, first: i, end: i + 1})
		}
	}
	return runs
}

// readDisk reads disk blocks into a host layout and checks every layer
// read against the checksum recorded when it was written. Blocks adjacent
// on both sides come in one request (coalesce).
func (m *Manager) readDisk(p *plan) error {
	disk := p.src
	return forEachChunk(m.disk, p, func(lo, hi int, failed *Failures) {
		bad := map[int]bool{}
		for _, r := range coalesce(p, lo, hi) {
			if err := disk.disk.ReadAt(storage.HostBytes(r.op.dst, r.op.size), r.op.src); err != nil {
				// Block by block, so that only the blocks that fail are named.
				for i := r.first; i < r.end; i++ {
					for _, op := range p.blockCopies(i) {
						if err := disk.disk.ReadAt(storage.HostBytes(op.dst, op.size), op.src); err != nil {
							failed.Add(diskReadError(p.srcIDs[i], err), i)
							bad[i] = true
							break
						}
					}
				}
			}
		}
	blocks:
		for i := lo; i < hi; i++ {
			if bad[i] {
				continue
			}
			for layer := p.layers.Start; layer < p.layers.End; layer++ {
				want, written := disk.crc.get(p.srcIDs[i], layer)
				if !written {
					continue // never written: zeros, nothing to check
				}
				if got := layerCRC(p.dst, p.dstIDs[i], layer); got != want {
					failed.Add(fmt.Errorf("%w: disk block %d layer %d: crc32c %08x, written as %08x",
						ErrCorrupt, p.srcIDs[i], layer, got, want), i)
					continue blocks
				}
			}
		}
	})
}

// diskReadError names the disk block a read failed for. A file cut short
// no longer holds what was written to it: its blocks are corrupt data, like
// a checksum mismatch, not a failure of the machinery.
func diskReadError(block int, err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: disk block %d: %w", ErrCorrupt, block, err)
	}
	return fmt.Errorf("disk block %d: %w", block, err)
}
