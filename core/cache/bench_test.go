package cache

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/core/worker"
	"github.com/kvbm/kvbm/cuda"
)

// BenchmarkCache offloads and onboards 256 Llama-3-8B blocks (2 MiB each)
// through the cache, beside the same transfers issued directly on the
// worker in the same run: x-direct = direct time / cache time (1.0: the
// cache costs nothing). Offloads use new keys every time, so every block is
// copied and G2's least recently used blocks are evicted.
func BenchmarkCache(b *testing.B) {
	const blocks = 256
	cfg := layout.Config{NumBlocks: blocks, NumLayers: 32, OuterDim: 2, PageSize: 16, InnerDim: 8 * 128, DtypeWidth: 2}
	emu := cuda.NewEmulated(1)
	defer emu.Close()
	m, err := transfer.NewManager(transfer.Config{WorkerID: 1, Driver: emu})
	require.NoError(b, err)
	defer m.Close()
	w, err := worker.NewPhysical(worker.PhysicalConfig{Manager: m})
	require.NoError(b, err)
	mem, err := storage.AllocDevice(emu, 0, uint64(blocks*cfg.BlockSize()))
	require.NoError(b, err)
	defer mem.Close()
	_, err = w.RegisterG1(cfg, transfer.FullyContiguous, []uint64{mem.Addr()})
	require.NoError(b, err)
	_, err = w.AllocateG2(cfg, transfer.FullyContiguous)
	require.NoError(b, err)
	c, err := New(Config{Worker: w})
	require.NoError(b, err)
	defer c.Close()
	ids := seq(0, blocks)
	bytes := float64(blocks * cfg.BlockSize())
	gen := 0
	keys := func() [][]byte {
		ks := make([][]byte, blocks)
		for i := range ks {
			ks[i] = []byte(fmt.Sprintf("gen-%d-block-%d", gen, i))
		}
		gen++
		return ks
	}
	wait := func(n *transfer.Notification, err error) {
		require.NoError(b, err)
		require.NoError(b, n.Wait(b.Context()))
	}
	// Fault both layouts in and fill G2 once, so both sides start warm.
	wait(w.ExecuteLocalTransfer(worker.G1, worker.G2, ids, ids, transfer.Options{}))
	wait(w.ExecuteLocalTransfer(worker.G2, worker.G1, ids, ids, transfer.Options{}))
	report := func(b *testing.B, took, direct time.Duration) {
		gbps := func(d time.Duration) float64 { return bytes * float64(b.N) / d.Seconds() / 1e9 }
		b.ReportMetric(gbps(took), "GB/s")
		b.ReportMetric(gbps(direct), "direct-GB/s")
		b.ReportMetric(direct.Seconds()/took.Seconds(), "x-direct")
		b.ReportMetric(0, "ns/op")
	}
	b.Run("offload-G1-G2", func(b *testing.B) {
		batches := make([][][]byte, b.N)
		for i := range batches {
			batches[i] = keys()
		}
		b.ResetTimer()
		start := time.Now()
		for i := range b.N {
			n, _, err := c.Offload(batches[i], ids, 0)
			wait(n, err)
		}
		took := time.Since(start)
		start = time.Now()
		for range b.N {
			wait(w.ExecuteLocalTransfer(worker.G1, worker.G2, ids, ids, transfer.Options{}))
		}
		report(b, took, time.Since(start))
	})
	b.Run("onboard-G2-G1", func(b *testing.B) {
		ks := keys()
		n, _, err := c.Offload(ks, ids, 0)
		wait(n, err)
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			wait(c.Onboard(ks, ids, nil, nil))
		}
		took := time.Since(start)
		start = time.Now()
		for range b.N {
			wait(w.ExecuteLocalTransfer(worker.G2, worker.G1, ids, ids, transfer.Options{}))
		}
		report(b, took, time.Since(start))
	})
}
