package transfer

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
)

// copyOp is one contiguous copy between two layouts' address spaces.
type copyOp struct {
	src, dst uint64
	size     uint64
}

// plan is a validated transfer: which blocks move where, as contiguous
// copies grouped by block.
type plan struct {
	src, dst       *entry
	srcIDs, dstIDs []int
	layers         LayerRange
	// heads, when set, moves a slice of each fragment's heads, of
	// headPage tokens of headBytes a head (the source's geometry, which a
	// bounce buffer's own shape need not show).
	heads               *layout.HeadSlice
	headPage, headBytes int
	ops                 []copyOp
	// blockOps[i] is the index in ops of block i's first copy; block i's
	// copies are ops[blockOps[i]:blockOps[i+1]].
	blockOps []int
	// bounce and bounceIDs are the caller's bounce buffer of a two-hop
	// plan, once validated.
	bounce    *entry
	bounceIDs []int
	// ctx ends when the transfer is canceled or its deadline passes; it
	// bounds remote operations. Never nil.
	ctx context.Context
	// Room for a one-block plan's copy and block index, so that a small
	// transfer's plan is one allocation.
	opsBuf      [1]copyOp
	blockOpsBuf [2]int
}

// prepare validates a request before any byte moves, naming the argument
// and the value that is wrong.
func (m *Manager) prepare(src, dst LayoutHandle, srcIDs, dstIDs []int, opts Options) (*plan, error) {
	p := new(plan)
	if err := m.prepareInto(p, src, dst, srcIDs, dstIDs, opts); err != nil {
		return nil, err
	}
	return p, nil
}

// prepareInto is prepare into a new, zero plan the caller allocated
// (ExecuteTransfer allocates it with the notification, in one piece).
func (m *Manager) prepareInto(p *plan, src, dst LayoutHandle, srcIDs, dstIDs []int, opts Options) error {
	se, err := m.lookup(src)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	de, err := m.lookup(dst)
	if err != nil {
		return fmt.Errorf("destination: %w", err)
	}
	if len(srcIDs) != len(dstIDs) {
		return fmt.Errorf("%w: %d source block ids but %d destination block ids", ErrInvalidArgument, len(srcIDs), len(dstIDs))
	}
	sc, dc := se.layout.Config(), de.layout.Config()
	if opts.Heads != nil {
		if err := opts.Heads.Check(sc, dc); err != nil {
			return fmt.Errorf("%w: %v -> %v: %w", ErrInvalidArgument, src, dst, err)
		}
		if se.kind == storage.Disk || de.kind == storage.Disk {
			return fmt.Errorf("%w: %v -> %v: a head slice moves between memory layouts only (a disk block's checksum covers all its heads)",
				ErrUnsupported, src, dst)
		}
	} else if err := sc.Compatible(dc); err != nil {
		return fmt.Errorf("%w: %v -> %v: %w", ErrInvalidArgument, src, dst, err)
	}
	layers, err := opts.Layers.resolve(sc.NumLayers)
	if err != nil {
		return err
	}
	if err := checkIDs("source", srcIDs, sc.NumBlocks, false); err != nil {
		return err
	}
	if err := checkIDs("destination", dstIDs, dc.NumBlocks, true); err != nil {
		return err
	}
	if src == dst {
		in := make(map[int]struct{}, len(srcIDs))
		for _, id := range srcIDs {
			in[id] = struct{}{}
		}
		for _, id := range dstIDs {
			if _, ok := in[id]; ok {
				return fmt.Errorf("%w: block %d is both a source and a destination in layout %v", ErrInvalidArgument, id, src)
			}
		}
	}
	// Field by field: p is new and zero, and a struct copy would pay the
	// garbage collector's bulk write barrier.
	p.src, p.dst, p.srcIDs, p.dstIDs, p.layers, p.ctx = se, de, srcIDs, dstIDs, layers, context.Background()
	if p.heads = opts.Heads; p.heads != nil {
		p.headPage, p.headBytes = sc.PageSize, p.heads.Src.HeadBytes(sc)
	}
	p.build()
	return nil
}

func checkIDs(what string, ids []int, numBlocks int, unique bool) error {
	var seen map[int]int
	if unique && len(ids) > smallIDs {
		seen = make(map[int]int, len(ids))
	}
	for i, id := range ids {
		if id < 0 || id >= numBlocks {
			return fmt.Errorf("%w: %s block id %d (index %d) out of range [0, %d)", ErrOutOfRange, what, id, i, numBlocks)
		}
		if !unique {
			continue
		}
		j, dup := -1, false
		if seen == nil { // few ids: a scan costs less than a map
			j = slices.Index(ids[:i], id)
			dup = j >= 0
		} else if j, dup = seen[id]; !dup {
			seen[id] = i
		}
		if dup {
			return fmt.Errorf("%w: %s block id %d appears twice (indices %d and %d)", ErrInvalidArgument, what, id, j, i)
		}
	}
	return nil
}

// smallIDs is the longest id list checked for duplicates by a scan.
const smallIDs = 32

// build lists the copies: whole blocks when both layouts are fully
// contiguous and every layer moves, otherwise one copy per (block, layer,
// outer) fragment (or per piece of a head slice), merged where both sides
// are adjacent.
func (p *plan) build() {
	sl, dl := p.src.layout, p.dst.layout
	cfg := sl.Config()
	if p.heads != nil {
		p.buildHeads()
		return
	}
	whole := sl.IsBlockContiguous() && dl.IsBlockContiguous() && p.layers.Start == 0 && p.layers.End == cfg.NumLayers
	perBlock := 1
	if !whole {
		perBlock = (p.layers.End - p.layers.Start) * cfg.OuterDim
	}
	if n := len(p.srcIDs) * perBlock; n <= len(p.opsBuf) {
		p.ops = p.opsBuf[:0]
	} else {
		p.ops = make([]copyOp, 0, n)
	}
	if n := len(p.srcIDs) + 1; n <= len(p.blockOpsBuf) {
		p.blockOps = p.blockOpsBuf[:n]
	} else {
		p.blockOps = make([]int, n)
	}
	for i := range p.srcIDs {
		p.blockOps[i] = len(p.ops)
		if whole {
			s, _ := sl.BlockRegion(p.srcIDs[i])
			d, _ := dl.BlockRegion(p.dstIDs[i])
			p.ops = append(p.ops, copyOp{src: s.Addr, dst: d.Addr, size: s.Size})
			continue
		}
		first := len(p.ops)
		for layer := p.layers.Start; layer < p.layers.End; layer++ {
			for outer := 0; outer < cfg.OuterDim; outer++ {
				s := sl.Fragment(p.srcIDs[i], layer, outer)
				d := dl.Fragment(p.dstIDs[i], layer, outer)
				p.ops = appendMerged(p.ops, first, copyOp{src: s.Addr, dst: d.Addr, size: s.Size})
			}
		}
	}
	p.blockOps[len(p.srcIDs)] = len(p.ops)
}

// buildHeads is build for a head slice: the slice's pieces of every
// (block, layer, outer) fragment.
func (p *plan) buildHeads() {
	sl, dl := p.src.layout, p.dst.layout
	sc := sl.Config()
	var pieces []copyOp // of one fragment, relative to its start on each side
	p.heads.Pieces(p.headPage, p.headBytes, func(so, do, size uint64) {
		pieces = append(pieces, copyOp{src: so, dst: do, size: size})
	})
	p.ops = make([]copyOp, 0, len(p.srcIDs)*(p.layers.End-p.layers.Start)*sc.OuterDim*len(pieces))
	p.blockOps = make([]int, len(p.srcIDs)+1)
	for i := range p.srcIDs {
		p.blockOps[i] = len(p.ops)
		first := len(p.ops)
		for layer := p.layers.Start; layer < p.layers.End; layer++ {
			for outer := 0; outer < sc.OuterDim; outer++ {
				s := sl.Fragment(p.srcIDs[i], layer, outer)
				d := dl.Fragment(p.dstIDs[i], layer, outer)
				for _, pc := range pieces {
					p.ops = appendMerged(p.ops, first, copyOp{src: s.Addr + pc.src, dst: d.Addr + pc.dst, size: pc.size})
				}
			}
		}
	}
	p.blockOps[len(p.srcIDs)] = len(p.ops)
}

// appendMerged appends op to ops, merged into the last copy when both
// sides continue it and that copy is one of this block's (from first on).
func appendMerged(ops []copyOp, first int, op copyOp) []copyOp {
	if n := len(ops); n > first {
		if last := &ops[n-1]; last.src+last.size == op.src && last.dst+last.size == op.dst {
			last.size += op.size
			return ops
		}
	}
	return append(ops, op)
}

// blockCopies returns block i's copies.
func (p *plan) blockCopies(i int) []copyOp { return p.ops[p.blockOps[i]:p.blockOps[i+1]] }

// bytes is the number of bytes the plan moves.
func (p *plan) bytes() uint64 {
	var n uint64
	for _, op := range p.ops {
		n += op.size
	}
	return n
}

// result turns an executor's error into the notification's: every
// destination block fails unless the executor said which.
func (p *plan) result(err error) error {
	if err == nil {
		return nil
	}
	var failed []int
	var bf *blockFailure
	if errors.As(err, &bf) {
		for _, i := range bf.indices {
			failed = append(failed, p.dstIDs[i])
		}
	} else {
		failed = append(failed, p.dstIDs...)
	}
	return &Error{Src: p.src.handle, Dst: p.dst.handle, FailedBlocks: failed, Err: err}
}

// subPlan plans one hop of a two-hop transfer, between entries the caller
// has already validated.
func subPlan(src, dst *entry, srcIDs, dstIDs []int, layers LayerRange) *plan {
	p := &plan{src: src, dst: dst, srcIDs: srcIDs, dstIDs: dstIDs, layers: layers, ctx: context.Background()}
	p.build()
	return p
}

// headHop plans the hop of a two-hop transfer that takes of's head slice,
// in of's geometry (src holds of's source fragments under its own shape).
func headHop(of *plan, src, dst *entry, srcIDs, dstIDs []int) *plan {
	p := &plan{src: src, dst: dst, srcIDs: srcIDs, dstIDs: dstIDs, layers: of.layers, ctx: context.Background(),
		heads: of.heads, headPage: of.headPage, headBytes: of.headBytes}
	p.build()
	return p
}
