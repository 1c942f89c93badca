package cuda

import (
	"bytes"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func TestEmulatedConformance(t *testing.T) {
	testDriverConformance(t, newEmu(t, 1))
}

func TestEmulatedConformanceSecondDevice(t *testing.T) {
	testDeviceConformance(t, newEmu(t, 2), 1)
}

// testDriverConformance checks the behaviour both drivers promise, through
// the Driver interface only, on device 0: it runs on the emulated device
// always and on the real driver where a GPU exists, or the CUDA double
// (real_test.go). Only pinned host memory is read by the CPU (both
// drivers' host memory is plain host memory).
func testDriverConformance(t *testing.T, d Driver) { testDeviceConformance(t, d, 0) }

// testDeviceConformance is testDriverConformance on device dev.
func testDeviceConformance(t *testing.T, d Driver, dev int) {
	n, err := d.DeviceCount()
	require.NoError(t, err)
	require.Greater(t, n, dev)
	info, err := d.Device(dev)
	require.NoError(t, err)
	require.Equal(t, dev, info.Ordinal)
	require.NotEmpty(t, info.Name)
	require.NotZero(t, info.TotalMemory)
	_, err = d.Device(n)
	require.True(t, IsCode(err, ErrCodeInvalidDevice), "%v", err)

	host := func(size uint64) []byte {
		p, err := d.HostAlloc(dev, size)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, d.HostFree(p)) })
		return view(p, size)
	}
	devMem := func(size uint64) uint64 {
		p, err := d.MemAlloc(dev, size)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, d.MemFree(p)) })
		return p
	}
	addr := func(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }
	pattern := func(b []byte, seed byte) {
		for i := range b {
			b[i] = byte(i*7) ^ seed
		}
	}
	s, err := d.StreamCreate(dev)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.StreamDestroy(s)) }()
	s2, err := d.StreamCreate(dev)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.StreamDestroy(s2)) }()

	t.Run("round trip H2D D2D D2H", func(t *testing.T) {
		const size = 2 << 20
		in, out := host(size), host(size)
		pattern(in, 1)
		a, b := devMem(size), devMem(size)
		require.NoError(t, d.MemcpyAsync(HostToDevice, Copy{Dst: a, Src: addr(in), Size: size}, s))
		require.NoError(t, d.MemcpyAsync(DeviceToDevice, Copy{Dst: b, Src: a, Size: size}, s))
		require.NoError(t, d.MemcpyAsync(DeviceToHost, Copy{Dst: addr(out), Src: b, Size: size}, s))
		require.NoError(t, d.MemcpyAsync(DeviceToHost, Copy{Dst: addr(out), Src: b, Size: 0}, s))
		require.NoError(t, d.StreamSynchronize(s))
		require.True(t, bytes.Equal(in, out))
	})

	// Batches of many fragments (the real driver's kernel path), of
	// misaligned ones (its narrower words), and of whole blocks (the copy
	// engines), each checked byte for byte.
	for _, tc := range []struct {
		name       string
		frags      int
		size, step uint64
		offset     uint64
	}{
		{"fragments 32 KiB", 256, 32 << 10, 32 << 10, 0},
		{"fragments misaligned", 64, 1000, 1003, 5},
		{"fragments 8-byte aligned", 64, 4096, 4104, 8},
		{"blocks 2 MiB", 8, 2 << 20, 2 << 20, 0},
	} {
		t.Run("batch "+tc.name, func(t *testing.T) {
			span := tc.offset + uint64(tc.frags)*tc.step
			in, out := host(span), host(span)
			pattern(in, 3)
			a, b := devMem(span), devMem(span)
			var h2d, d2d, d2h []Copy
			// Scatter in reverse order, so a mix-up of fragments shows.
			for i := range tc.frags {
				off := tc.offset + uint64(i)*tc.step
				rev := tc.offset + uint64(tc.frags-1-i)*tc.step
				h2d = append(h2d, Copy{Dst: a + rev, Src: addr(in) + off, Size: tc.size})
				d2d = append(d2d, Copy{Dst: b + off, Src: a + rev, Size: tc.size})
				d2h = append(d2h, Copy{Dst: addr(out) + off, Src: b + off, Size: tc.size})
			}
			require.NoError(t, d.MemcpyBatchAsync(HostToDevice, h2d, s))
			require.NoError(t, d.MemcpyBatchAsync(DeviceToDevice, d2d, s))
			require.NoError(t, d.MemcpyBatchAsync(DeviceToHost, d2h, s))
			require.NoError(t, d.StreamSynchronize(s))
			for i := range tc.frags {
				off := tc.offset + uint64(i)*tc.step
				require.True(t, bytes.Equal(in[off:off+tc.size], out[off:off+tc.size]), "fragment %d", i)
			}
		})
	}

	t.Run("batch in order when destinations overlap", func(t *testing.T) {
		const size = 4096
		in, out := host(3*size), host(size)
		pattern(in, 5)
		a := devMem(size)
		var copies []Copy
		for i := range 16 { // the last write must win
			copies = append(copies, Copy{Dst: a, Src: addr(in) + uint64(i%3)*size, Size: size})
		}
		require.NoError(t, d.MemcpyBatchAsync(HostToDevice, copies, s))
		require.NoError(t, d.MemcpyAsync(DeviceToHost, Copy{Dst: addr(out), Src: a, Size: size}, s))
		require.NoError(t, d.StreamSynchronize(s))
		require.True(t, bytes.Equal(in[size*(15%3):size*(15%3+1)], out))
	})

	t.Run("events and stream wait", func(t *testing.T) {
		const size = 8 << 20
		in, out := host(size), host(size)
		pattern(in, 9)
		a := devMem(size)
		ev, err := d.EventCreate(dev)
		require.NoError(t, err)
		defer func() { require.NoError(t, d.EventDestroy(ev)) }()
		done, err := d.EventQuery(ev) // never recorded: complete
		require.NoError(t, err)
		require.True(t, done)
		require.NoError(t, d.EventSynchronize(ev))

		require.NoError(t, d.MemcpyAsync(HostToDevice, Copy{Dst: a, Src: addr(in), Size: size}, s))
		require.NoError(t, d.EventRecord(ev, s))
		require.NoError(t, d.StreamWaitEvent(s2, ev))
		require.NoError(t, d.MemcpyAsync(DeviceToHost, Copy{Dst: addr(out), Src: a, Size: size}, s2))
		ev2, err := d.EventCreate(dev)
		require.NoError(t, err)
		defer func() { require.NoError(t, d.EventDestroy(ev2)) }()
		require.NoError(t, d.EventRecord(ev2, s2))
		require.NoError(t, d.EventSynchronize(ev2))
		done, err = d.EventQuery(ev)
		require.NoError(t, err)
		require.True(t, done)
		require.True(t, bytes.Equal(in, out))
	})

	t.Run("host register and device ranges", func(t *testing.T) {
		const size = 1 << 20
		mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		require.NoError(t, err)
		defer func() { require.NoError(t, syscall.Munmap(mem)) }()
		pattern(mem, 11)
		require.NoError(t, d.HostRegister(addr(mem), size))
		err = d.HostRegister(addr(mem), size)
		require.True(t, IsCode(err, ErrCodeHostMemoryAlreadyRegistered), "%v", err)

		a := devMem(size)
		require.NoError(t, d.RegisterDeviceRange(dev, a+4096, 8192))
		out := host(size)
		require.NoError(t, d.MemcpyAsync(HostToDevice, Copy{Dst: a, Src: addr(mem), Size: size}, s))
		require.NoError(t, d.MemcpyAsync(DeviceToHost, Copy{Dst: addr(out), Src: a, Size: size}, s))
		require.NoError(t, d.StreamSynchronize(s))
		require.True(t, bytes.Equal(mem, out))
		require.NoError(t, d.UnregisterDeviceRange(a+4096))
		require.Error(t, d.UnregisterDeviceRange(a+4096))
		require.NoError(t, d.HostUnregister(addr(mem)))
		err = d.HostUnregister(addr(mem))
		require.True(t, IsCode(err, ErrCodeHostMemoryNotRegistered), "%v", err)
	})

	t.Run("legacy default stream", func(t *testing.T) {
		const size = 64 << 10
		in, out := host(size), host(size)
		pattern(in, 13)
		a := devMem(size)
		require.NoError(t, d.MemcpyAsync(HostToDevice, Copy{Dst: a, Src: addr(in), Size: size}, 0))
		require.NoError(t, d.MemcpyAsync(DeviceToHost, Copy{Dst: addr(out), Src: a, Size: size}, 0))
		require.NoError(t, d.StreamSynchronize(0))
		require.True(t, bytes.Equal(in, out))
	})
}
