package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestResultError(t *testing.T) {
	require.NoError(t, resultError("cuMemAlloc", 0, nil))

	// The driver's own name and text, as cuGetErrorName/String give them.
	driver := func(code int) (string, string, bool) {
		if code == 2 {
			return "CUDA_ERROR_OUT_OF_MEMORY", "out of memory", true
		}
		return "", "", false
	}
	err := resultError("cuMemAlloc", 2, driver)
	var e *Error
	require.True(t, errors.As(err, &e))
	require.Equal(t, Error{Op: "cuMemAlloc", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Desc: "out of memory"}, *e)
	require.True(t, IsCode(err, ErrCodeOutOfMemory))
	require.Equal(t, "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory", err.Error())

	// A code the driver does not know, or no driver: the table's name.
	for _, text := range []errorText{driver, nil} {
		err = resultError("cuEventQuery", 700, text)
		require.True(t, IsCode(err, ErrCodeIllegalAddress))
		require.ErrorContains(t, err, "CUDA_ERROR_ILLEGAL_ADDRESS")
		err = resultError("cuEventQuery", 12345, text)
		require.ErrorContains(t, err, "CUDA_ERROR_12345")
	}
}

func TestHostRegisterChunks(t *testing.T) {
	const G = uint64(1) << 30
	require.Empty(t, hostRegisterChunks(0x1000, 0, 64*G))
	require.Equal(t, []span{{0x1000, 4096}}, hostRegisterChunks(0x1000, 4096, 64*G))
	require.Equal(t, []span{{0x1000, 64 * G}}, hostRegisterChunks(0x1000, 64*G, 64*G))
	require.Equal(t, []span{{0x1000, 64 * G}, {0x1000 + 64*G, 1}}, hostRegisterChunks(0x1000, 64*G+1, 64*G))
	chunks := hostRegisterChunks(0x200000, 200*G, hostRegisterChunkMax)
	require.Len(t, chunks, 4)
	next, total := uint64(0x200000), uint64(0)
	for _, c := range chunks {
		require.Equal(t, next, c.Start)
		require.LessOrEqual(t, c.Size, 64*G)
		next, total = c.Start+c.Size, total+c.Size
	}
	require.Equal(t, 200*G, total)
	require.Equal(t, 8*G, chunks[3].Size)
}

func TestChooseCopyPath(t *testing.T) {
	free := copyPlanInput{KernelOK: true, BatchOK: true, HazardFree: true}
	with := func(n int, bytes uint64, f func(*copyPlanInput)) copyPlanInput {
		in := free
		in.Copies, in.Bytes = n, bytes
		if f != nil {
			f(&in)
		}
		return in
	}
	for _, tc := range []struct {
		name string
		in   copyPlanInput
		want copyPath
	}{
		{"none", with(0, 0, nil), pathLoop},
		{"one copy", with(1, 2<<20, nil), pathLoop},
		{"many 32 KiB fragments", with(512, 512*32<<10, nil), pathKernel},
		{"many 64 KiB fragments", with(64, 64*64<<10, nil), pathKernel},
		{"few small fragments", with(kernelMinCopies-1, 7*4096, nil), pathBatch},
		{"2 MiB blocks", with(64, 64*2<<20, nil), pathBatch},
		{"2 MiB blocks, no batch API", with(64, 64*2<<20, func(in *copyPlanInput) { in.BatchOK = false }), pathLoop},
		{"fragments, no kernel", with(512, 512*32<<10, func(in *copyPlanInput) { in.KernelOK = false }), pathBatch},
		{"fragments, neither", with(512, 512*32<<10, func(in *copyPlanInput) { in.KernelOK, in.BatchOK = false, false }), pathLoop},
		{"overlapping", with(512, 512*32<<10, func(in *copyPlanInput) { in.HazardFree = false }), pathLoop},
	} {
		require.Equal(t, tc.want, chooseCopyPath(tc.in), tc.name)
	}
}

func TestHazardFree(t *testing.T) {
	for _, tc := range []struct {
		name   string
		copies []Copy
		want   bool
	}{
		{"empty", nil, true},
		{"disjoint", []Copy{{Dst: 0x1000, Src: 0x9000, Size: 0x100}, {Dst: 0x1100, Src: 0x9100, Size: 0x100}}, true},
		{"same source twice", []Copy{{Dst: 0x1000, Src: 0x9000, Size: 0x100}, {Dst: 0x2000, Src: 0x9000, Size: 0x100}}, true},
		{"same destination twice", []Copy{{Dst: 0x1000, Src: 0x9000, Size: 0x100}, {Dst: 0x1000, Src: 0xa000, Size: 0x100}}, false},
		{"destinations overlap", []Copy{{Dst: 0x1000, Src: 0x9000, Size: 0x100}, {Dst: 0x10ff, Src: 0xa000, Size: 0x100}}, false},
		{"destination is a later source", []Copy{{Dst: 0x1000, Src: 0x9000, Size: 0x100}, {Dst: 0x5000, Src: 0x1080, Size: 0x10}}, false},
		{"destination is an earlier source", []Copy{{Dst: 0x5000, Src: 0x1080, Size: 0x10}, {Dst: 0x1000, Src: 0x9000, Size: 0x100}}, false},
		{"own source and destination overlap", []Copy{{Dst: 0x1000, Src: 0x1010, Size: 0x100}}, true},
		// A long own source hides no other copy's range.
		{"hidden behind a long range", []Copy{{Dst: 0x50, Src: 0x0, Size: 0x1000}, {Dst: 0x9000, Src: 0x40, Size: 0x18}}, false},
		{"zero size ignored", []Copy{{Dst: 0x1000, Src: 0x9000, Size: 0x100}, {Dst: 0x1000, Src: 0x9000, Size: 0}}, true},
		{"touching", []Copy{{Dst: 0x1000, Src: 0x9000, Size: 0x100}, {Dst: 0x1100, Src: 0x1000 - 0x10, Size: 0x10}}, true},
	} {
		require.Equal(t, tc.want, hazardFree(tc.copies), tc.name)
	}
}

func TestNextPoll(t *testing.T) {
	const us = time.Microsecond
	// Yield, never sleep, for the first pollSpin (a sub-millisecond sleep
	// costs about a millisecond).
	for _, elapsed := range []time.Duration{0, us, 49 * us} {
		require.Zero(t, nextPoll(elapsed, 0), elapsed)
	}
	// Then sleep, doubling from pollFirst up to pollMax.
	var seen []time.Duration
	var d time.Duration
	for range 8 {
		d = nextPoll(pollSpin, d)
		seen = append(seen, d/us)
	}
	require.Equal(t, []time.Duration{50, 100, 200, 400, 800, 1000, 1000, 1000}, seen)
	require.Equal(t, pollFirst, nextPoll(time.Second, 0))
	require.Equal(t, pollMax, nextPoll(time.Second, pollMax))
}

func TestPoll(t *testing.T) {
	// Done at once, after a few queries, and failing: poll returns the
	// query's answer.
	calls := 0
	require.NoError(t, poll(func() (bool, error) { calls++; return true, nil }))
	require.Equal(t, 1, calls)
	calls = 0
	start := time.Now()
	require.NoError(t, poll(func() (bool, error) { calls++; return calls == 5, nil }))
	require.Equal(t, 5, calls)
	// Work that finishes within the spin phase costs no sleep.
	require.Less(t, time.Since(start), 500*time.Millisecond)
	boom := errors.New("sticky")
	require.ErrorIs(t, poll(func() (bool, error) { return true, boom }), boom)
	// Pending past the spin phase: it sleeps and still sees completion.
	start = time.Now()
	require.NoError(t, poll(func() (bool, error) { return time.Since(start) > 3*time.Millisecond, nil }))
}

func TestDeviceRanges(t *testing.T) {
	var d deviceRanges
	require.False(t, d.contains(0, 0x1000, 1))
	d.add(0, 0x1000, 0x1000)  // [0x1000, 0x2000)
	d.add(0, 0x1800, 0x100)   // nested
	d.add(0, 0x10000, 0x4000) // [0x10000, 0x14000)
	d.add(1, 0x20000, 0x1000) // another device
	for _, tc := range []struct {
		dev  int
		p, n uint64
		want bool
	}{
		{0, 0x1000, 0x1000, true},
		{0, 0x1fff, 1, true},
		{0, 0x1900, 0x700, true}, // past the nested range, inside the long one
		{0, 0x1f00, 0x101, false},
		{0, 0xfff, 2, false},
		{0, 0x2000, 1, false},
		{0, 0x1f00, 0x10000, false}, // spans a gap
		{0, 0x13000, 0x1000, true},
		{0, 0x20000, 0x10, false}, // device 1's
		{1, 0x20000, 0x10, true},
		{1, 0x1000, 0x10, false},
		{0, ^uint64(0) - 1, 4, false}, // wraps
	} {
		require.Equal(t, tc.want, d.contains(tc.dev, tc.p, tc.n), "dev %d %#x+%#x", tc.dev, tc.p, tc.n)
	}
	// Registered twice, removed once: still there; unknown removal fails.
	d.add(0, 0x1000, 0x1000)
	require.True(t, d.remove(0, 0x1000, 0x1000))
	require.True(t, d.contains(0, 0x1000, 0x1000))
	require.True(t, d.remove(0, 0x1000, 0x1000))
	require.False(t, d.contains(0, 0x1000, 0x1000))
	require.True(t, d.contains(0, 0x1800, 0x100))
	require.False(t, d.remove(0, 0x1000, 0x1000))
	require.False(t, d.remove(2, 0x1000, 0x1000))
}

func TestDeviceNUMANode(t *testing.T) {
	root := t.TempDir()
	write := func(path, text string) {
		p := filepath.Join(root, path)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	}
	// A Grace-like machine: node 0 has CPUs; nodes 1 and 2 are GPU memory.
	write("devices/system/node/node0/cpulist", "0-71\n")
	write("devices/system/node/node1/cpulist", "\n")
	write("devices/system/node/node2/cpulist", "")
	write("bus/pci/devices/0009:01:00.0/numa_node", "0\n")
	write("bus/pci/devices/0000:3b:00.0/numa_node", "-1\n")
	write("bus/pci/devices/0000:5e:00.0/numa_node", "1\n")
	nvml := func(n int) func() int { return func() int { return n } }

	require.Equal(t, 3, numaNodes(root))
	require.Equal(t, 1, numaNodes(filepath.Join(root, "none")))
	// sysfs first, whatever NVML says (its HBM node on Grace).
	require.Equal(t, 0, deviceNUMANode(root, "0009:01:00.0", nvml(1)))
	// Upper-case bus ids as cuDeviceGetPCIBusId gives them.
	write("bus/pci/devices/0000:3c:00.0/numa_node", "0\n")
	require.Equal(t, 0, deviceNUMANode(root, "0000:3C:00.0", nil))
	// sysfs unknown: NVML, but only a node with CPUs.
	require.Equal(t, 0, deviceNUMANode(root, "0000:3b:00.0", nvml(0)))
	require.Equal(t, -1, deviceNUMANode(root, "0000:3b:00.0", nvml(2)))
	require.Equal(t, -1, deviceNUMANode(root, "0000:3b:00.0", nvml(-1)))
	require.Equal(t, -1, deviceNUMANode(root, "0000:3b:00.0", nil))
	// sysfs names a CPU-less node: NVML's answer if it has CPUs.
	require.Equal(t, -1, deviceNUMANode(root, "0000:5e:00.0", nvml(1)))
	require.Equal(t, 0, deviceNUMANode(root, "0000:5e:00.0", nvml(0)))
	// No such device, or a malformed id.
	require.Equal(t, -1, deviceNUMANode(root, "0000:99:00.0", nil))
	require.Equal(t, -1, deviceNUMANode(root, "../../x", nil))
	require.Equal(t, -1, deviceNUMANode(root, "", nil))
}
