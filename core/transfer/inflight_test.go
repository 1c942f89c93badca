package transfer

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// Work that entered before Close is waited for; none enters after it.
func TestInflightGateWaitsForWhatEnteredAndRefusesTheRest(t *testing.T) {
	for range 200 {
		g := newInflight()
		var running, afterClose atomic.Int64
		var closed atomic.Bool
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 50 {
					if !g.enter() {
						return
					}
					if closed.Load() {
						afterClose.Add(1)
					}
					running.Add(1)
					running.Add(-1)
					g.leave()
				}
			})
		}
		g.closeAndWait()
		closed.Store(true)
		require.Zero(t, running.Load(), "work still in flight after closeAndWait returned")
		wg.Wait()
		require.Zero(t, afterClose.Load(), "work entered after closeAndWait returned")
		require.False(t, g.enter())
	}
}

// The spare handle and the listed ones are each handed out once at a time
// and each destroyed once at close.
func TestFreeListSpareIsHandedOutOnceAndDestroyedAtClose(t *testing.T) {
	var made, destroyed []uintptr
	next := uintptr(0)
	l := freeList[uintptr]{
		make:    func() (uintptr, error) { next++; made = append(made, next); return next, nil },
		destroy: func(v uintptr) error { destroyed = append(destroyed, v); return nil },
	}
	a, _ := l.get()
	b, _ := l.get()
	require.NotEqual(t, a, b)
	l.put(a) // the spare
	l.put(b) // the list
	c, _ := l.get()
	d, _ := l.get()
	require.ElementsMatch(t, []uintptr{a, b}, []uintptr{c, d})
	e, _ := l.get()
	require.NotContains(t, []uintptr{c, d}, e, "a handle in use handed out again")
	l.put(c)
	l.put(d)
	l.put(e)
	require.NoError(t, l.close())
	require.ElementsMatch(t, made, destroyed)
}
