package transfer

import (
	"context"
	"fmt"
)

// moveRemote moves a plan between host memory here and a peer's memory,
// chunk by chunk on the net pool, each chunk one operation of the peer's
// transport bounded by the remote deadline. A chunk that fails names its
// blocks; the others still complete. When the transfer is canceled (its
// context ends) the operations in flight stop and those not started fail.
func (m *Manager) moveRemote(p *plan, write bool) error {
	mem, h := p.src.remote, p.src.handle
	if write {
		mem, h = p.dst.remote, p.dst.handle
	}
	var most uint64 // the peer's preferred size; 0: none
	if s, ok := mem.(OpSizer); ok {
		most = s.OpBytes()
	}
	return forEachChunkOf(m.net, remoteChunkBytes(p.bytes(), m.cfg.NetWorkers, most), p, func(lo, hi int, failed *Failures) {
		ops := make([]RemoteOp, 0, p.blockOps[hi]-p.blockOps[lo])
		for _, op := range p.ops[p.blockOps[lo]:p.blockOps[hi]] {
			if write {
				ops = append(ops, RemoteOp{Remote: op.dst, Local: op.src, Size: op.size})
			} else {
				ops = append(ops, RemoteOp{Remote: op.src, Local: op.dst, Size: op.size})
			}
		}
		var err error
		if p.ctx.Err() != nil {
			err = context.Cause(p.ctx) // canceled before it started
		} else {
			ctx, cancel := context.WithTimeout(p.ctx, m.cfg.RemoteDeadline)
			if write {
				err = mem.Write(ctx, h, ops)
			} else {
				err = mem.Read(ctx, h, ops)
			}
			cancel()
			if err != nil && p.ctx.Err() != nil {
				err = fmt.Errorf("%w (%w)", context.Cause(p.ctx), err)
			}
		}
		if err != nil {
			for i := lo; i < hi; i++ {
				failed.Add(err, i)
			}
		}
	})
}

// remoteChunkBytes is the size of a transfer's operations on a peer whose
// operations are best up to most bytes (0: no preference): total spread
// over the net workers, so that each gets one, within [chunkBytes, most];
// chunkBytes when most is less.
func remoteChunkBytes(total uint64, workers int, most uint64) uint64 {
	return max(min(total/uint64(max(workers, 1)), most), chunkBytes)
}
