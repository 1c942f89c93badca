package transfer

import (
	"syscall"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/cuda"
	"github.com/stretchr/testify/require"
)

func TestCountersPerPath(t *testing.T) {
	f := newFixture(t)
	cfg := smallConfig(4)
	g2 := f.alloc(storage.Pinned, cfg, FullyContiguous)
	g1 := f.alloc(storage.Device, cfg, FullyContiguous)
	g3 := f.alloc(storage.Disk, cfg, FullyContiguous)
	before := f.m.Counters() // BlockIO in the fixture does not count
	require.NoError(t, f.transfer(g2, []int{0, 1}, g1, []int{0, 1}, Options{}))
	require.NoError(t, f.transfer(g1, []int{0}, g3, []int{3}, Options{}))
	diskOf(t, f.m, g3).SetFaultInjector(func(op string, off int64, n int) error {
		if op == "write" {
			return syscall.EIO
		}
		return nil
	})
	require.Error(t, f.transfer(g2, []int{2, 3}, g3, []int{0, 1}, Options{}))
	got := f.m.Counters()
	h2d := got[PathH2D]
	require.Equal(t, before[PathH2D].Transfers+1, h2d.Transfers)
	require.Equal(t, before[PathH2D].Blocks+2, h2d.Blocks)
	require.Equal(t, before[PathH2D].Bytes+uint64(2*cfg.BlockSize()), h2d.Bytes)
	require.Equal(t, before[PathTwoHop].Transfers+1, got[PathTwoHop].Transfers)
	dw := got[PathDiskWrite]
	require.Equal(t, before[PathDiskWrite].Transfers+1, dw.Transfers)
	require.Equal(t, before[PathDiskWrite].FailedBlocks+2, dw.FailedBlocks)
	require.Greater(t, dw.Nanoseconds, before[PathDiskWrite].Nanoseconds)
	require.Equal(t, "disk-write", PathDiskWrite.String())
}

func TestOutOfRangeAndAlreadyExistsSentinels(t *testing.T) {
	f := newFixture(t)
	cfg := smallConfig(4)
	a := f.alloc(storage.Pinned, cfg, FullyContiguous)
	b := f.alloc(storage.Device, cfg, FullyContiguous)
	_, err := f.m.ExecuteTransfer(a, []int{9}, b, []int{0}, Options{})
	require.ErrorIs(t, err, ErrOutOfRange)
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = f.m.ExecuteTransfer(a, []int{0}, b, []int{0}, Options{Layers: Layers(0, 9)})
	require.ErrorIs(t, err, ErrOutOfRange)
	_, err = f.m.ExecuteTransfer(a, []int{0, 1}, b, []int{0}, Options{})
	require.NotErrorIs(t, err, ErrOutOfRange)
}

// Work outside ExecuteTransfer (object I/O) is waited for by Close and
// refused after it.
func TestManagerGoAndBlockIOAfterClose(t *testing.T) {
	emu := cuda.NewEmulated(1)
	defer emu.Close()
	m, err := NewManager(Config{WorkerID: 5, Driver: emu})
	require.NoError(t, err)
	h, err := m.AllocateLayout(storage.Pinned, smallConfig(2), FullyContiguous)
	require.NoError(t, err)
	bio, err := m.BlockIO(h)
	require.NoError(t, err)
	release := make(chan struct{})
	finished := false
	n, err := m.Go(func() error { <-release; finished = true; return nil })
	require.NoError(t, err)
	closed := make(chan error)
	go func() { closed <- m.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned while work was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-closed)
	require.True(t, finished, "Close waited for the work in flight")
	require.NoError(t, n.WaitTimeout(-1))
	_, err = m.Go(func() error { return nil })
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, bio.ReadBlock(0, make([]byte, bio.BlockSize())), ErrClosed)
}
