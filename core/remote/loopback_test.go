package remote

import (
	"context"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	. "github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/stretchr/testify/require"
)

// An importer's transfers hold the exporter open: the exporter's Close
// waits for them, and after it transfers on its layouts are refused, so
// that no transfer reads freed memory.
func TestImportedLayoutsHoldTheExporter(t *testing.T) {
	emu := cuda.NewEmulated(1)
	defer emu.Close()
	loop := NewLoopback()
	exporter, err := NewManager(Config{WorkerID: 0xE, Driver: emu})
	require.NoError(t, err)
	importer, err := NewManager(Config{WorkerID: 0x1, Driver: emu})
	require.NoError(t, err)
	defer importer.Close()
	require.NoError(t, loop.Add(exporter))
	cfg := smallConfig(4)
	remote, err := exporter.AllocateLayout(storage.Pinned, cfg, FullyContiguous)
	require.NoError(t, err)
	local, err := importer.AllocateLayout(storage.Device, cfg, FullyContiguous)
	require.NoError(t, err)
	d, err := exporter.Describe(remote)
	require.NoError(t, err)
	_, err = importer.Import(loop, []Descriptor{d})
	require.NoError(t, err)

	// Hold the importer's H2D copies in the device until released.
	release := make(chan struct{})
	emu.InjectCopyFault(func(kind cuda.CopyKind, c cuda.Copy) error {
		if kind == cuda.HostToDevice {
			<-release
		}
		return nil
	})
	defer emu.InjectCopyFault(nil)
	n, err := importer.ExecuteTransfer(remote, []int{0, 1}, local, []int{2, 3}, Options{})
	require.NoError(t, err)
	closed := make(chan error)
	go func() { closed <- exporter.Close() }()
	select {
	case <-closed:
		t.Fatal("the exporter closed while an importer was reading its memory")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	require.NoError(t, n.WaitTimeout(-1))
	require.NoError(t, <-closed)

	_, err = importer.ExecuteTransfer(remote, []int{0}, local, []int{0}, Options{})
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorContains(t, err, "the worker that exported it (e) is closed")
}

func smallConfig(blocks int) layout.Config {
	return layout.Config{NumBlocks: blocks, NumLayers: 4, OuterDim: 2, PageSize: 4, InnerDim: 64, DtypeWidth: 2}
}

func TestLoopbackRefusesASecondWorkerWithTheSameIDAndOtherProcesses(t *testing.T) {
	emu := cuda.NewEmulated(1)
	defer emu.Close()
	m1, err := NewManager(Config{WorkerID: 0xA1, Driver: emu})
	require.NoError(t, err)
	defer m1.Close()
	m2, err := NewManager(Config{WorkerID: 0xA1, Driver: emu})
	require.NoError(t, err)
	defer m2.Close()
	loop := NewLoopback()
	require.NoError(t, loop.Serve(m1))
	ep, err := loop.Endpoint()
	require.NoError(t, err)
	require.True(t, loop.Local(ep))
	err = loop.Serve(m2)
	require.ErrorIs(t, err, ErrAlreadyExists)

	other := append([]byte(nil), ep...)
	other[0] ^= 0xFF // another process's token
	_, err = loop.Connect(context.Background(), other)
	require.ErrorIs(t, err, ErrBadEndpoint)
	require.ErrorContains(t, err, "belongs to another process")
	_, err = loop.Connect(context.Background(), ep[:5])
	require.ErrorIs(t, err, ErrBadEndpoint)
}
