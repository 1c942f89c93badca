package cuda

import (
	"bytes"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

const waitLimit = 10 * time.Second

// newEmu makes an emulated driver closed when the test ends.
func newEmu(t testing.TB, n int) *Emulated {
	t.Helper()
	e := NewEmulated(n)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	return e
}

func hostAlloc(t testing.TB, e *Emulated, size uint64) uint64 {
	t.Helper()
	p, err := e.HostAlloc(0, size)
	require.NoError(t, err)
	return p
}

func devAlloc(t testing.TB, e *Emulated, size uint64) uint64 {
	t.Helper()
	p, err := e.MemAlloc(0, size)
	require.NoError(t, err)
	return p
}

func newStream(t testing.TB, e *Emulated, device int) Stream {
	t.Helper()
	s, err := e.StreamCreate(device)
	require.NoError(t, err)
	return s
}

func newEvent(t testing.TB, e *Emulated, device int) Event {
	t.Helper()
	ev, err := e.EventCreate(device)
	require.NoError(t, err)
	return ev
}

func mem(t testing.TB, e *Emulated, addr, size uint64) []byte {
	t.Helper()
	b, err := e.Bytes(addr, size)
	require.NoError(t, err)
	return b
}

func fill(t testing.TB, e *Emulated, addr, size uint64, v byte) {
	t.Helper()
	copy(mem(t, e, addr, size), bytes.Repeat([]byte{v}, int(size)))
}

// plainMmap maps host memory that the driver knows nothing about (pageable,
// like a numpy buffer); it is unmapped when the test ends.
func plainMmap(t testing.TB, size int) (uint64, []byte) {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, syscall.Munmap(b)) })
	return uint64(uintptr(unsafe.Pointer(&b[0]))), b
}

// within runs fn and fails the test if it does not return in time.
func within(t testing.TB, what string, fn func() error) error {
	t.Helper()
	ch := make(chan error, 1)
	go func() { ch <- fn() }()
	select {
	case err := <-ch:
		return err
	case <-time.After(waitLimit):
		require.FailNow(t, what+" did not return in time")
		return nil
	}
}

// hooks is a copy-fault hook for tests: copies to a gated destination block
// until the gate opens; copies to a faulty destination fail.
type hooks struct {
	mu     sync.Mutex
	gates  map[uint64]*gate
	faults map[uint64]error
	count  map[uint64]int // copies executed (or failed) per destination
}

type gate struct {
	open    chan struct{}
	reached chan struct{} // closed when a copy first blocks on the gate
	once    sync.Once
	rOnce   sync.Once
}

// install sets h as e's copy-fault hook; gates are opened when the test
// ends (before e is closed, since cleanups run last-registered first).
func install(t testing.TB, e *Emulated) *hooks {
	h := &hooks{gates: map[uint64]*gate{}, faults: map[uint64]error{}, count: map[uint64]int{}}
	e.InjectCopyFault(h.hook)
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, g := range h.gates {
			g.once.Do(func() { close(g.open) })
		}
	})
	return h
}

func (h *hooks) hook(_ CopyKind, c Copy) error {
	h.mu.Lock()
	g := h.gates[c.Dst]
	err := h.faults[c.Dst]
	h.count[c.Dst]++
	h.mu.Unlock()
	if g != nil {
		g.rOnce.Do(func() { close(g.reached) })
		<-g.open
	}
	return err
}

// hold gates copies to dst; the returned gate's release opens it.
func (h *hooks) hold(dst uint64) *gate {
	g := &gate{open: make(chan struct{}), reached: make(chan struct{})}
	h.mu.Lock()
	h.gates[dst] = g
	h.mu.Unlock()
	return g
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

func (g *gate) waitReached(t testing.TB) {
	t.Helper()
	select {
	case <-g.reached:
	case <-time.After(waitLimit):
		require.FailNow(t, "no copy reached the gate")
	}
}

func (h *hooks) fail(dst uint64, err error) {
	h.mu.Lock()
	h.faults[dst] = err
	h.mu.Unlock()
}

func (h *hooks) copies(dst uint64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count[dst]
}

func requireCode(t testing.TB, err error, code int, contains ...string) {
	t.Helper()
	require.Error(t, err)
	require.Truef(t, IsCode(err, code), "want %s, got %v", codeNames[code], err)
	for _, s := range contains {
		require.Contains(t, err.Error(), s)
	}
}
