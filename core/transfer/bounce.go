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

// warm allocates a bounce buffer of cfg's block shape unless the pool has
// one: a disk layout's first transfer to or from memory needs it, and
// pinned memory is made resident as it is allocated (tens of
// milliseconds for the default 16 blocks of 2 MiB), which would otherwise
// delay that transfer. Best effort: a failure here is met again, and
// reported, by the transfer that needs the buffer.
func (b *bouncePool) warm(cfg layout.Config) {
	if e, err := b.get(cfg); err == nil {
		b.put(e)
	}
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
// bounce → destination. The bounce is cut into slots of a few blocks
// (about chunkBytes, and at least two slots where it has two blocks); each
// slot carries one chunk at a time through both hops, and every free slot
// takes the next chunk at once, so that the first hop's medium (a disk, a
// peer) always has reads queued while earlier chunks take their second hop
// (on a 2-core machine, a barrier per group of chunks left the disk idle
// while the group's last checksum ran: 1.6 of its 2.1 GB/s). A slot is
// filled again only once its second hop is over. The bounce is shaped as
// the source, so a head slice is taken on the second hop.
func (m *Manager) twoHop(p *plan, opts Options) error {
	b, ids, release, err := m.bounceFor(p)
	if err != nil {
		return err
	}
	defer release()
	n := len(p.srcIDs)
	if opts.Precondition != 0 {
		// Every chunk's first hop waits for it; they run at once.
		if err := m.drv.EventSynchronize(opts.Precondition); err != nil {
			return fmt.Errorf("wait for precondition event: %w", err)
		}
	}
	perBlock := max(p.bytes()/uint64(max(n, 1)), 1)
	per := min(max(int(chunkBytes/perBlock), 1), max(len(ids)/2, 1)) // blocks a slot
	free := make(chan []int, len(ids)/per)
	for lo := 0; lo+per <= len(ids); lo += per {
		free <- ids[lo : lo+per]
	}
	var failed Failures
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += per {
		hi := min(lo+per, n)
		slot := <-free
		if p.ctx.Err() != nil {
			failed.addPlanRange(lo, hi, context.Cause(p.ctx))
			free <- slot
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { free <- slot; wg.Done() }()
			m.hopTwice(p, b, slot[:hi-lo], lo, hi, &failed)
		}()
	}
	wg.Wait()
	return failed.err()
}

// hopTwice carries plan blocks [lo, hi) through the bounce blocks staged:
// the first hop, then the second for the blocks whose first hop succeeded.
func (m *Manager) hopTwice(p *plan, b *entry, staged []int, lo, hi int, failed *Failures) {
	hop1 := subPlan(p.src, b, p.srcIDs[lo:hi], staged, p.layers)
	hop1.ctx = p.ctx
	err := m.runHop(hop1, Options{})
	if err != nil {
		failed.addPlanRange(lo, hi, fmt.Errorf("first hop (%v -> bounce): %w", p.src.kind, err))
	}
	// The bounce holds what an earlier transfer left there (another
	// request's bytes, perhaps): a block whose first hop failed is not
	// taken on its second, and its destination keeps its bytes.
	keep := hopSurvivors(err, hi-lo)
	if len(keep) == 0 {
		return
	}
	hop2 := headHop(p, b, p.dst, pick(staged, keep), pick(p.dstIDs[lo:hi], keep))
	hop2.ctx = p.ctx
	if err := m.startHop(hop2)(); err != nil {
		failed.addPlanPicked(lo, keep, fmt.Errorf("second hop (bounce -> %v): %w", p.dst.kind, err))
	}
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
