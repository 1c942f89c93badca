package transfer

import (
	"sync"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/internal/memcopy"
)

// hostPool runs host copies, or disk I/O, on a fixed number of goroutines,
// so that however many transfers are in flight, CPU and disk work stays
// bounded.
type hostPool struct {
	tasks chan func()
	wg    sync.WaitGroup
}

func newHostPool(workers int) *hostPool {
	p := &hostPool{tasks: make(chan func())}
	p.wg.Add(workers)
	for range workers {
		go func() {
			defer p.wg.Done()
			for task := range p.tasks {
				task()
			}
		}()
	}
	return p
}

// run calls fn(0) … fn(n-1) on the pool and waits for all of them.
func (p *hostPool) run(n int, fn func(i int)) {
	if n == 1 {
		fn(0)
		return
	}
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n {
		p.tasks <- func() { defer wg.Done(); fn(i) }
	}
	wg.Wait()
}

func (p *hostPool) close() {
	close(p.tasks)
	p.wg.Wait()
}

// chunkBytes is the work one pool task takes: large enough to amortize the
// hand-off, small enough to spread a transfer over every worker.
const chunkBytes = 4 << 20

// forEachChunk splits a plan's blocks into chunks of about chunkBytes and
// runs fn over each chunk on pool; fn records the indices of blocks that
// failed, and why, in failed. The result is one blockFailure, or nil.
func forEachChunk(pool *hostPool, p *plan, fn func(lo, hi int, failed *Failures)) error {
	return forEachChunkOf(pool, chunkBytes, p, fn)
}

// forEachChunkOf is forEachChunk with chunks of about size bytes.
func forEachChunkOf(pool *hostPool, size uint64, p *plan, fn func(lo, hi int, failed *Failures)) error {
	n := len(p.srcIDs)
	if n == 0 {
		return nil
	}
	perBlock := max(p.bytes()/uint64(n), 1)
	blocksPerChunk := int(max(size/perBlock, 1))
	chunks := (n + blocksPerChunk - 1) / blocksPerChunk
	var failed Failures
	pool.run(chunks, func(c int) {
		lo := c * blocksPerChunk
		fn(lo, min(lo+blocksPerChunk, n), &failed)
	})
	return failed.err()
}

// copyHost moves a plan between two host layouts with memcpy.
func (m *Manager) copyHost(p *plan) error {
	return forEachChunk(m.host, p, func(lo, hi int, _ *Failures) {
		for i := lo; i < hi; i++ {
			for _, op := range p.blockCopies(i) {
				memcopy.Copy(storage.HostBytes(op.dst, op.size), storage.HostBytes(op.src, op.size))
			}
		}
	})
}
