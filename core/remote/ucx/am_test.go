package ucx

import (
	"testing"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/stretchr/testify/require"
)

// Every message header round-trips, and one of the wrong size for its
// kind is refused.
func TestHeadersRoundTrip(t *testing.T) {
	s := sessionID{1, 2, 3}
	h := transfer.LayoutHandle{Worker: 0xE, Layout: 7}
	nonce := make([]byte, 32)
	for _, tc := range []struct {
		b    []byte
		want header
	}{
		{openHeader(9), header{kind: kindOpen, conn: 9}},
		{challengeHeader(9, 77, nonce), header{kind: kindChallenge, conn: 9, at: 77, nonce: nonce}},
		{helloHeader(9, 77), header{kind: kindHello, conn: 9, at: 77}},
		{welcomeHeader(9, true, s), header{kind: kindWelcome, conn: 9, ok: true, session: s}},
		{readHeader(s, 5, h), header{kind: kindRead, session: s, req: 5, handle: h}},
		{dataHeader(s, 5, 4096), header{kind: kindData, session: s, req: 5, offset: 4096}},
		{doneHeader(s, 5, 8192, remote.StatusWithdrawn), header{kind: kindDone, session: s, req: 5, total: 8192, status: remote.StatusWithdrawn}},
		{byeHeader(s), header{kind: kindBye, session: s}},
	} {
		got, err := parseHeader(tc.b)
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
		_, err = parseHeader(append(tc.b, 0))
		require.ErrorIs(t, err, remote.ErrBadEndpoint)
		_, err = parseHeader(tc.b[:len(tc.b)-1])
		require.ErrorIs(t, err, remote.ErrBadEndpoint)
	}
}

// A read's ops: none, an empty one, one whose end wraps, or a total that
// wraps are refused.
func TestParseOps(t *testing.T) {
	ops := []transfer.RemoteOp{{Remote: 0x1000, Size: 64}, {Remote: 0x9000, Size: 8}}
	got, total, err := parseOps(appendOps(nil, ops))
	require.NoError(t, err)
	require.Equal(t, ops, got)
	require.Equal(t, uint64(72), total)
	for _, bad := range [][]transfer.RemoteOp{
		nil,
		{{Remote: 0x1000, Size: 0}},
		{{Remote: ^uint64(0) - 4, Size: 8}},
		{{Remote: 0, Size: 1 << 63}, {Remote: 0, Size: 1 << 63}},
	} {
		_, _, err := parseOps(appendOps(nil, bad))
		require.ErrorIs(t, err, remote.ErrBadEndpoint, "%v", bad)
	}
	_, _, err = parseOps(make([]byte, 15))
	require.ErrorIs(t, err, remote.ErrBadEndpoint)
}

// What a peer sends is parsed without panicking: refused, or parsed into
// what encodes back to the same bytes.
func FuzzParseMessage(f *testing.F) {
	f.Add(readHeader(sessionID{1}, 5, transfer.LayoutHandle{Worker: 1, Layout: 2}), appendOps(nil, []transfer.RemoteOp{{Remote: 1, Size: 2}}))
	f.Add(doneHeader(sessionID{1}, 1, 2, 3), []byte("message"))
	f.Add(openHeader(1), []byte("address"))
	f.Fuzz(func(t *testing.T, hb, data []byte) {
		h, err := parseHeader(hb)
		if err != nil {
			require.ErrorIs(t, err, remote.ErrBadEndpoint)
		} else {
			require.Equal(t, headerLen[h.kind], len(hb))
		}
		if addr, hello, err := parseHelloData(data); err == nil {
			require.Equal(t, data, helloData(addr, hello))
		} else {
			require.ErrorIs(t, err, remote.ErrBadEndpoint)
		}
		ops, total, err := parseOps(data)
		if err != nil {
			require.ErrorIs(t, err, remote.ErrBadEndpoint)
			return
		}
		require.Equal(t, data, appendOps(nil, ops))
		sum := uint64(0)
		for _, o := range ops {
			require.NotZero(t, o.Size)
			sum += o.Size
		}
		require.Equal(t, total, sum)
	})
}
