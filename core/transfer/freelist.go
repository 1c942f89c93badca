package transfer

import (
	"errors"
	"sync"
	"sync/atomic"
)

// freeList keeps driver handles for reuse — completion events — because
// making one per transfer costs more than a small transfer itself. close
// destroys what was returned: the manager closes its lists after the
// transfers in flight ended, when everything is back.
type freeList[T ~uintptr] struct {
	make    func() (T, error)
	destroy func(T) error

	// spare is one handle kept outside the list (0: none), taken and
	// returned with one atomic operation each: a caller whose transfers
	// finish within their call (small ones) takes the same handle back
	// every time, without the lock.
	spare atomic.Uintptr

	mu   sync.Mutex
	free []T
}

func (l *freeList[T]) get() (T, error) {
	if v := l.spare.Swap(0); v != 0 {
		return T(v), nil
	}
	l.mu.Lock()
	if n := len(l.free); n > 0 {
		v := l.free[n-1]
		l.free = l.free[:n-1]
		l.mu.Unlock()
		return v, nil
	}
	l.mu.Unlock()
	return l.make()
}

func (l *freeList[T]) put(v T) {
	if v != 0 && l.spare.CompareAndSwap(0, uintptr(v)) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.free = append(l.free, v)
}

func (l *freeList[T]) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	if v := l.spare.Swap(0); v != 0 {
		errs = append(errs, l.destroy(T(v)))
	}
	for _, v := range l.free {
		errs = append(errs, l.destroy(v))
	}
	l.free = nil
	return errors.Join(errs...)
}
