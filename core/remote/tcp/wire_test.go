package tcp

import (
	"bytes"
	"testing"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/remote/capability"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/stretchr/testify/require"
)

func TestRequestRoundTripAndLimits(t *testing.T) {
	h := transfer.LayoutHandle{Worker: 0xE1, Layout: 3}
	ops := []transfer.RemoteOp{{Remote: 0x1000, Size: 64}, {Remote: 0x9000, Size: 1 << 20}}
	b := appendRequest(nil, opWrite, h, ops)
	q, _, err := readRequest(bytes.NewReader(b), nil)
	require.NoError(t, err)
	require.Equal(t, opWrite, q.op)
	require.Equal(t, h, q.handle)
	require.Equal(t, uint64(64+1<<20), q.bytes)
	require.Equal(t, []transfer.RemoteOp{{Remote: 0x1000, Size: 64}, {Remote: 0x9000, Size: 1 << 20}}, q.ops)

	m, _, err := readRequest(bytes.NewReader(appendRequest(nil, opMap, h, nil)), nil)
	require.NoError(t, err)
	require.Equal(t, opMap, m.op)
	require.Empty(t, m.ops)

	for name, bad := range map[string][]byte{
		"op":        append([]byte{9}, b[1:]...),
		"map ops":   appendRequest(nil, opMap, h, ops),
		"no ops":    appendRequest(nil, opRead, h, nil),
		"zero size": appendRequest(nil, opRead, h, []transfer.RemoteOp{{Remote: 1, Size: 0}}),
		"too large": appendRequest(nil, opRead, h, []transfer.RemoteOp{{Remote: 1, Size: maxRequestBytes}, {Remote: 2, Size: 1}}),
	} {
		_, _, err := readRequest(bytes.NewReader(bad), nil)
		require.ErrorIs(t, err, remote.ErrBadEndpoint, name)
	}
	_, _, err = readRequest(bytes.NewReader(b[:len(b)-3]), nil)
	require.Error(t, err, "truncated")
}

// FuzzReadRequest: whatever a peer sends, the server's decoder returns a
// request within the limits or an error, never panics, and what it accepts
// encodes back to the same bytes.
func FuzzReadRequest(f *testing.F) {
	f.Add(appendRequest(nil, opRead, transfer.LayoutHandle{Worker: 1, Layout: 2}, []transfer.RemoteOp{{Remote: 4096, Size: 512}}))
	f.Add(appendRequest(nil, opWrite, transfer.LayoutHandle{Worker: 1, Layout: 2}, []transfer.RemoteOp{{Remote: 1, Size: 1}, {Remote: 2, Size: 3}}))
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		q, _, err := readRequest(bytes.NewReader(data), nil)
		if err != nil {
			return
		}
		require.LessOrEqual(t, len(q.ops), maxOps)
		require.LessOrEqual(t, q.bytes, uint64(maxRequestBytes))
		again := appendRequest(nil, q.op, q.handle, q.ops)
		require.Equal(t, data[:len(again)], again)
	})
}

// FuzzTCPEndpoint: endpoints come from metadata, that is from the network.
func FuzzTCPEndpoint(f *testing.F) {
	f.Add(tcpEndpoint{worker: 1, addr: "127.0.0.1:4000"}.append(nil))
	f.Add(tcpEndpoint{worker: 1, scope: capability.ScopeReadOnly, key: capability.KeyFromRaw32([capability.KeyLen]byte{9}), host: [16]byte{1}, unix: "@kvbm-1", addr: "[::1]:4000"}.append(nil))
	f.Add(tcpEndpoint{worker: 2, flags: flagTLS, unix: "@kvbm-2", addr: "10.0.0.2:4000"}.append(nil))
	desc, _ := remote.EncodeScope(1, remote.Scope{Layouts: []remote.ScopedLayout{{Layout: transfer.LayoutHandle{Worker: 1, Layout: 2}, Blocks: []int{3, 4}}}}, 1)
	f.Add(tcpEndpoint{worker: 1, scope: capability.ScopeBlocks, key: capability.KeyFromRaw32([capability.KeyLen]byte{9}), desc: desc, addr: "127.0.0.1:4000"}.append(nil))
	short := tcpEndpoint{worker: 1, scope: capability.ScopeBlocks, desc: desc, addr: "1:2"}.append(nil)
	f.Add(short[:len(short)-20]) // long enough before the scope is cut, too short after
	f.Add([]byte{1})
	f.Add(append([]byte{2, 1, 0, 0, 0, 0, 0, 0, 0}, "10.0.0.1:4000"...))
	f.Fuzz(func(t *testing.T, ep []byte) {
		e, err := parseTCPEndpoint(ep)
		if err != nil {
			require.ErrorIs(t, err, remote.ErrBadEndpoint)
			return
		}
		require.Equal(t, byte(endpointVersion), ep[0], "older versions are refused")
		require.Equal(t, ep, e.append(nil), "what parses encodes back to the same bytes")
	})
}

// FuzzParseRegions: a map reply comes from the peer.
func FuzzParseRegions(f *testing.F) {
	f.Add(appendRegions(nil, []transfer.SharedRegion{{Addr: 1 << 40, Size: 4096}}))
	f.Add(appendRegions(nil, []transfer.SharedRegion{{Addr: 1 << 40, Size: 4096}, {Addr: 1 << 41, Size: 1 << 20, IPC: &cuda.IPCHandle{7}}}))
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		rs, err := parseRegions(b)
		if err != nil {
			require.ErrorIs(t, err, remote.ErrBadEndpoint)
			return
		}
		require.NotEmpty(t, rs)
		require.LessOrEqual(t, len(rs), maxRegions)
		regions := make([]transfer.SharedRegion, len(rs))
		for i, r := range rs {
			require.NotZero(t, r.size)
			require.GreaterOrEqual(t, r.addr+r.size, r.addr)
			regions[i] = transfer.SharedRegion{Addr: r.addr, Size: r.size, IPC: r.ipc}
		}
		require.Equal(t, b, appendRegions(nil, regions), "what parses encodes back to the same bytes")
	})
}
