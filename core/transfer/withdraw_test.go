package transfer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/kvbmerr"
)

// registerEngine registers device memory the test owns (as an engine's KV
// cache is) and returns its handle and memory.
func registerEngine(t *testing.T, f *fixture, blocks int) (LayoutHandle, *storage.Memory) {
	t.Helper()
	cfg := smallConfig(blocks)
	mem, err := storage.AllocDevice(f.drv, 0, uint64(cfg.BlockSize()*blocks))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, mem.Close()) })
	h, err := f.m.RegisterExternal(storage.Device, cfg, FullyContiguous, []uint64{mem.Addr()})
	require.NoError(t, err)
	return h, mem
}

// Withdraw waits for the transfer in flight on the layout and then refuses
// every new one, naming its reason; the other layouts go on.
func TestWithdrawWaitsForTransfersInFlightThenRefuses(t *testing.T) {
	f := newFixture(t)
	g1, _ := registerEngine(t, f, 4)
	cfg := smallConfig(4)
	g2 := f.alloc(storage.Pinned, cfg, FullyContiguous)
	f.fill(g1, 1)
	g := newGate(t, f, nil) // the engine's compute, still running
	n, err := f.m.ExecuteTransfer(g1, []int{0, 1}, g2, []int{2, 3}, Options{Precondition: g.event})
	require.NoError(t, err)

	withdrawn := make(chan error, 1)
	go func() { withdrawn <- f.m.Withdraw(g1, "sleep mode") }()
	// New transfers are refused at once, while the one in flight runs on.
	require.Eventually(t, func() bool {
		_, err := f.m.Describe(g1)
		return err != nil
	}, 5*time.Second, time.Millisecond)
	_, err = f.m.ExecuteTransfer(g2, []int{0}, g1, []int{0}, Options{})
	require.ErrorIs(t, err, ErrWithdrawn)
	select {
	case err := <-withdrawn:
		t.Fatalf("Withdraw returned (%v) with a transfer on the layout in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	done, err := n.Poll()
	require.NoError(t, err)
	require.False(t, done)

	g.release()
	require.NoError(t, n.WaitTimeout(-1))
	require.NoError(t, <-withdrawn)
	require.Equal(t, pattern(cfg.BlockSize(), 1), f.readBlock(g2, 2), "the transfer in flight completed whole")
	require.Equal(t, pattern(cfg.BlockSize(), 2), f.readBlock(g2, 3))

	for name, err := range map[string]error{
		"transfer": func() error { _, err := f.m.ExecuteTransfer(g1, []int{0}, g2, []int{0}, Options{}); return err }(),
		"serve":    f.m.Serve(g1, nil, false, func([][]byte) error { return nil }),
		"lend":     f.m.Lend(g1, nil, func() error { return nil }),
		"describe": func() error { _, err := f.m.Describe(g1); return err }(),
		"again":    f.m.Withdraw(g1, "twice"),
	} {
		require.ErrorIs(t, err, ErrWithdrawn, name)
		require.ErrorContains(t, err, "was unregistered by its owner: sleep mode", name)
		require.Equal(t, kvbmerr.FailedPrecondition, kvbmerr.KindOf(err), name)
	}
	// The pinned layout is untouched, and the withdrawn id is not given again.
	f.writeBlock(g2, 0, pattern(cfg.BlockSize(), 9))
	h2, _ := registerEngine(t, f, 4)
	require.NotEqual(t, g1, h2)
	require.NoError(t, f.transfer(g2, []int{0}, h2, []int{1}, Options{}))
	require.Equal(t, pattern(cfg.BlockSize(), 9), f.readBlock(h2, 1))
}

// Only memory its owner registered is withdrawn; the manager's own is
// unregistered.
func TestWithdrawRefusesTheManagersOwnMemory(t *testing.T) {
	f := newFixture(t)
	g2 := f.alloc(storage.Pinned, smallConfig(2), FullyContiguous)
	err := f.m.Withdraw(g2, "x")
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorContains(t, err, "not memory registered by its owner")
	err = f.m.Withdraw(LayoutHandle{Worker: 0xA1, Layout: 999}, "x")
	require.ErrorIs(t, err, ErrNotFound)
}

// A serve that looked the layout up just before Withdraw took it out is
// refused at its hold, not run on memory that is going.
func TestWithdrawRefusesAHoldAfterTheLookup(t *testing.T) {
	f := newFixture(t)
	g1, _ := registerEngine(t, f, 2)
	e, err := f.m.servable(g1, nil)
	require.NoError(t, err)
	require.NoError(t, f.m.Withdraw(g1, "weight update"))
	_, err = f.m.hold(e)
	require.ErrorIs(t, err, ErrWithdrawn)
	require.ErrorContains(t, err, "weight update")
}

// A worker of this process that imported the layout cannot withdraw it
// (its import shares the exporter's gate); the exporter's withdrawal
// refuses the importer's transfers on it, naming the exporter's reason.
func TestWithdrawIsTheExportersOnly(t *testing.T) {
	f := newFixture(t)
	g1, _ := registerEngine(t, f, 2)
	imp, err := NewManager(Config{WorkerID: 0xB2, Driver: f.drv, HostWorkers: 2})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, imp.Close()) })
	d, err := f.m.Describe(g1)
	require.NoError(t, err)
	hs, err := imp.Import(exporterOf{f.m}, []Descriptor{d})
	require.NoError(t, err)
	g2, err := imp.AllocateLayout(storage.Pinned, smallConfig(2), FullyContiguous)
	require.NoError(t, err)
	require.ErrorIs(t, imp.Withdraw(hs[0], "not mine"), ErrInvalidArgument)
	n, err := imp.ExecuteTransfer(hs[0], []int{0}, g2, []int{0}, Options{})
	require.NoError(t, err)
	require.NoError(t, n.WaitTimeout(-1), "the import still reads: nothing was withdrawn")

	require.NoError(t, f.m.Withdraw(g1, "sleep mode"))
	_, err = imp.ExecuteTransfer(hs[0], []int{0}, g2, []int{1}, Options{})
	require.ErrorIs(t, err, ErrWithdrawn)
	require.ErrorContains(t, err, "sleep mode")
}

// exporterOf attaches layouts of a manager of this process directly.
type exporterOf struct{ m *Manager }

func (x exporterOf) Attach(Descriptor) (Attachment, error) { return Attachment{Exporter: x.m}, nil }

// An engine that sleeps and wakes more often than there are layout ids
// (65,535) still registers G1: once no id is free, the one withdrawn
// longest ago is given again; the latest withdrawn handles still say why.
func TestWithdrawnIDsAreGivenAgainOnceNoneIsFree(t *testing.T) {
	f := newFixture(t)
	cfg := smallConfig(2)
	mem, err := storage.AllocDevice(f.drv, 0, uint64(cfg.BlockSize()*2))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, mem.Close()) })
	var last LayoutHandle
	seen := map[LayoutHandle]bool{}
	for i := range 1<<16 + 10 {
		h, err := f.m.RegisterExternal(storage.Device, cfg, FullyContiguous, []uint64{mem.Addr()})
		require.NoError(t, err, "registration %d", i)
		if i == 1<<16+9 {
			require.True(t, seen[h], "an id is given again only once none is free")
		}
		seen[h] = true
		require.NoError(t, f.m.Withdraw(h, "sleep"))
		last = h
	}
	_, err = f.m.Describe(last)
	require.ErrorIs(t, err, ErrWithdrawn)
	require.ErrorContains(t, err, "sleep")
}
