package worker

import (
	"fmt"
	"testing"

	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/stretchr/testify/require"
)

func TestStandaloneOwnsItsManager(t *testing.T) {
	drv := newDriver(t)
	loop := remote.NewLoopback()
	dir := t.TempDir()
	a, err := NewStandalone(StandaloneConfig{WorkerID: 1, Driver: drv, DiskDir: dir, ObjectDir: dir + "/g4", Rank: 3, Loopback: loop})
	require.NoError(t, err)
	_, err = NewStandalone(StandaloneConfig{WorkerID: 1, Driver: drv, Loopback: loop})
	require.ErrorIs(t, err, transfer.ErrAlreadyExists)
	_, err = a.AllocateG3(testConfig(4), transfer.FullyContiguous)
	require.NoError(t, err)
	require.NoError(t, a.Close())
	// Closed: its id is free again, and its manager refuses work.
	b, err := NewStandalone(StandaloneConfig{WorkerID: 1, Driver: drv, Loopback: loop})
	require.NoError(t, err)
	require.NoError(t, b.Close())
	_, err = a.AllocateG2(testConfig(4), transfer.FullyContiguous)
	require.ErrorIs(t, err, transfer.ErrClosed)

	_, err = NewStandalone(StandaloneConfig{WorkerID: 2})
	require.ErrorIs(t, err, transfer.ErrInvalidArgument)
	m, err := transfer.NewManager(transfer.Config{WorkerID: 3, Driver: drv})
	require.NoError(t, err)
	w, err := NewPhysical(PhysicalConfig{Manager: m})
	require.NoError(t, err)
	require.NoError(t, w.Close(), "a worker over a caller's manager leaves it open")
	_, err = w.AllocateG2(testConfig(4), transfer.FullyContiguous)
	require.NoError(t, err)
	require.NoError(t, m.Close())
}

// Issue 9, defect 6: a device that does not exist is refused at create,
// naming the id and the number of devices, not later at registration.
func TestStandaloneRefusesDevicesThatDoNotExist(t *testing.T) {
	drv := cuda.NewEmulated(1)
	t.Cleanup(func() { require.NoError(t, drv.Close()) })
	for _, dev := range []int{7, -1, 1_000_000, 1} {
		_, err := NewStandalone(StandaloneConfig{WorkerID: 9, Device: dev, Driver: drv})
		require.ErrorIs(t, err, transfer.ErrInvalidArgument, "device %d", dev)
		require.ErrorContains(t, err, fmt.Sprintf("device %d", dev))
		require.ErrorContains(t, err, "1 device")
	}
	w, err := NewStandalone(StandaloneConfig{WorkerID: 9, Device: 0, Driver: drv})
	require.NoError(t, err)
	require.NoError(t, w.Close())
}
