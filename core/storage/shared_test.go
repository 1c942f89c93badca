package storage

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kvbm/kvbm/cuda"
)

// Shared memory is pinned (or not) as asked, zeroed, and what one mapping
// writes the other reads: a peer's mapping sees the same pages.
func TestSharedMemoryIsTheSamePagesInEveryMapping(t *testing.T) {
	drv := cuda.NewEmulated(1)
	defer drv.Close()
	for _, pinned := range []bool{true, false} {
		m, err := AllocShared(drv, 0, 3<<20, pinned)
		require.NoError(t, err)
		require.Equal(t, map[bool]Kind{true: Pinned, false: System}[pinned], m.Kind())
		require.NotNil(t, m.File())
		b, err := m.Bytes()
		require.NoError(t, err)
		require.Equal(t, make([]byte, 3<<20), b, "zeroed")

		peer, err := MapShared(m.File(), m.Size())
		require.NoError(t, err)
		b[0], b[len(b)-1] = 0xA1, 0xA2
		require.Equal(t, byte(0xA1), peer.Bytes()[0])
		peer.Bytes()[4096] = 0xB3
		require.Equal(t, byte(0xB3), b[4096])

		f := m.File()
		require.NoError(t, m.Close())
		require.Equal(t, byte(0xA2), peer.Bytes()[len(b)-1], "the mapping outlives the owner's release")
		require.NoError(t, peer.Close())
		require.NoError(t, peer.Close(), "Close is idempotent")
		require.Error(t, unix.Fstat(int(f.Fd()), &unix.Stat_t{}), "the owner's file is closed")
	}
	_, err := AllocShared(drv, 0, 0, true)
	require.Error(t, err)
}

// A file without the seals (one that could shrink under the mapping and
// SIGBUS the reader), or of another size than the peer said, is refused.
func TestMapSharedRefusesUnsealedOrMisSizedFiles(t *testing.T) {
	fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fd), "unsealed")
	defer f.Close()
	require.NoError(t, unix.Ftruncate(fd, 4096))
	_, err = MapShared(f, 4096)
	require.ErrorContains(t, err, "seals")

	plain, err := os.CreateTemp(t.TempDir(), "plain")
	require.NoError(t, err)
	defer plain.Close()
	_, err = MapShared(plain, 4096)
	require.Error(t, err)

	drv := cuda.NewEmulated(1)
	defer drv.Close()
	m, err := AllocShared(drv, 0, 8192, false)
	require.NoError(t, err)
	defer m.Close()
	_, err = MapShared(m.File(), 4096)
	require.ErrorContains(t, err, "8192 bytes, the peer said 4096")
	require.Error(t, unix.Ftruncate(int(m.File().Fd()), 4096), "sealed against shrinking")
}

// A driver that will not pin shared pages makes AllocShared fail with
// ErrNotShareable (its caller then allocates private pinned memory), and
// leaves nothing mapped or open behind.
func TestSharedMemoryThatCannotBePinnedIsNotShareable(t *testing.T) {
	drv := cuda.NewEmulated(1)
	defer drv.Close()
	m, err := AllocShared(drv, 0, 4096, true)
	require.NoError(t, err)
	defer m.Close()
	// The same range pinned twice is refused, as a driver refusing shared pages would.
	require.Error(t, drv.HostRegister(m.Addr(), 4096))
	_, err = AllocShared(refusingDriver{drv}, 0, 4096, true)
	require.ErrorIs(t, err, ErrNotShareable)
}

type refusingDriver struct{ *cuda.Emulated }

func (refusingDriver) HostRegister(ptr, size uint64) error {
	return cuda.NewError("cuMemHostRegister", cuda.ErrCodeNotSupported, "refused for the test")
}
