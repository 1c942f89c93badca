package cuda

import (
	"runtime"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHostAllocIsResident: pinned memory is faulted in at allocation, as
// cuMemHostAlloc's is, so writing every page of it takes (almost) no page
// faults; device memory from MemAlloc is left to fault in on first use.
func TestHostAllocIsResident(t *testing.T) {
	const size = 16 << 20
	pages := size / syscall.Getpagesize()
	e := newEmu(t, 1)
	// Minor faults of this thread while every page of [addr, addr+size) is
	// written once.
	faults := func(addr uint64) int64 {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		b, err := e.Bytes(addr, size)
		require.NoError(t, err)
		const rusageThread = 1 // RUSAGE_THREAD
		var before, after syscall.Rusage
		require.NoError(t, syscall.Getrusage(rusageThread, &before))
		for i := 0; i < len(b); i += syscall.Getpagesize() {
			b[i] = 1
		}
		require.NoError(t, syscall.Getrusage(rusageThread, &after))
		return after.Minflt - before.Minflt
	}
	host, err := e.HostAlloc(0, size)
	require.NoError(t, err)
	defer func() { require.NoError(t, e.HostFree(host)) }()
	require.Less(t, faults(host), int64(pages/16), "page faults writing %d pages of fresh pinned memory", pages)

	dev, err := e.MemAlloc(0, size)
	require.NoError(t, err)
	defer func() { require.NoError(t, e.MemFree(dev)) }()
	require.GreaterOrEqual(t, faults(dev), int64(pages/2), "page faults writing %d pages of fresh device memory (the check's own control)", pages)
}
