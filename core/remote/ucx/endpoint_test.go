package ucx

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/stretchr/testify/require"
)

// fakeRkey is a packed rkey frame: a map of two memory domains, a memory
// type, and two keys of 3 and 0 bytes.
func fakeRkey() []byte {
	b := binary.LittleEndian.AppendUint64(nil, 0b101)
	return append(b, 0, 3, 0xA, 0xB, 0xC, 0)
}

func sampleEndpoint() *endpointInfo {
	return &endpointInfo{
		address: []byte("worker-address"),
		proc:    procIdentity{bootID: "boot", pidNS: "pid:[1]", pid: 42, start: 7},
		segs:    shmSegs{maxSegSize, ucxSegSize, 0},
		mode:    modeOneSided,
		worker:  0xE,
		layouts: []layoutInfo{
			{handle: transfer.LayoutHandle{Worker: 0xE, Layout: 1}, kind: storage.Pinned,
				regions: []regionInfo{{base: 0x1000, size: 4096, rkey: fakeRkey()}, {base: 0x9000, size: 512, rkey: fakeRkey()}}},
			{handle: transfer.LayoutHandle{Worker: 0xE, Layout: 2}, kind: storage.Device, reason: "no CUDA here"},
		},
	}
}

// sampleMessagesEndpoint is a message mode's block-scoped endpoint: a
// key, a descriptor, regions without rkeys.
func sampleMessagesEndpoint(t testing.TB) *endpointInfo {
	desc, err := capability.EncodeBlockScope(0xE, []capability.LayoutBlocks{{Handle: capability.Handle{Worker: 0xE, Layout: 1}, Blocks: []int{0, 1}}}, time.Time{}, 3)
	require.NoError(t, err)
	s, err := capability.NewSecret()
	require.NoError(t, err)
	return &endpointInfo{
		address: []byte("worker-address"),
		proc:    procIdentity{bootID: "boot", pidNS: "pid:[1]", pid: 42, start: 7},
		mode:    modeMessages, worker: 0xE, scope: capability.ScopeBlocks, key: s.Blocks(desc), desc: desc,
		layouts: []layoutInfo{{handle: transfer.LayoutHandle{Worker: 0xE, Layout: 1}, kind: storage.Pinned,
			regions: []regionInfo{{base: 0x1000, size: 4096}}}},
	}
}

func TestEndpointRoundTrip(t *testing.T) {
	for _, e := range []*endpointInfo{sampleEndpoint(), sampleMessagesEndpoint(t)} {
		testEndpointRoundTrip(t, e)
	}
	// An rkey has no place in the message mode, a scope's descriptor none
	// outside a block scope.
	e := sampleMessagesEndpoint(t)
	e.layouts[0].regions[0].rkey = fakeRkey()
	_, err := decodeEndpoint(e.encode())
	require.ErrorIs(t, err, remote.ErrBadEndpoint)
	e = sampleMessagesEndpoint(t)
	e.scope = capability.ScopeReadOnly
	_, err = decodeEndpoint(e.encode())
	require.ErrorIs(t, err, remote.ErrBadEndpoint)
	// Another kvbm's endpoint (the one before segments) is named as such.
	b := sampleEndpoint().encode()
	copy(b, "KVBMUCX2")
	_, err = decodeEndpoint(b)
	require.ErrorIs(t, err, remote.ErrBadEndpoint)
	require.ErrorContains(t, err, `an endpoint of another kvbm version ("KVBMUCX2"; this one reads "KVBMUCX3")`)
}

func testEndpointRoundTrip(t *testing.T, e *endpointInfo) {
	got, err := decodeEndpoint(e.encode())
	require.NoError(t, err)
	require.Equal(t, e.encode(), got.encode())
	require.True(t, e.key.Equal(got.key))
	got.key, e.key = capability.Key{}, capability.Key{}
	require.Equal(t, e, got)
	b := e.encode()
	for n := 0; n < len(b); n++ {
		_, err := decodeEndpoint(b[:n])
		require.ErrorIs(t, err, remote.ErrBadEndpoint, "truncated to %d bytes", n)
	}
}

func TestCheckRkey(t *testing.T) {
	rk := fakeRkey()
	require.NoError(t, checkRkey(rk))
	require.NoError(t, checkRkey(append(rk, 1, 2, 3)), "a tail (system device, distances) is allowed")
	for n := 0; n < len(rk); n++ {
		require.Error(t, checkRkey(rk[:n]), "%d bytes", n)
	}
	require.ErrorContains(t, checkRkeyFrame(make([]byte, 9), false), "no memory domain")
	for _, t8 := range []byte{2, 9, 0xFF} { // CUDA managed, past the last type
		bad := append([]byte{}, rk...)
		bad[8] = t8
		require.ErrorContains(t, checkRkey(bad), "memory type", "type %d", t8)
	}
	rk[8] = memTypeCUDA
	require.NoError(t, checkRkey(rk))
}

// From UCX 1.20 an empty map is software emulation's key, and a key with
// domains carries its system device, and distances up to a terminator
// when the device is known: UCX reads them until it finds one.
func TestCheckRkeyFrom120(t *testing.T) {
	require.NoError(t, checkRkeyFrame(make([]byte, 9), true))
	rk := fakeRkey()
	require.NoError(t, checkRkeyFrame(rk, true), "from an older UCX: the padding's device byte")
	require.Equal(t, byte(sysDevUnknown), rkeyPadding[0])
	require.NoError(t, checkRkeyFrame(append(rk, 0xFF), true), "device unknown")
	known := append(append([]byte{}, rk...), 0x81, 2, 7, 7, 3, 7, 7, 0xFF)
	require.NoError(t, checkRkeyFrame(known, true))
	for n := len(rk) + 1; n < len(known); n++ { // the device byte, then cut distances
		require.Error(t, checkRkeyFrame(known[:n], true), "%d bytes", n)
	}
	require.NoError(t, checkRkeyFrame(known, false), "before 1.20 the tail is not read")
}

// FuzzDecodeEndpoint: any input decodes or fails with ErrBadEndpoint,
// never panics, and what decodes encodes back to the same bytes.
func FuzzDecodeEndpoint(f *testing.F) {
	f.Add(sampleEndpoint().encode())
	f.Add(sampleMessagesEndpoint(f).encode())
	f.Add([]byte(endpointMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEndpoint(b)
		if err != nil {
			require.ErrorIs(t, err, remote.ErrBadEndpoint)
			return
		}
		require.True(t, bytes.Equal(b, e.encode()))
		for _, l := range e.layouts {
			for _, r := range l.regions {
				if e.mode == modeOneSided {
					require.NoError(t, checkRkey(r.rkey))
				} else {
					require.Empty(t, r.rkey)
				}
			}
		}
	})
}

// ucxFrameEnd walks a key as UCX 1.20 reads it after ucp_ep_rkey_unpack
// (src/ucp/core/ucp_rkey.c: the map, the memory type, each domain's size
// and key, then the system device and, when it is known, distances up to
// a terminator) over the key and the padding kvbm puts after it, and
// returns how many bytes it reads; -1 when it would read past them.
func ucxFrameEnd(b []byte) int {
	buf := append(append([]byte{}, b...), rkeyPadding...)
	if len(b) < 9 {
		return -1
	}
	mdMap := binary.LittleEndian.Uint64(buf)
	p := 9
	for i := 0; i < bits.OnesCount64(mdMap); i++ {
		if p >= len(buf) {
			return -1
		}
		p += 1 + int(buf[p])
	}
	if mdMap == 0 {
		return p
	}
	if p >= len(buf) {
		return -1
	}
	dev := buf[p]
	p++
	if dev == sysDevUnknown {
		return p
	}
	for ; p < len(buf) && buf[p] != sysDevUnknown; p += rkeyDistanceLen {
	}
	if p >= len(buf) {
		return -1
	}
	return p + 1
}

// FuzzCheckRkeyFrame: any bytes are accepted or refused without a panic,
// and what 1.20's rules accept names a memory type kvbm exports and UCX
// reads within the key and the padding's first byte (ucxFrameEnd, a model
// of UCX's walk of its own).
func FuzzCheckRkeyFrame(f *testing.F) {
	f.Add(fakeRkey())
	f.Add(append(fakeRkey(), 0x81, 2, 7, 7, 0xFF))
	f.Add(make([]byte, 9))
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = checkRkeyFrame(b, false)
		if checkRkeyFrame(b, true) != nil {
			return
		}
		require.LessOrEqual(t, b[8], byte(memTypeCUDA), "UCX indexes its tables by the memory type")
		end := ucxFrameEnd(b)
		require.True(t, end >= 0 && end <= len(b)+1, "UCX reads %d bytes of a %d-byte key", end, len(b))
	})
}
