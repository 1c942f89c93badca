package cuda

import (
	"errors"
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
	d := nextPoll(0)
	require.Equal(t, pollFirst, d)
	seen := []time.Duration{d}
	for range 10 {
		d = nextPoll(d)
		seen = append(seen, d)
	}
	require.Equal(t, []time.Duration{2, 4, 8, 16, 32, 64, 100, 100, 100, 100, 100}, func() []time.Duration {
		out := make([]time.Duration, len(seen))
		for i, s := range seen {
			out[i] = s / time.Microsecond
		}
		return out
	}())
}
