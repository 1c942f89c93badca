package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
)

// bouncePool keeps pinned staging layouts for two-hop transfers that bring
// no bounce buffer of their own, one free list per block shape.
type bouncePool struct {
	m    *Manager
	mu   sync.Mutex
	free map[bounceShape][]*entry
	all  []*entry
}

type bounceShape struct{ layers, outer, fragment int }

func (b *bouncePool) get(cfg layout.Config) (*entry, error) {
	shape := bounceShape{cfg.NumLayers, cfg.OuterDim, cfg.FragmentSize()}
	b.mu.Lock()
	if list := b.free[shape]; len(list) > 0 {
		e := list[len(list)-1]
		b.free[shape] = list[:len(list)-1]
		b.mu.Unlock()
		return e, nil
	}
	b.mu.Unlock()

	bcfg := layout.Config{NumBlocks: b.m.cfg.BounceBlocks, NumLayers: cfg.NumLayers, OuterDim: cfg.OuterDim,
		PageSize: 1, InnerDim: cfg.FragmentSize(), DtypeWidth: 1, Alignment: storage.DirectIOAlignment}
	sizes, err := layout.RegionSizes(bcfg, layout.FullyContiguous, 0)
	if err != nil {
		return nil, fmt.Errorf("bounce buffer: %w", err)
	}
	mem, err := storage.AllocPinned(b.m.drv, b.m.cfg.Device, sizes[0])
	if err != nil {
		return nil, fmt.Errorf("bounce buffer: %w", err)
	}
	l, err := layout.NewFullyContiguous(bcfg, mem.Addr())
	if err != nil {
		return nil, errors.Join(err, mem.Close())
	}
	e := &entry{layout: l, kind: storage.Pinned, device: b.m.cfg.Device, owned: []io.Closer{mem}}
	b.mu.Lock()
	b.all = append(b.all, e)
	b.mu.Unlock()
	return e, nil
}

func (b *bouncePool) put(e *entry) {
	c := e.layout.Config()
	shape := bounceShape{c.NumLayers, c.OuterDim, c.FragmentSize()}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.free == nil {
		b.free = map[bounceShape][]*entry{}
	}
	b.free[shape] = append(b.free[shape], e)
}

func (b *bouncePool) close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for _, e := range b.all {
		errs = append(errs, e.release())
	}
	b.all, b.free = nil, nil
	return errors.Join(errs...)
}

// bounceFor returns the bounce buffer of a two-hop plan: the caller's,
// validated in ExecuteTransfer, or one from the pool, which release returns.
func (m *Manager) bounceFor(p *plan) (e *entry, ids []int, release func(), err error) {
	if p.bounce != nil {
		return p.bounce, p.bounceIDs, func() {}, nil
	}
	e, err = m.bounce.get(p.src.layout.Config())
	if err != nil {
		return nil, nil, nil, err
	}
	ids = make([]int, e.layout.Config().NumBlocks)
	for i := range ids {
		ids[i] = i
	}
	return e, ids, func() { m.bounce.put(e) }, nil
}

// callerBounce validates a bounce buffer the caller named.
func (m *Manager) callerBounce(p *plan, b *Bounce) (*entry, []int, error) {
	if b.Handle == p.src.handle || b.Handle == p.dst.handle {
		return nil, nil, fmt.Errorf("%w: bounce layout %v is the source or destination", ErrInvalidArgument, b.Handle)
	}
	e, err := m.lookup(b.Handle)
	if err != nil {
		return nil, nil, fmt.Errorf("bounce: %w", err)
	}
	if e.kind != storage.Pinned {
		return nil, nil, fmt.Errorf("%w: bounce layout %v is %v memory, it must be pinned", ErrInvalidArgument, b.Handle, e.kind)
	}
	if err := p.src.layout.Config().Compatible(e.layout.Config()); err != nil {
		return nil, nil, fmt.Errorf("%w: bounce layout %v: %w", ErrInvalidArgument, b.Handle, err)
	}
	if len(b.BlockIDs) == 0 {
		return nil, nil, fmt.Errorf("%w: bounce buffer has no block ids", ErrInvalidArgument)
	}
	if err := checkIDs("bounce", b.BlockIDs, e.layout.Config().NumBlocks, true); err != nil {
		return nil, nil, err
	}
	return e, b.BlockIDs, nil
}

// twoHop moves a plan through a bounce buffer: source → bounce, then
// bounce → destination. The bounce is used as two halves, so that a chunk's
// second hop runs while the next chunk's first hop fills the other half (a
// disk read beside a device copy); a half is filled again only once its
// second hop is over (a bounce of one block is one half: one chunk at a
// time). The bounce is shaped as the source, so a head slice
// is taken on the second hop.
func (m *Manager) twoHop(p *plan, opts Options) error {
	b, ids, release, err := m.bounceFor(p)
	if err != nil {
		return err
	}
	defer release()
	halves := [][]int{ids}
	if len(ids) >= 2 {
		halves = [][]int{ids[:len(ids)/2], ids[len(ids)/2:]}
	}
	var failed Failures
	hop1Opts := Options{Precondition: opts.Precondition}
	var pending func() // the second hop in flight, recording its failures
	for lo, c := 0, 0; lo < len(p.srcIDs); c++ {
		half := halves[c%len(halves)]
		hi := min(lo+len(half), len(p.srcIDs))
		staged := half[:hi-lo]
		if p.ctx.Err() != nil {
			failed.addPlanRange(lo, hi, context.Cause(p.ctx))
			lo = hi
			continue
		}
		if pending != nil && len(halves) == 1 { // one half: its second hop reads it still
			pending()
			pending = nil
		}
		hop1 := subPlan(p.src, b, p.srcIDs[lo:hi], staged, p.layers)
		hop1.ctx = p.ctx
		err := m.runHop(hop1, hop1Opts)
		hop1Opts.Precondition = 0
		if err != nil {
			failed.addPlanRange(lo, hi, fmt.Errorf("first hop (%v -> bounce): %w", p.src.kind, err))
		}
		if pending != nil {
			pending()
			pending = nil
		}
		// The bounce holds what an earlier transfer left there (another
		// request's bytes, perhaps): a block whose first hop failed is not
		// taken on its second, and its destination keeps its bytes.
		if keep := hopSurvivors(err, hi-lo); len(keep) > 0 {
			hop2 := headHop(p, b, p.dst, pick(staged, keep), pick(p.dstIDs[lo:hi], keep))
			hop2.ctx = p.ctx
			wait := m.startHop(hop2)
			from := lo
			pending = func() {
				if err := wait(); err != nil {
					failed.addPlanPicked(from, keep, fmt.Errorf("second hop (bounce -> %v): %w", p.dst.kind, err))
				}
			}
		}
		lo = hi
	}
	if pending != nil {
		pending()
	}
	return failed.err()
}

// startHop starts one single-hop plan and returns the wait for it: a device
// copy is enqueued, any other hop runs on a goroutine of its own.
func (m *Manager) startHop(p *plan) (wait func() error) {
	if strat, kind, err := strategyOf(p.src, p.dst); err == nil && strat == deviceCopy {
		wait, err := m.enqueueDevice(p, kind, Options{})
		if err != nil {
			return func() error { return err }
		}
		return wait
	}
	done := make(chan error, 1)
	go func() { done <- m.runHop(p, Options{}) }()
	return func() error { return <-done }
}

// runHop executes one single-hop plan and waits for it.
func (m *Manager) runHop(p *plan, opts Options) error {
	strat, kind, err := strategyOf(p.src, p.dst)
	if err != nil {
		return err
	}
	if strat == deviceCopy {
		wait, err := m.enqueueDevice(p, kind, opts)
		if err != nil {
			return err
		}
		return wait()
	}
	if opts.Precondition != 0 {
		if err := m.drv.EventSynchronize(opts.Precondition); err != nil {
			return fmt.Errorf("wait for precondition event: %w", err)
		}
	}
	switch strat {
	case hostCopy:
		return m.copyHost(p)
	case diskWrite:
		return m.writeDisk(p)
	case diskRead:
		return m.readDisk(p)
	case remoteRead, remoteWrite:
		return m.moveRemote(p, strat == remoteWrite)
	}
	return fmt.Errorf("%w: %v is not a single hop", ErrUnsupported, strat)
}
