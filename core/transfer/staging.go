package transfer

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvbm/kvbm/core/storage"
)

// Default bounds of the pinned staging buffers Serve moves device memory
// through (stageBytes each).
const (
	// DefaultStagingBuffers is the most that exist at once (64 MiB):
	// more concurrent device requests of peers wait for one.
	DefaultStagingBuffers = 16
	// stageIdle buffers are kept however long they go unused (one per
	// connection of a default peer); the others are freed once unused for
	// stageLinger, not at once: freeing pinned memory synchronizes the
	// device, and a busy server would otherwise free and allocate one per
	// request.
	stageIdle = 4
)

// stageLinger is how long a staging buffer beyond stageIdle stays unused
// before it is freed (a variable: tests shorten it).
var stageLinger = 10 * time.Second

// StagingStats describe the pinned staging buffers of Serve.
type StagingStats struct {
	// Cap is the most that may exist at once (Config.StagingBuffers).
	Cap int
	// Live is the number allocated now (in use or idle), Peak the most
	// allocated at once since the manager started.
	Live, Peak int
	// Allocated counts allocations since the manager started.
	Allocated uint64
	// Waits counts requests that found every buffer in use and waited;
	// TimedOut those of them that got none within the remote deadline.
	Waits, TimedOut uint64
}

// Staging reports the pinned staging buffers of Serve.
func (m *Manager) Staging() StagingStats {
	b := &m.stages
	b.mu.Lock()
	defer b.mu.Unlock()
	return StagingStats{Cap: cap(b.slots), Live: b.live, Peak: b.peak, Allocated: b.allocs, Waits: b.waits, TimedOut: b.timedOut}
}

// stagePool is a bounded pool of pinned staging buffers: at most
// cap(slots) exist, a request that finds all in use waits for one (within
// its deadline), and those beyond stageIdle are freed once unused for
// stageLinger.
type stagePool struct {
	alloc   func() (*storage.Memory, error)
	destroy func(*storage.Memory) error
	slots   chan struct{} // a token per buffer handed out

	mu                      sync.Mutex
	free                    []idleStage // oldest first
	live, peak              int
	allocs, waits, timedOut uint64
	trim                    *time.Timer
	closed                  bool
}

type idleStage struct {
	mem   *storage.Memory
	since time.Time
}

func newStagePool(n int, alloc func() (*storage.Memory, error), destroy func(*storage.Memory) error) stagePool {
	return stagePool{alloc: alloc, destroy: destroy, slots: make(chan struct{}, n)}
}

// get returns a buffer, waiting at most wait for one when all are in use.
func (b *stagePool) get(wait time.Duration) (*storage.Memory, error) {
	select {
	case b.slots <- struct{}{}:
	default:
		b.mu.Lock()
		b.waits++
		b.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case b.slots <- struct{}{}:
			t.Stop()
		case <-t.C:
			b.mu.Lock()
			b.timedOut++
			b.mu.Unlock()
			return nil, fmt.Errorf("%w: all %d pinned staging buffers stayed in use for %v", ErrTimeout, cap(b.slots), wait)
		}
	}
	b.mu.Lock()
	if n := len(b.free); n > 0 {
		s := b.free[n-1].mem // the most recently used: the oldest age out
		b.free = b.free[:n-1]
		b.mu.Unlock()
		return s, nil
	}
	b.live++
	b.peak = max(b.peak, b.live)
	b.allocs++
	b.mu.Unlock()
	s, err := b.alloc()
	if err != nil {
		b.mu.Lock()
		b.live--
		b.mu.Unlock()
		<-b.slots
		return nil, err
	}
	return s, nil
}

func (b *stagePool) put(s *storage.Memory) {
	b.mu.Lock()
	if b.closed { // not after the manager's Close, which waits for Serve; for safety
		b.live--
		b.mu.Unlock()
		b.destroy(s)
		<-b.slots
		return
	}
	b.free = append(b.free, idleStage{s, time.Now()})
	if len(b.free) > stageIdle && b.trim == nil {
		b.trim = time.AfterFunc(stageLinger, b.trimIdle)
	}
	b.mu.Unlock()
	<-b.slots
}

// trimIdle frees the buffers beyond stageIdle unused for stageLinger, and
// comes back for the others while there are more than stageIdle.
func (b *stagePool) trimIdle() {
	b.mu.Lock()
	b.trim = nil
	if b.closed {
		b.mu.Unlock()
		return
	}
	defer b.mu.Unlock() // freed under the lock, so that close never returns while one is being freed
	now := time.Now()
	for len(b.free) > stageIdle && now.Sub(b.free[0].since) >= stageLinger {
		b.destroy(b.free[0].mem)
		b.free = b.free[1:]
		b.live--
	}
	if len(b.free) > stageIdle {
		b.trim = time.AfterFunc(stageLinger-now.Sub(b.free[0].since), b.trimIdle)
	}
}

// close frees the idle buffers; the manager calls it once every Serve ended.
func (b *stagePool) close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.trim != nil {
		b.trim.Stop()
		b.trim = nil
	}
	var errs []error
	for _, s := range b.free {
		errs = append(errs, b.destroy(s.mem))
	}
	b.live -= len(b.free)
	b.free = nil
	return errors.Join(errs...)
}
