package transfer

import (
	"sync"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/storage"
	"github.com/stretchr/testify/require"
)

// 256 concurrent device reads of peers: every one is served, through at
// most StagingBuffers pinned buffers (the others wait for one), and once
// the burst is over the buffers beyond the idle few are freed.
func TestServeDeviceStagingIsBounded(t *testing.T) {
	defer func(d time.Duration) { stageLinger = d }(stageLinger)
	stageLinger = 50 * time.Millisecond
	drv, _ := testDriver(t)
	m, err := NewManager(Config{WorkerID: 0xA1, Driver: drv, StagingBuffers: 8, RemoteDeadline: 20 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })
	h, err := m.AllocateLayout(storage.Device, smallConfig(4), FullyContiguous)
	require.NoError(t, err)
	d, err := m.Describe(h)
	require.NoError(t, err)
	ops := []RemoteOp{{Remote: d.Bases[0], Size: 4096}}

	const readers = 256
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- m.Serve(h, ops, false, func([][]byte) error {
				time.Sleep(time.Millisecond) // a socket write
				return nil
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	s := m.Staging()
	t.Logf("staging after %d concurrent device reads: %+v", readers, s)
	require.Equal(t, 8, s.Cap)
	require.LessOrEqual(t, s.Peak, 8, "pinned staging stays within its cap")
	require.LessOrEqual(t, s.Allocated, uint64(8), "buffers are reused, not allocated per request")
	require.NotZero(t, s.Waits, "requests beyond the cap waited for a buffer")
	require.Zero(t, s.TimedOut)
	require.Eventually(t, func() bool { return m.Staging().Live == stageIdle }, 5*time.Second, 10*time.Millisecond,
		"the buffers beyond the idle few are freed once unused")
}

// A device request that finds every staging buffer in use waits at most
// the remote deadline, then is refused before any byte moves.
func TestServeDeviceStagingWaitEndsAtTheDeadline(t *testing.T) {
	drv, _ := testDriver(t)
	m, err := NewManager(Config{WorkerID: 0xA1, Driver: drv, StagingBuffers: 1, RemoteDeadline: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })
	h, err := m.AllocateLayout(storage.Device, smallConfig(4), FullyContiguous)
	require.NoError(t, err)
	d, err := m.Describe(h)
	require.NoError(t, err)
	ops := []RemoteOp{{Remote: d.Bases[0], Size: 4096}}

	holding, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- m.Serve(h, ops, false, func([][]byte) error {
			close(holding)
			<-release
			return nil
		})
	}()
	<-holding
	start := time.Now()
	called := false
	err = m.Serve(h, ops, false, func([][]byte) error { called = true; return nil })
	require.ErrorIs(t, err, ErrTimeout)
	require.False(t, called)
	require.Less(t, time.Since(start), 2*time.Second)
	close(release)
	require.NoError(t, <-done)
	require.NoError(t, m.Serve(h, ops, false, func([][]byte) error { return nil }), "served once a buffer is free")
	require.Equal(t, uint64(1), m.Staging().TimedOut)
}
