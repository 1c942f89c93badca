package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestEmulatedDevices(t *testing.T) {
	e := newEmu(t, 2)
	require.Equal(t, "emulated", e.Name())
	n, err := e.DeviceCount()
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for i := range 2 {
		info, err := e.Device(i)
		require.NoError(t, err)
		require.Equal(t, DeviceInfo{Ordinal: i, Name: "kvbm emulated device", TotalMemory: EmulatedDeviceMemory, NUMANode: -1}, info)
	}
	for _, bad := range []int{-1, 2, 100} {
		_, err := e.Device(bad)
		requireCode(t, err, ErrCodeInvalidDevice, fmt.Sprint(bad))
		_, err = e.StreamCreate(bad)
		requireCode(t, err, ErrCodeInvalidDevice)
		_, err = e.EventCreate(bad)
		requireCode(t, err, ErrCodeInvalidDevice)
		_, err = e.MemAlloc(bad, 64)
		requireCode(t, err, ErrCodeInvalidDevice)
		_, err = e.HostAlloc(bad, 64)
		requireCode(t, err, ErrCodeInvalidDevice)
		requireCode(t, e.RegisterDeviceRange(bad, 0x1000, 64), ErrCodeInvalidDevice)
	}
	none := newEmu(t, 0)
	n, err = none.DeviceCount()
	require.NoError(t, err)
	require.Zero(t, n)
	_, err = none.MemAlloc(0, 1)
	requireCode(t, err, ErrCodeInvalidDevice)
}

func TestStreamOrderLastWriteWins(t *testing.T) {
	e := newEmu(t, 1)
	s := newStream(t, e, 0)
	const n, size = 200, 4096
	srcs := make([]uint64, n)
	for i := range srcs {
		srcs[i] = hostAlloc(t, e, size)
		fill(t, e, srcs[i], size, byte(i+1))
	}
	d := devAlloc(t, e, size)
	d2 := devAlloc(t, e, size)
	out := hostAlloc(t, e, size)
	for round := range 20 {
		for i := range srcs {
			require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: d, Src: srcs[i], Size: size}, s))
			// A partial overwrite of the first half: later writes must
			// land after earlier ones.
			require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: d, Src: srcs[(i+round)%n], Size: size / 2}, s))
		}
		require.NoError(t, e.MemcpyAsync(DeviceToDevice, Copy{Dst: d2, Src: d, Size: size}, s))
		require.NoError(t, e.MemcpyAsync(DeviceToHost, Copy{Dst: out, Src: d2, Size: size}, s))
		require.NoError(t, e.StreamSynchronize(s))
		got := mem(t, e, out, size)
		require.Equal(t, bytes.Repeat([]byte{byte((n-1+round)%n + 1)}, size/2), got[:size/2], "round %d", round)
		require.Equal(t, bytes.Repeat([]byte{byte(n)}, size/2), got[size/2:], "round %d", round)
	}
}

func TestLegacyDefaultStream(t *testing.T) {
	e := newEmu(t, 1)
	h := hostAlloc(t, e, 64)
	d := devAlloc(t, e, 64)
	out := hostAlloc(t, e, 64)
	fill(t, e, h, 64, 7)
	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: d, Src: h, Size: 64}, 0))
	ev := newEvent(t, e, 0)
	require.NoError(t, e.EventRecord(ev, 0))
	s := newStream(t, e, 0)
	require.NoError(t, e.StreamWaitEvent(s, ev))
	require.NoError(t, e.MemcpyAsync(DeviceToHost, Copy{Dst: out, Src: d, Size: 64}, s))
	require.NoError(t, e.StreamSynchronize(s))
	require.NoError(t, e.StreamSynchronize(0))
	require.Equal(t, bytes.Repeat([]byte{7}, 64), mem(t, e, out, 64))
	requireCode(t, e.StreamDestroy(0), ErrCodeInvalidHandle)
}

func TestEventNeverRecordedIsComplete(t *testing.T) {
	e := newEmu(t, 1)
	ev := newEvent(t, e, 0)
	done, err := e.EventQuery(ev)
	require.NoError(t, err)
	require.True(t, done)
	require.NoError(t, e.EventSynchronize(ev))
	// Waiting on it is a no-op: the stream proceeds.
	s := newStream(t, e, 0)
	require.NoError(t, e.StreamWaitEvent(s, ev))
	require.NoError(t, within(t, "StreamSynchronize", func() error { return e.StreamSynchronize(s) }))
}

func TestEventPendingThenComplete(t *testing.T) {
	e := newEmu(t, 1)
	h := install(t, e)
	a, b := newStream(t, e, 0), newStream(t, e, 0)
	src := hostAlloc(t, e, 256)
	fill(t, e, src, 256, 9)
	d := devAlloc(t, e, 256)
	out := hostAlloc(t, e, 256)
	g := h.hold(d)

	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: d, Src: src, Size: 256}, a))
	ea := newEvent(t, e, 0)
	require.NoError(t, e.EventRecord(ea, a))
	// Stream b is held by a wait on the pending event.
	require.NoError(t, e.StreamWaitEvent(b, ea))
	require.NoError(t, e.MemcpyAsync(DeviceToHost, Copy{Dst: out, Src: d, Size: 256}, b))
	eb := newEvent(t, e, 0)
	require.NoError(t, e.EventRecord(eb, b))

	g.waitReached(t)
	for _, ev := range []Event{ea, eb} {
		done, err := e.EventQuery(ev)
		require.NoError(t, err)
		require.False(t, done)
	}
	require.Equal(t, make([]byte, 256), mem(t, e, out, 256))

	g.release()
	require.NoError(t, within(t, "EventSynchronize", func() error { return e.EventSynchronize(eb) }))
	for _, ev := range []Event{ea, eb} {
		done, err := e.EventQuery(ev)
		require.NoError(t, err)
		require.True(t, done)
	}
	require.Equal(t, bytes.Repeat([]byte{9}, 256), mem(t, e, out, 256))
}

func TestCrossStreamWaitOrdersCopies(t *testing.T) {
	e := newEmu(t, 1)
	h := install(t, e)
	a, b := newStream(t, e, 0), newStream(t, e, 0)
	const size = 1 << 16
	src := hostAlloc(t, e, size)
	d1, d2 := devAlloc(t, e, size), devAlloc(t, e, size)
	out := hostAlloc(t, e, size)
	ev := newEvent(t, e, 0)
	for round := range 50 {
		fill(t, e, src, size, byte(round+1))
		var g *gate
		if round%2 == 0 {
			// Hold a's write, so that b would certainly run first but
			// for the wait.
			g = h.hold(d1)
		}
		require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: d1, Src: src, Size: size}, a))
		require.NoError(t, e.EventRecord(ev, a))
		require.NoError(t, e.StreamWaitEvent(b, ev))
		require.NoError(t, e.MemcpyAsync(DeviceToDevice, Copy{Dst: d2, Src: d1, Size: size}, b))
		require.NoError(t, e.MemcpyAsync(DeviceToHost, Copy{Dst: out, Src: d2, Size: size}, b))
		if g != nil {
			g.waitReached(t)
			g.release()
			h.mu.Lock()
			delete(h.gates, d1)
			h.mu.Unlock()
		}
		require.NoError(t, within(t, "StreamSynchronize", func() error { return e.StreamSynchronize(b) }))
		require.Equal(t, bytes.Repeat([]byte{byte(round + 1)}, size), mem(t, e, out, size), "round %d", round)
	}
}

func TestStreamWaitEventCapturesAtCall(t *testing.T) {
	e := newEmu(t, 1)
	h := install(t, e)
	a, b := newStream(t, e, 0), newStream(t, e, 0)
	src := hostAlloc(t, e, 64)
	fill(t, e, src, 64, 3)
	d1, d2 := devAlloc(t, e, 64), devAlloc(t, e, 64)
	out := hostAlloc(t, e, 64)
	g1, g2 := h.hold(d1), h.hold(d2)
	ev := newEvent(t, e, 0)

	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: d1, Src: src, Size: 64}, a))
	require.NoError(t, e.EventRecord(ev, a)) // capture 1: the copy to d1
	require.NoError(t, e.StreamWaitEvent(b, ev))
	require.NoError(t, e.MemcpyAsync(DeviceToHost, Copy{Dst: out, Src: d1, Size: 64}, b))
	eb := newEvent(t, e, 0)
	require.NoError(t, e.EventRecord(eb, b))

	// Re-record after more (held) work; b's wait still refers to capture 1.
	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: d2, Src: src, Size: 64}, a))
	require.NoError(t, e.EventRecord(ev, a))

	g1.release()
	g2.waitReached(t) // a is now held at the second copy
	require.NoError(t, within(t, "EventSynchronize", func() error { return e.EventSynchronize(eb) }))
	require.Equal(t, bytes.Repeat([]byte{3}, 64), mem(t, e, out, 64))
	// The event refers to its newest record, still held.
	done, err := e.EventQuery(ev)
	require.NoError(t, err)
	require.False(t, done)

	// A wait issued now captures record 2.
	c := newStream(t, e, 0)
	require.NoError(t, e.StreamWaitEvent(c, ev))
	ec := newEvent(t, e, 0)
	require.NoError(t, e.EventRecord(ec, c))
	done, err = e.EventQuery(ec)
	require.NoError(t, err)
	require.False(t, done)

	g2.release()
	require.NoError(t, within(t, "EventSynchronize", func() error { return e.EventSynchronize(ec) }))
	done, err = e.EventQuery(ev)
	require.NoError(t, err)
	require.True(t, done)
}

func TestEventReRecord(t *testing.T) {
	e := newEmu(t, 1)
	h := install(t, e)
	a, b := newStream(t, e, 0), newStream(t, e, 0)
	src := hostAlloc(t, e, 64)
	d := devAlloc(t, e, 64)
	ev := newEvent(t, e, 0)

	require.NoError(t, e.EventRecord(ev, a))
	require.NoError(t, e.EventSynchronize(ev))
	done, err := e.EventQuery(ev)
	require.NoError(t, err)
	require.True(t, done)

	// Re-record on another stream behind held work: the query follows.
	g := h.hold(d)
	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: d, Src: src, Size: 64}, b))
	require.NoError(t, e.EventRecord(ev, b))
	g.waitReached(t)
	done, err = e.EventQuery(ev)
	require.NoError(t, err)
	require.False(t, done)

	// And back to an idle stream: complete again once a reaches it,
	// although b is still held.
	require.NoError(t, e.EventRecord(ev, a))
	require.NoError(t, within(t, "EventSynchronize", func() error { return e.EventSynchronize(ev) }))
	done, err = e.EventQuery(ev)
	require.NoError(t, err)
	require.True(t, done)
	g.release()
	require.NoError(t, e.StreamSynchronize(b))
}

func TestCopyRangeValidation(t *testing.T) {
	e := newEmu(t, 1)
	s := newStream(t, e, 0)
	const size = 4096
	pinned := hostAlloc(t, e, size)
	dev := devAlloc(t, e, size)
	dev2 := devAlloc(t, e, size)
	plain, _ := plainMmap(t, size)

	cases := []struct {
		name string
		kind CopyKind
		c    Copy
		addr uint64 // the address the error must name
	}{
		{"H2D src not pinned", HostToDevice, Copy{Dst: dev, Src: plain, Size: 64}, plain},
		{"H2D src is device", HostToDevice, Copy{Dst: dev, Src: dev2, Size: 64}, dev2},
		{"H2D dst not device", HostToDevice, Copy{Dst: pinned, Src: pinned, Size: 64}, pinned},
		{"H2D dst plain", HostToDevice, Copy{Dst: plain, Src: pinned, Size: 64}, plain},
		{"H2D src past end by one", HostToDevice, Copy{Dst: dev, Src: pinned + 1, Size: size}, pinned + 1},
		{"H2D dst past end by one", HostToDevice, Copy{Dst: dev + 1, Src: pinned, Size: size}, dev + 1},
		{"D2H src not device", DeviceToHost, Copy{Dst: pinned, Src: plain, Size: 64}, plain},
		{"D2H dst not pinned", DeviceToHost, Copy{Dst: plain, Src: dev, Size: 64}, plain},
		{"D2H dst is device", DeviceToHost, Copy{Dst: dev2, Src: dev, Size: 64}, dev2},
		{"D2H src past end by one", DeviceToHost, Copy{Dst: pinned, Src: dev + size - 63, Size: 64}, dev + size - 63},
		{"D2H dst past end by one", DeviceToHost, Copy{Dst: pinned + size - 63, Src: dev, Size: 64}, pinned + size - 63},
		{"D2D src is pinned", DeviceToDevice, Copy{Dst: dev, Src: pinned, Size: 64}, pinned},
		{"D2D dst is pinned", DeviceToDevice, Copy{Dst: pinned, Src: dev, Size: 64}, pinned},
		{"D2D src past end by one", DeviceToDevice, Copy{Dst: dev2, Src: dev, Size: size + 1}, dev},
		{"D2D dst past end by one", DeviceToDevice, Copy{Dst: dev2 + size - 1, Src: dev, Size: 2}, dev2 + size - 1},
		{"wraps around", DeviceToDevice, Copy{Dst: dev2, Src: ^uint64(0) - 8, Size: 64}, ^uint64(0) - 8},
		{"unknown address", HostToDevice, Copy{Dst: dev, Src: 0x1000, Size: 1}, 0x1000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := e.MemcpyAsync(tc.kind, tc.c, s)
			requireCode(t, err, ErrCodeInvalidValue, fmt.Sprintf("%#x", tc.addr), fmt.Sprintf("(%d bytes)", tc.c.Size))
			err = e.MemcpyBatchAsync(tc.kind, []Copy{{Dst: dev, Src: dev2, Size: 0}, tc.c}, s)
			requireCode(t, err, ErrCodeInvalidValue, "copy 1 of 2", fmt.Sprintf("%#x", tc.addr))
		})
	}

	// Exactly the whole range is fine.
	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: dev, Src: pinned, Size: size}, s))
	require.NoError(t, e.MemcpyAsync(DeviceToDevice, Copy{Dst: dev2 + size - 1, Src: dev + size - 1, Size: 1}, s))
	// Zero-size copies are no-ops whatever the addresses.
	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: 1, Src: 2}, s))
	require.NoError(t, e.MemcpyBatchAsync(DeviceToHost, []Copy{{Dst: 1, Src: 2}}, s))
	require.NoError(t, e.MemcpyBatchAsync(DeviceToHost, nil, s))
	// An invalid kind is refused, even for an empty copy.
	requireCode(t, e.MemcpyAsync(CopyKind(9), Copy{}, s), ErrCodeInvalidValue, "CopyKind(9)")
	requireCode(t, e.MemcpyBatchAsync(0, []Copy{{}}, s), ErrCodeInvalidValue)
	require.NoError(t, e.StreamSynchronize(s))

	// Registered ranges count while registered.
	require.NoError(t, e.HostRegister(plain, size))
	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: dev, Src: plain, Size: size}, s))
	require.NoError(t, e.HostUnregister(plain))
	requireCode(t, e.MemcpyAsync(HostToDevice, Copy{Dst: dev, Src: plain, Size: 1}, s), ErrCodeInvalidValue)

	require.NoError(t, e.RegisterDeviceRange(0, plain, size))
	require.NoError(t, e.MemcpyAsync(DeviceToHost, Copy{Dst: pinned, Src: plain + 8, Size: size - 8}, s))
	require.NoError(t, e.MemcpyAsync(DeviceToDevice, Copy{Dst: plain, Src: dev, Size: size}, s))
	require.NoError(t, e.StreamSynchronize(s))
	require.NoError(t, e.UnregisterDeviceRange(plain))
	requireCode(t, e.MemcpyAsync(DeviceToHost, Copy{Dst: pinned, Src: plain, Size: 1}, s), ErrCodeInvalidValue)
}

func TestRegisteredDeviceRangeIsDeviceMemory(t *testing.T) {
	e := newEmu(t, 1)
	s := newStream(t, e, 0)
	// An engine's tensor: host memory kvbm did not allocate.
	tensor, tb := plainMmap(t, 8192)
	for i := range tb {
		tb[i] = byte(i)
	}
	require.NoError(t, e.RegisterDeviceRange(0, tensor, 8192))
	pinned := hostAlloc(t, e, 8192)
	require.NoError(t, e.MemcpyAsync(DeviceToHost, Copy{Dst: pinned, Src: tensor, Size: 8192}, s))
	require.NoError(t, e.StreamSynchronize(s))
	require.Equal(t, tb, mem(t, e, pinned, 8192))
	require.Equal(t, tb[100:200], mem(t, e, tensor+100, 100))
	require.NoError(t, e.UnregisterDeviceRange(tensor))
}

func TestBatchCopies(t *testing.T) {
	e := newEmu(t, 1)
	h := install(t, e)
	s := newStream(t, e, 0)
	const chunk, n = 1024, 32
	src := hostAlloc(t, e, chunk*n)
	b := mem(t, e, src, chunk*n)
	for i := range b {
		b[i] = byte(i / chunk)
	}
	d := devAlloc(t, e, chunk*n)
	out := hostAlloc(t, e, chunk*n)

	// Scatter in reverse order, then an overlapping write that must win.
	var h2d []Copy
	for i := range n {
		h2d = append(h2d, Copy{Dst: d + uint64(n-1-i)*chunk, Src: src + uint64(i)*chunk, Size: chunk})
	}
	h2d = append(h2d, Copy{Dst: d, Src: src + 5*chunk, Size: chunk})
	g := h.hold(d + uint64(n-1)*chunk) // the first copy of the batch
	require.NoError(t, e.MemcpyBatchAsync(HostToDevice, h2d, s))
	// The batch was copied at enqueue: changing the caller's slice now
	// does nothing.
	for i := range h2d {
		h2d[i] = Copy{Dst: d, Src: src, Size: chunk}
	}
	var d2h []Copy
	for i := range n {
		d2h = append(d2h, Copy{Dst: out + uint64(i)*chunk, Src: d + uint64(i)*chunk, Size: chunk})
	}
	require.NoError(t, e.MemcpyBatchAsync(DeviceToHost, d2h, s))
	g.waitReached(t)
	g.release()
	require.NoError(t, e.StreamSynchronize(s))
	got := mem(t, e, out, chunk*n)
	require.Equal(t, bytes.Repeat([]byte{5}, chunk), got[:chunk])
	for i := 1; i < n; i++ {
		require.Equal(t, bytes.Repeat([]byte{byte(n - 1 - i)}, chunk), got[i*chunk:(i+1)*chunk], "chunk %d", i)
	}

	// One bad copy refuses the whole batch: nothing moves.
	fill(t, e, out, chunk*n, 0xee)
	bad := []Copy{{Dst: out, Src: d, Size: chunk}, {Dst: out + chunk, Src: d + chunk*n, Size: 1}}
	requireCode(t, e.MemcpyBatchAsync(DeviceToHost, bad, s), ErrCodeInvalidValue, "copy 1 of 2")
	require.NoError(t, e.StreamSynchronize(s))
	require.Equal(t, bytes.Repeat([]byte{0xee}, chunk*n), mem(t, e, out, chunk*n))
}

func TestFaultInjection(t *testing.T) {
	e := newEmu(t, 1)
	h := install(t, e)
	injected := errors.New("injected ECC error")
	a, b := newStream(t, e, 0), newStream(t, e, 0)
	src := hostAlloc(t, e, 128)
	fill(t, e, src, 128, 1)
	good, faulty, after := devAlloc(t, e, 128), devAlloc(t, e, 128), devAlloc(t, e, 128)
	h.fail(faulty, injected)
	e1, e2, e3 := newEvent(t, e, 0), newEvent(t, e, 0), newEvent(t, e, 0)

	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: good, Src: src, Size: 128}, a))
	require.NoError(t, e.EventRecord(e1, a))
	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: faulty, Src: src, Size: 128}, a))
	require.NoError(t, e.EventRecord(e2, a))
	require.NoError(t, e.MemcpyBatchAsync(HostToDevice, []Copy{{Dst: after, Src: src, Size: 128}}, a))
	require.NoError(t, e.EventRecord(e3, a))
	// b depends on the failed work.
	require.NoError(t, e.StreamWaitEvent(b, e2))
	require.NoError(t, e.MemcpyAsync(DeviceToDevice, Copy{Dst: after, Src: good, Size: 128}, b))

	err := e.StreamSynchronize(a)
	require.ErrorIs(t, err, injected)
	require.Contains(t, err.Error(), "H2D")
	require.Contains(t, err.Error(), fmt.Sprintf("%#x", faulty))
	require.ErrorIs(t, e.StreamSynchronize(a), injected, "the error is sticky")

	done, err := e.EventQuery(e1)
	require.NoError(t, err)
	require.True(t, done)
	require.NoError(t, e.EventSynchronize(e1))
	for _, ev := range []Event{e2, e3} {
		done, err := e.EventQuery(ev)
		require.True(t, done)
		require.ErrorIs(t, err, injected)
		require.ErrorIs(t, e.EventSynchronize(ev), injected)
	}
	require.ErrorIs(t, e.StreamSynchronize(b), injected, "a wait on failed work fails the waiter")
	require.Equal(t, bytes.Repeat([]byte{1}, 128), mem(t, e, good, 128))
	require.Equal(t, make([]byte, 128), mem(t, e, faulty, 128), "the failed copy moved nothing")
	require.Equal(t, make([]byte, 128), mem(t, e, after, 128), "work after the failure is skipped")
	require.Equal(t, 0, h.copies(after))

	// A new stream works; so does an event recorded afresh on it.
	c := newStream(t, e, 0)
	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: after, Src: src, Size: 128}, c))
	require.NoError(t, e.EventRecord(e2, c))
	require.NoError(t, e.EventSynchronize(e2))
	require.NoError(t, e.StreamSynchronize(c))
	require.Equal(t, bytes.Repeat([]byte{1}, 128), mem(t, e, after, 128))

	// Without the hook the formerly faulty destination works.
	e.InjectCopyFault(nil)
	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: faulty, Src: src, Size: 128}, c))
	require.NoError(t, e.StreamSynchronize(c))
	require.Equal(t, bytes.Repeat([]byte{1}, 128), mem(t, e, faulty, 128))
}

func TestRegisterAndFreeErrors(t *testing.T) {
	e := newEmu(t, 1)
	plain, _ := plainMmap(t, 1<<16)
	pinned := hostAlloc(t, e, 4096)
	dev := devAlloc(t, e, 4096)

	require.NoError(t, e.HostRegister(plain, 8192))
	requireCode(t, e.HostRegister(plain, 8192), ErrCodeHostMemoryAlreadyRegistered, fmt.Sprintf("%#x", plain))
	requireCode(t, e.HostRegister(plain+4096, 8192), ErrCodeHostMemoryAlreadyRegistered)
	requireCode(t, e.HostRegister(plain+100, 1), ErrCodeHostMemoryAlreadyRegistered)
	requireCode(t, e.HostRegister(pinned, 4096), ErrCodeHostMemoryAlreadyRegistered)
	require.NoError(t, e.HostRegister(plain+8192, 4096), "adjacent ranges do not overlap")
	requireCode(t, e.HostRegister(0, 4096), ErrCodeInvalidValue)
	requireCode(t, e.HostRegister(plain+20000, 0), ErrCodeInvalidValue)
	requireCode(t, e.HostRegister(^uint64(0)-10, 100), ErrCodeInvalidValue)

	requireCode(t, e.HostUnregister(plain+4096), ErrCodeHostMemoryNotRegistered, "not the start")
	requireCode(t, e.HostUnregister(0x1000), ErrCodeHostMemoryNotRegistered)
	requireCode(t, e.HostUnregister(pinned), ErrCodeHostMemoryNotRegistered, "allocation")
	requireCode(t, e.HostFree(plain), ErrCodeInvalidValue, "registered")
	require.NoError(t, e.HostUnregister(plain))
	requireCode(t, e.HostUnregister(plain), ErrCodeHostMemoryNotRegistered)
	require.NoError(t, e.HostUnregister(plain+8192))

	requireCode(t, e.HostFree(0x1000), ErrCodeInvalidValue, "0x1000")
	requireCode(t, e.HostFree(pinned+1), ErrCodeInvalidValue)
	requireCode(t, e.HostFree(dev), ErrCodeInvalidValue)
	require.NoError(t, e.HostFree(pinned))
	requireCode(t, e.HostFree(pinned), ErrCodeInvalidValue)
	_, err := e.Bytes(pinned, 1)
	requireCode(t, err, ErrCodeInvalidValue)

	requireCode(t, e.MemFree(0x1000), ErrCodeInvalidValue)
	requireCode(t, e.MemFree(dev+8), ErrCodeInvalidValue)
	require.NoError(t, e.RegisterDeviceRange(0, plain, 4096))
	requireCode(t, e.RegisterDeviceRange(0, plain+10, 4096), ErrCodeInvalidValue, "overlaps")
	// A range inside a MemAlloc allocation already is device memory (an
	// engine's cudaMalloc'd tensor): registering it checks and counts.
	require.NoError(t, e.RegisterDeviceRange(0, dev, 4096))
	require.NoError(t, e.UnregisterDeviceRange(dev))
	requireCode(t, e.RegisterDeviceRange(0, dev+4096-8, 4096), ErrCodeInvalidValue, "overlaps")
	requireCode(t, e.RegisterDeviceRange(0, 0, 4096), ErrCodeInvalidValue)
	requireCode(t, e.MemFree(plain), ErrCodeInvalidValue, "registered")
	requireCode(t, e.UnregisterDeviceRange(dev), ErrCodeInvalidValue, "allocation")
	requireCode(t, e.UnregisterDeviceRange(0x1000), ErrCodeInvalidValue)
	require.NoError(t, e.UnregisterDeviceRange(plain))
	requireCode(t, e.UnregisterDeviceRange(plain), ErrCodeInvalidValue)
	require.NoError(t, e.MemFree(dev))
	requireCode(t, e.MemFree(dev), ErrCodeInvalidValue)

	_, err = e.MemAlloc(0, 0)
	requireCode(t, err, ErrCodeInvalidValue)
	_, err = e.HostAlloc(0, 0)
	requireCode(t, err, ErrCodeInvalidValue)
	_, err = e.MemAlloc(0, EmulatedDeviceMemory+1)
	requireCode(t, err, ErrCodeOutOfMemory)
}

func TestDeviceMemoryAccounting(t *testing.T) {
	e := newEmu(t, 2)
	const limit = 1 << 20
	e.deviceMemory = limit // as if the devices were this small
	info, err := e.Device(1)
	require.NoError(t, err)
	require.Equal(t, uint64(limit), info.TotalMemory)
	big, err := e.MemAlloc(0, limit-4096)
	require.NoError(t, err)
	p, err := e.MemAlloc(0, 4096)
	require.NoError(t, err)
	_, err = e.MemAlloc(0, 1)
	requireCode(t, err, ErrCodeOutOfMemory, "device 0")
	other, err := e.MemAlloc(1, 4096) // another device has its own memory
	require.NoError(t, err)
	// Registered ranges do not count.
	plain, _ := plainMmap(t, 8192)
	require.NoError(t, e.RegisterDeviceRange(0, plain, 8192))
	require.NoError(t, e.UnregisterDeviceRange(plain))
	require.NoError(t, e.MemFree(p))
	p, err = e.MemAlloc(0, 4096)
	require.NoError(t, err)
	for _, q := range []uint64{big, p, other} {
		require.NoError(t, e.MemFree(q))
	}
	p, err = e.MemAlloc(0, limit)
	require.NoError(t, err)
	require.NoError(t, e.MemFree(p))
}

func TestBytes(t *testing.T) {
	e := newEmu(t, 1)
	d := devAlloc(t, e, 100)
	b := mem(t, e, d, 100)
	require.Len(t, b, 100)
	b[99] = 42
	require.Equal(t, []byte{42}, mem(t, e, d+99, 1))
	require.Empty(t, mem(t, e, d+100, 0))
	_, err := e.Bytes(d, 101)
	requireCode(t, err, ErrCodeInvalidValue, fmt.Sprintf("%#x", d))
	_, err = e.Bytes(d+50, 51)
	requireCode(t, err, ErrCodeInvalidValue)
	_, err = e.Bytes(0x1000, 1)
	requireCode(t, err, ErrCodeInvalidValue)
}

func TestStreamDestroyWithQueuedWork(t *testing.T) {
	e := newEmu(t, 1)
	h := install(t, e)
	s := newStream(t, e, 0)
	src := hostAlloc(t, e, 512)
	fill(t, e, src, 512, 4)
	d := devAlloc(t, e, 512)
	out := hostAlloc(t, e, 512)
	g := h.hold(d)
	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: d, Src: src, Size: 512}, s))
	for i := range 100 {
		require.NoError(t, e.MemcpyAsync(DeviceToHost, Copy{Dst: out + uint64(i), Src: d + uint64(i), Size: 512 - uint64(i)}, s))
	}
	ev := newEvent(t, e, 0)
	require.NoError(t, e.EventRecord(ev, s))
	require.NoError(t, e.StreamDestroy(s))

	// The handle is gone at once; the work is not.
	requireCode(t, e.StreamSynchronize(s), ErrCodeInvalidHandle)
	requireCode(t, e.MemcpyAsync(HostToDevice, Copy{Dst: d, Src: src, Size: 1}, s), ErrCodeInvalidHandle)
	requireCode(t, e.StreamDestroy(s), ErrCodeInvalidHandle)
	done, err := e.EventQuery(ev)
	require.NoError(t, err)
	require.False(t, done)

	g.release()
	require.NoError(t, within(t, "EventSynchronize", func() error { return e.EventSynchronize(ev) }))
	require.Equal(t, bytes.Repeat([]byte{4}, 512), mem(t, e, out, 512))
}

func TestHandleErrors(t *testing.T) {
	e := newEmu(t, 2)
	s := newStream(t, e, 0)
	ev := newEvent(t, e, 0)
	const unknown = 1 << 20
	check := func(what string, err error) {
		t.Helper()
		require.Truef(t, IsCode(err, ErrCodeInvalidHandle), "%s: want CUDA_ERROR_INVALID_HANDLE, got %v", what, err)
	}
	for _, bad := range []Stream{unknown, Stream(ev)} {
		check("StreamDestroy", e.StreamDestroy(bad))
		check("StreamSynchronize", e.StreamSynchronize(bad))
		check("StreamWaitEvent", e.StreamWaitEvent(bad, ev))
		check("EventRecord", e.EventRecord(ev, bad))
		check("MemcpyAsync", e.MemcpyAsync(HostToDevice, Copy{}, bad))
		check("MemcpyBatchAsync", e.MemcpyBatchAsync(HostToDevice, nil, bad))
	}
	for _, bad := range []Event{0, unknown, Event(s)} {
		check("EventDestroy", e.EventDestroy(bad))
		check("EventRecord", e.EventRecord(bad, s))
		check("StreamWaitEvent", e.StreamWaitEvent(s, bad))
		_, err := e.EventQuery(bad)
		check("EventQuery", err)
		check("EventSynchronize", e.EventSynchronize(bad))
	}
	require.NoError(t, e.EventDestroy(ev))
	check("EventDestroy twice", e.EventDestroy(ev))
	_, err := e.EventQuery(ev)
	check("EventQuery destroyed", err)
	require.NoError(t, e.StreamDestroy(s))
	check("StreamDestroy twice", e.StreamDestroy(s))

	// An event on device 1 cannot be recorded on a stream of device 0.
	ev1 := newEvent(t, e, 1)
	s0 := newStream(t, e, 0)
	requireCode(t, e.EventRecord(ev1, s0), ErrCodeInvalidHandle, "device 1", "device 0")
	require.NoError(t, e.EventRecord(ev1, newStream(t, e, 1)))
	require.NoError(t, e.StreamWaitEvent(s0, ev1), "waits may cross devices")
	require.NoError(t, e.StreamSynchronize(s0))

	// Handles are small, non-zero and never reused.
	seen := map[uint64]bool{uint64(s): true, uint64(ev): true, uint64(ev1): true, uint64(s0): true}
	for range 200 {
		s := newStream(t, e, 0)
		ev := newEvent(t, e, 0)
		for _, h := range []uint64{uint64(s), uint64(ev)} {
			require.NotZero(t, h)
			require.Less(t, h, uint64(1000))
			require.False(t, seen[h], "handle %d reused", h)
			seen[h] = true
		}
		require.NoError(t, e.StreamDestroy(s))
		require.NoError(t, e.EventDestroy(ev))
	}
}

func TestCloseLeavesNothing(t *testing.T) {
	e := NewEmulated(2)
	h := &hooks{gates: map[uint64]*gate{}, faults: map[uint64]error{}, count: map[uint64]int{}}
	e.InjectCopyFault(h.hook)
	src, err := e.HostAlloc(0, 1<<20)
	require.NoError(t, err)
	d, err := e.MemAlloc(1, 1<<20)
	require.NoError(t, err)
	var streams []Stream
	for i := range 8 {
		s, err := e.StreamCreate(i % 2)
		require.NoError(t, err)
		streams = append(streams, s)
		for range 50 {
			require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: d, Src: src, Size: 1 << 20}, s))
		}
	}
	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: d, Src: src, Size: 1}, 0))
	// A destroyed stream still draining.
	require.NoError(t, e.StreamDestroy(streams[7]))

	// Stream 0 is held in the hook; stream 1 waits on it; a synchronize
	// on stream 1 is pending when Close runs.
	g := h.hold(d + 1)
	require.NoError(t, e.MemcpyAsync(HostToDevice, Copy{Dst: d + 1, Src: src, Size: 1}, streams[0]))
	ev, err := e.EventCreate(0)
	require.NoError(t, err)
	require.NoError(t, e.EventRecord(ev, streams[0]))
	require.NoError(t, e.StreamWaitEvent(streams[1], ev))
	g.waitReached(t)
	syncErr := make(chan error, 1)
	go func() { syncErr <- e.StreamSynchronize(streams[1]) }()

	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	// The pending wait is abandoned at once; Close itself waits for the
	// copy in the hook.
	select {
	case err := <-syncErr:
		requireCode(t, err, ErrCodeNotInitialized)
	case <-closed:
		require.FailNow(t, "Close returned while a copy was executing")
	}
	g.release()
	require.NoError(t, within(t, "Close", func() error { return <-closed }))

	requireCode(t, e.StreamSynchronize(0), ErrCodeNotInitialized)
	requireCode(t, e.StreamSynchronize(streams[2]), ErrCodeNotInitialized)
	requireCode(t, e.MemcpyAsync(HostToDevice, Copy{Dst: d, Src: src, Size: 1}, 0), ErrCodeNotInitialized)
	_, err = e.StreamCreate(0)
	requireCode(t, err, ErrCodeNotInitialized)
	_, err = e.EventQuery(ev)
	requireCode(t, err, ErrCodeNotInitialized)
	_, err = e.MemAlloc(0, 1)
	requireCode(t, err, ErrCodeNotInitialized)
	_, err = e.Bytes(src, 1)
	requireCode(t, err, ErrCodeNotInitialized)
	requireCode(t, e.HostFree(src), ErrCodeNotInitialized)
	_, err = e.DeviceCount()
	requireCode(t, err, ErrCodeNotInitialized)
	require.NoError(t, e.Close(), "Close is idempotent")
	goleak.VerifyNone(t)
}

func TestConcurrentStreams(t *testing.T) {
	e := newEmu(t, 2)
	const workers, rounds, size = 16, 200, 4096
	shared := []Stream{newStream(t, e, 0), newStream(t, e, 1)}
	var wg sync.WaitGroup
	errs := make(chan error, workers*2)
	for w := range workers {
		wg.Go(func() { errs <- concurrentWorker(e, w, rounds, size, shared) })
		// Table churn alongside: allocations and registrations come and go.
		wg.Go(func() {
			errs <- func() error {
				for range rounds {
					p, err := e.MemAlloc(w%2, 8192)
					if err != nil {
						return err
					}
					if err := e.HostRegister(p, 4096); err != nil {
						return err
					}
					if err := e.HostUnregister(p); err != nil {
						return err
					}
					if err := e.MemFree(p); err != nil {
						return err
					}
				}
				return nil
			}()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// concurrentWorker moves a round-specific pattern host → device on its own
// stream, a shared stream or the legacy stream, and back on another stream
// ordered by an event, checking every round.
func concurrentWorker(e *Emulated, w, rounds int, size uint64, shared []Stream) (err error) {
	dev := w % 2
	var cleanups []func() error
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			err = errors.Join(err, cleanups[i]())
		}
	}()
	own, err := e.StreamCreate(dev)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() error { return e.StreamDestroy(own) })
	other, err := e.StreamCreate(dev)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() error { return e.StreamDestroy(other) })
	ev, err := e.EventCreate(dev)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() error { return e.EventDestroy(ev) })
	src, err := e.HostAlloc(dev, size)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() error { return e.HostFree(src) })
	d, err := e.MemAlloc(dev, size)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() error { return e.MemFree(d) })
	out, err := e.HostAlloc(dev, size)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() error { return e.HostFree(out) })
	srcB, err := e.Bytes(src, size)
	if err != nil {
		return err
	}
	outB, err := e.Bytes(out, size)
	if err != nil {
		return err
	}
	for r := range rounds {
		v := byte(w*rounds + r)
		for i := range srcB {
			srcB[i] = v
		}
		s := own
		switch r % 3 {
		case 1:
			s = shared[dev]
		case 2:
			s = 0
		}
		if err := e.MemcpyAsync(HostToDevice, Copy{Dst: d, Src: src, Size: size / 2}, s); err != nil {
			return err
		}
		half := []Copy{{Dst: d + size/2, Src: src + size/2, Size: size / 4}, {Dst: d + 3*size/4, Src: src + 3*size/4, Size: size / 4}}
		if err := e.MemcpyBatchAsync(HostToDevice, half, s); err != nil {
			return err
		}
		if err := e.EventRecord(ev, s); err != nil {
			return err
		}
		if err := e.StreamWaitEvent(other, ev); err != nil {
			return err
		}
		if err := e.MemcpyAsync(DeviceToHost, Copy{Dst: out, Src: d, Size: size}, other); err != nil {
			return err
		}
		if err := e.StreamSynchronize(other); err != nil {
			return err
		}
		if !bytes.Equal(outB, bytes.Repeat([]byte{v}, int(size))) {
			return fmt.Errorf("worker %d round %d on stream %d: wrong data", w, r, s)
		}
	}
	return nil
}
