package cuda

import (
	"runtime"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAllocationsAreResident: pinned and device memory are faulted in at
// allocation, as cuMemHostAlloc's and cuMemAlloc's are, so writing every
// page of them takes (almost) no page faults.
func TestAllocationsAreResident(t *testing.T) {
	const size = 16 << 20
	pages := size / syscall.Getpagesize()
	e := newEmu(t, 1)
	// Minor faults of this thread while every page of b is written once.
	faults := func(b []byte) int64 {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		const rusageThread = 1 // RUSAGE_THREAD
		var before, after syscall.Rusage
		require.NoError(t, syscall.Getrusage(rusageThread, &before))
		for i := 0; i < len(b); i += syscall.Getpagesize() {
			b[i] = 1
		}
		require.NoError(t, syscall.Getrusage(rusageThread, &after))
		return after.Minflt - before.Minflt
	}
	bytesOf := func(addr uint64) []byte {
		b, err := e.Bytes(addr, size)
		require.NoError(t, err)
		return b
	}
	host, err := e.HostAlloc(0, size)
	require.NoError(t, err)
	defer func() { require.NoError(t, e.HostFree(host)) }()
	require.Less(t, faults(bytesOf(host)), int64(pages/16), "page faults writing %d pages of fresh pinned memory", pages)

	dev, err := e.MemAlloc(0, size)
	require.NoError(t, err)
	defer func() { require.NoError(t, e.MemFree(dev)) }()
	require.Less(t, faults(bytesOf(dev)), int64(pages/16), "page faults writing %d pages of fresh device memory", pages)

	// The check's own control: fresh memory of base pages faults on each.
	plain, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	defer func() { require.NoError(t, syscall.Munmap(plain)) }()
	require.NoError(t, syscall.Madvise(plain, 15)) // MADV_NOHUGEPAGE
	require.GreaterOrEqual(t, faults(plain), int64(pages/2), "page faults writing %d pages of fresh mmap'd memory", pages)
}
