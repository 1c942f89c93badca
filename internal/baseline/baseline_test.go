package baseline

import (
	"bytes"
	"net"
	"path/filepath"
	"testing"

	"github.com/kvbm/kvbm/internal/hugepage"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCopyMovesTheBytes(t *testing.T) {
	c, err := NewCopy(1 << 20)
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	clear(c.dstB)
	c.Run(3<<20+5, 3) // more than the buffers, uneven shares
	require.True(t, bytes.Equal(c.srcB, c.dstB))
	require.Greater(t, c.LimitGBs(1<<20), 0.0)
	_, err = NewCopy(0)
	require.ErrorContains(t, err, "chunk of 0 bytes")
}

func TestDirectFileRoundTrip(t *testing.T) {
	const req = 64 << 10
	const size = 4 * req
	_, err := CreateDirectFile(filepath.Join(t.TempDir(), "bad"), size, 1000)
	require.ErrorContains(t, err, "request of 1000 bytes")
	f, err := CreateDirectFile(filepath.Join(t.TempDir(), "plain"), size, req)
	require.NoError(t, err)
	b, err := hugepage.Map(2*size, -1)
	require.NoError(t, err)
	defer func() { require.NoError(t, hugepage.Unmap(b)) }()
	w, r := b[:size], b[size:]
	for i := range w {
		w[i] = byte(i * 13)
	}
	_, err = f.IO(w, true, 3)
	require.NoError(t, err)
	_, err = f.IO(r, false, 2)
	require.NoError(t, err)
	require.True(t, bytes.Equal(w, r))
	_, err = f.IO(r[:100], false, 1)
	require.ErrorContains(t, err, "100 bytes is not a multiple of the request size 65536")
	require.NoError(t, f.Close())
}

func TestFilesRoundTrip(t *testing.T) {
	f, err := NewFiles(filepath.Join(t.TempDir(), "files"), 5)
	require.NoError(t, err)
	w, r := make([][]byte, 5), make([][]byte, 5)
	for i := range w {
		w[i], r[i] = bytes.Repeat([]byte{byte(i + 1)}, 4096), make([]byte, 4096)
	}
	_, err = f.IO(w, true, 2)
	require.NoError(t, err)
	_, err = f.IO(r, false, 4)
	require.NoError(t, err)
	require.Equal(t, w, r)
	_, err = f.IO(make([][]byte, 6), false, 1)
	require.ErrorContains(t, err, "6 blocks for 5 files")
	require.NoError(t, f.Close())
}

func TestStreamMovesTheBytes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	mem := make([]byte, 1<<20)
	for i := range mem {
		mem[i] = byte(i * 7)
	}
	done := make(chan struct{})
	go func() { ServeStream(ln, mem); close(done) }()
	s, err := DialStream(ln.Addr().String())
	require.NoError(t, err)
	got := make([]byte, len(mem))
	_, err = s.Pull(got)
	require.NoError(t, err)
	require.Equal(t, mem, got)
	push := make([]byte, 1000)
	for i := range push {
		push[i] = 0xA5
	}
	_, err = s.Push(push)
	require.NoError(t, err)
	require.Equal(t, push, mem[:1000])
	require.NoError(t, s.Close())
	require.NoError(t, ln.Close())
	<-done
}
