package transfer

import (
	"errors"
	"sync"
)

// freeList keeps resources for reuse — completion events, pinned staging
// buffers — because making one per transfer costs more than a small
// transfer itself. close destroys what was returned: the manager closes
// its lists after the transfers in flight ended, when everything is back.
type freeList[T any] struct {
	make    func() (T, error)
	destroy func(T) error

	mu   sync.Mutex
	free []T
}

func (l *freeList[T]) get() (T, error) {
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
	l.mu.Lock()
	defer l.mu.Unlock()
	l.free = append(l.free, v)
}

func (l *freeList[T]) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for _, v := range l.free {
		errs = append(errs, l.destroy(v))
	}
	l.free = nil
	return errors.Join(errs...)
}
