package cache

import (
	"time"

	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
)

// g2Copy is a copy of G2 blocks into G1 that runs beside an onboard's
// staging (stageBeside). A nil g2Copy is no copy.
type g2Copy struct {
	n    int
	done chan struct{}
	// Set before done closes.
	failed  func(dstID int) bool
	err     error
	t0, end time.Time
}

// startG2Copy starts the copy of G2 blocks src into G1 blocks dst, on
// stream (nil: one of the worker's).
func (c *Cache) startG2Copy(src, dst []int, stream *cuda.Stream) *g2Copy {
	cp := &g2Copy{n: len(src), done: make(chan struct{}), t0: time.Now()}
	nt, err := c.w.ExecuteLocalTransfer(worker.G2, worker.G1, src, dst, transfer.Options{Stream: stream})
	go func() {
		defer close(cp.done)
		cp.failed, cp.err = failedOf(nt, err)
		cp.end = time.Now()
	}()
	return cp
}

// count is the number of blocks copied.
func (cp *g2Copy) count() int {
	if cp == nil {
		return 0
	}
	return cp.n
}

// wait returns once the copy is over, failed blocks included.
func (cp *g2Copy) wait() {
	if cp != nil {
		<-cp.done
	}
}

// ran is how long the copy ran, until its notification completed, from
// when it was queued or, if later, when its stream reached it.
func (cp *g2Copy) ran(reached time.Time) time.Duration {
	if cp == nil {
		return 0
	}
	return cp.end.Sub(later(cp.t0, reached))
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
