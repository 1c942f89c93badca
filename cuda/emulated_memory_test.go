package cuda

import (
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/internal/memavail"
)

// TestHostAllocIsResident: pinned memory is resident from allocation, as
// cuMemHostAlloc's is (every page in core before anything touches it);
// device memory from MemAlloc is left to fault in on first use, as the
// emulated device offers far more than a test touches.
func TestHostAllocIsResident(t *testing.T) {
	const size = 16 << 20
	page := syscall.Getpagesize()
	pages := size / page
	e := newEmu(t, 1)
	bytesOf := func(addr uint64) []byte {
		b, err := e.Bytes(addr, size)
		require.NoError(t, err)
		return b
	}
	// resident counts the pages of b in core (mincore), without touching them.
	resident := func(b []byte) int {
		vec := make([]byte, pages)
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)),
			uintptr(unsafe.Pointer(unsafe.SliceData(vec))))
		require.Zero(t, errno, "mincore")
		n := 0
		for _, v := range vec {
			n += int(v & 1)
		}
		return n
	}
	host, err := e.HostAlloc(0, size)
	require.NoError(t, err)
	defer func() { require.NoError(t, e.HostFree(host)) }()
	require.Equal(t, pages, resident(bytesOf(host)), "pages of fresh pinned memory in core")

	dev, err := e.MemAlloc(0, size)
	require.NoError(t, err)
	defer func() { require.NoError(t, e.MemFree(dev)) }()
	// The check's own control: fresh device memory is not in core.
	require.Less(t, resident(bytesOf(dev)), pages/16, "pages of fresh device memory in core")
}

// Pinned host memory that cannot fit is refused before a page is touched,
// with the out of memory cuMemHostAlloc gives and the bytes requested and
// available; device memory is not host memory and is not checked against
// it.
func TestHostAllocRefusesWhatCannotFit(t *testing.T) {
	const gib = 1 << 30
	reading := memavail.Reading{MemTotal: 24 * gib, MemAvailable: 1*gib + 32<<20} // 1 GiB kept free
	defer memavail.Override(func() (memavail.Reading, error) { return reading, nil })()
	e := newEmu(t, 1)
	p, err := e.HostAlloc(0, 32<<20)
	require.NoError(t, err, "just under")
	require.NoError(t, e.HostFree(p))
	_, err = e.HostAlloc(0, 32<<20+1)
	requireCode(t, err, ErrCodeOutOfMemory, "cuMemHostAlloc", "33554433 bytes requested, 33554432 available")

	reading.MemAvailable = 0
	d, err := e.MemAlloc(0, 64<<20)
	require.NoError(t, err, "device memory is the device's")
	require.NoError(t, e.MemFree(d))
}
