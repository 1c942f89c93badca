// Package baseline is what kvbm's figures are measured against in the same
// run: a plain copy of the same bytes between warm buffers, plain O_DIRECT
// writes and reads of one file in the same directory, and plain files, one
// per block, for the object store. A figure is printed beside its baseline
// as a ratio (baseline time / kvbm time: 1.0 = as fast as the baseline).
package baseline

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/kvbm/kvbm/internal/hugepage"
	"github.com/kvbm/kvbm/internal/memavail"
)

// Copy is the limit of memory-to-memory paths: a plain Go copy between
// two buffers outside the Go heap (mapped as kvbm maps system memory),
// every page written before the first timing, so that neither side takes
// page faults inside a measurement.
type Copy struct {
	srcB, dstB []byte
}

// NewCopy maps two warm buffers of chunk bytes; Run copies through them.
// A chunk larger than the caches (64 MiB) keeps the copy honest.
func NewCopy(chunk int) (*Copy, error) {
	if chunk <= 0 {
		return nil, fmt.Errorf("baseline copy: chunk of %d bytes", chunk)
	}
	c := &Copy{}
	var err error
	if err = memavail.Check(2 * uint64(chunk)); err != nil {
		return nil, fmt.Errorf("baseline copy: %w", err)
	}
	if c.srcB, err = hugepage.Map(uint64(chunk), -1); err != nil {
		return nil, fmt.Errorf("baseline copy: %w", err)
	}
	if c.dstB, err = hugepage.Map(uint64(chunk), -1); err != nil {
		return nil, errors.Join(fmt.Errorf("baseline copy: %w", err), hugepage.Unmap(c.srcB))
	}
	for i := range c.srcB {
		c.srcB[i] = byte(i*7 + i>>13)
	}
	copy(c.dstB, c.srcB)
	return c, nil
}

// Run copies total bytes on workers goroutines (each its own share of the
// buffers, chunk by chunk) and returns how long it took.
func (c *Copy) Run(total int64, workers int) time.Duration {
	workers = max(1, workers)
	share := len(c.srcB) / workers
	per := total / int64(workers)
	t0 := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		end, n := (w+1)*share, per
		if w == workers-1 {
			end, n = len(c.srcB), total-per*int64(workers-1)
		}
		src, dst := c.srcB[w*share:end], c.dstB[w*share:end]
		wg.Go(func() {
			for n > 0 {
				k := min(n, int64(len(src)))
				copy(dst[:k], src[:k])
				n -= k
			}
		})
	}
	wg.Wait()
	return time.Since(t0)
}

// GBs is Run's throughput in GB/s (10⁹ bytes per second).
func (c *Copy) GBs(total int64, workers int) float64 {
	return float64(total) / c.Run(total, workers).Seconds() / 1e9
}

// LimitGBs is the machine's copy limit: GBs on GOMAXPROCS goroutines, as
// many as kvbm's own copies may use (its host workers and the emulated
// device's streams).
func (c *Copy) LimitGBs(total int64) float64 { return c.GBs(total, runtime.GOMAXPROCS(0)) }

// Close unmaps the buffers.
func (c *Copy) Close() error { return errors.Join(hugepage.Unmap(c.srcB), hugepage.Unmap(c.dstB)) }
