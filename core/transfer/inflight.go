package transfer

import (
	"sync"
	"sync/atomic"
)

// inflightGate counts the work in flight on a manager so that Close can wait for
// it, and refuses new work once Close began, without a lock on the way in
// or out (every transfer passes it twice). Entering adds to the count and
// then looks at closed; closing sets closed and then looks at the count:
// with sequentially consistent atomics one of the two sees the other, so no
// work starts unseen after Close looked.
type inflightGate struct {
	n       atomic.Int64
	closed  atomic.Bool
	once    sync.Once
	drained chan struct{} // closed when closed and nothing is in flight
}

func newInflight() *inflightGate { return &inflightGate{drained: make(chan struct{})} }

// enter counts one piece of work in; false once the gate is closed.
func (g *inflightGate) enter() bool {
	g.n.Add(1)
	if g.closed.Load() {
		g.leave()
		return false
	}
	return true
}

// leave counts one piece of work out.
func (g *inflightGate) leave() {
	if g.n.Add(-1) == 0 && g.closed.Load() {
		g.once.Do(func() { close(g.drained) })
	}
}

// closeAndWait refuses new work and waits until the work in flight left.
func (g *inflightGate) closeAndWait() {
	g.closed.Store(true)
	if g.n.Load() == 0 {
		g.once.Do(func() { close(g.drained) })
	}
	<-g.drained
}
