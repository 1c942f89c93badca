package transfer

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/baseline"
	"github.com/stretchr/testify/require"
)

// Llama-3-8B blocks: 32 layers, K and V, 16 tokens, 8 KV heads × 128 dims,
// bf16 — 2 MiB per block in 64 fragments of 32 KiB.
func llamaConfig(blocks int) layout.Config {
	return layout.Config{NumBlocks: blocks, NumLayers: 32, OuterDim: 2, PageSize: 16, InnerDim: 8 * 128, DtypeWidth: 2}
}

const benchBlocks = 256

func benchIDs() []int { return seqIDs(benchBlocks) }

// reportRatio prints the transfer's throughput beside the limit measured in
// the same run: ratio = limit time / transfer time (1.0 = as fast as the
// limit).
func reportRatio(b *testing.B, bytes uint64, took, limit time.Duration, limitName string) {
	gbps := func(d time.Duration) float64 { return float64(bytes) * float64(b.N) / d.Seconds() / 1e9 }
	b.ReportMetric(gbps(took), "GB/s")
	b.ReportMetric(gbps(limit), limitName+"-GB/s")
	b.ReportMetric(limit.Seconds()/took.Seconds(), "x-"+limitName)
	b.ReportMetric(0, "ns/op") // the figures above are the ones that mean something
}

// BenchmarkDevice moves 256 Llama-3-8B blocks between pinned host memory
// (G2) and the emulated device (G1), beside a plain memcpy of the same
// bytes between two buffers in the same run.
func BenchmarkDevice(b *testing.B) {
	cfg := llamaConfig(benchBlocks)
	for _, tc := range []struct {
		name   string
		g1     Shape
		onload bool
	}{
		{"G2-G1/whole-blocks", FullyContiguous, true},
		{"G1-G2/whole-blocks", FullyContiguous, false},
		{"G2-G1/fragments-32KiB", Shape{Kind: layout.LayerSeparate, BlockDim: layout.BlockIsSecondDim}, true},
		{"G1-G2/fragments-32KiB", Shape{Kind: layout.LayerSeparate, BlockDim: layout.BlockIsSecondDim}, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			emu := cuda.NewEmulated(1)
			defer emu.Close()
			m, err := NewManager(Config{WorkerID: 1, Driver: emu})
			require.NoError(b, err)
			defer m.Close()
			g1, err := m.AllocateLayout(storage.Device, cfg, tc.g1)
			require.NoError(b, err)
			g2, err := m.AllocateLayout(storage.Pinned, cfg, FullyContiguous)
			require.NoError(b, err)
			touch(b, emu, m, g1)
			touch(b, emu, m, g2)
			src, dst := g2, g1
			if !tc.onload {
				src, dst = g1, g2
			}
			timeBesideMemcpy(b, m, src, dst, Options{}, uint64(benchBlocks*cfg.BlockSize()))
		})
	}
}

// timeBesideMemcpy times b.N transfers of every block from src to dst,
// each followed by a plain memcpy of bytes (what the transfer moves)
// between two warm buffers, and reports the ratio.
func timeBesideMemcpy(b *testing.B, m *Manager, src, dst LayoutHandle, opts Options, bytes uint64) {
	a, err := storage.AllocSystem(bytes)
	require.NoError(b, err)
	defer a.Close()
	c, err := storage.AllocSystem(bytes)
	require.NoError(b, err)
	defer c.Close()
	ab, _ := a.Bytes()
	cb, _ := c.Bytes()
	copy(ab, cb) // fault the pages in
	copy(cb, ab)
	ids := benchIDs()
	n, err := m.ExecuteTransfer(src, ids, dst, ids, opts) // warm up
	require.NoError(b, err)
	require.NoError(b, n.WaitTimeout(-1))
	var took, limit time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		n, err := m.ExecuteTransfer(src, ids, dst, ids, opts)
		require.NoError(b, err)
		require.NoError(b, n.WaitTimeout(-1))
		took += time.Since(start)
		start = time.Now()
		copy(cb, ab)
		limit += time.Since(start)
	}
	reportRatio(b, bytes, took, limit, "memcpy")
}

// BenchmarkDisk moves 256 Llama-3-8B blocks between pinned host memory
// (G2) and disk (G3), checksums included, beside a plain aligned O_DIRECT
// write and read of one file of the same size in the same directory, in
// the same run.
func BenchmarkDisk(b *testing.B) {
	cfg := llamaConfig(benchBlocks)
	dir := os.Getenv("KVBM_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	emu := cuda.NewEmulated(1)
	defer emu.Close()
	m, err := NewManager(Config{WorkerID: 1, Driver: emu, DiskDir: dir})
	require.NoError(b, err)
	defer m.Close()
	g2, err := m.AllocateLayout(storage.Pinned, cfg, FullyContiguous)
	require.NoError(b, err)
	g3, err := m.AllocateLayout(storage.Disk, cfg, FullyContiguous)
	require.NoError(b, err)
	touch(b, emu, m, g2)
	if !diskOf(b, m, g3).Direct() {
		b.Logf("O_DIRECT is unavailable in %s: both sides use buffered I/O", dir)
	}
	bytes := uint64(benchBlocks * cfg.BlockSize())
	buf, err := storage.AllocSystem(bytes)
	require.NoError(b, err)
	defer buf.Close()
	bb, _ := buf.Bytes()
	for i := range bb {
		bb[i] = byte(i)
	}
	plain, err := baseline.CreateDirectFile(filepath.Join(dir, "plain-odirect.bin"), bytes, cfg.BlockSize())
	require.NoError(b, err)
	defer func() { require.NoError(b, plain.Close()) }()
	ids := benchIDs()
	for _, write := range []bool{true, false} {
		name := "G2-G3/write"
		src, dst := g2, g3
		if !write {
			name, src, dst = "G3-G2/read", g3, g2
		}
		b.Run(name, func(b *testing.B) {
			var took, limit time.Duration
			for range b.N {
				start := time.Now()
				n, err := m.ExecuteTransfer(src, ids, dst, ids, Options{})
				require.NoError(b, err)
				require.NoError(b, n.WaitTimeout(-1))
				took += time.Since(start)
				el, err := plain.IO(bb, write, 1)
				require.NoError(b, err)
				limit += el
			}
			reportRatio(b, bytes, took, limit, "odirect")
		})
	}
}

// touch writes every byte of a layout's memory, so that no side of a
// benchmark reads the kernel's shared zero page.
func touch(b *testing.B, emu *cuda.Emulated, m *Manager, h LayoutHandle) {
	e, err := m.lookup(h)
	require.NoError(b, err)
	for _, r := range e.layout.Regions() {
		mem, err := emu.Bytes(r.Addr, r.Size)
		if err != nil {
			mem = storage.HostBytes(r.Addr, r.Size)
		}
		for i := range mem {
			mem[i] = byte(i)
		}
	}
}

// BenchmarkSmallTransfer is one 4 KiB block G2→G1 (pinned to the emulated
// device) per call, waited for before the next, as an engine's small
// transfers are: the cost of a call and its completion, beside a plain copy
// of the same 4 KiB in the same run.
// smallBlocks is a manager with a G1 and a G2 of 256 blocks of 4 KiB, every
// page touched: the small-transfer benchmarks' setup.
// With registered, G1 is device memory registered as an engine's KV cache
// is (RegisterExternal: its transfers pass its withdrawal gate).
func smallBlocks(b *testing.B, registered bool) (m *Manager, g1, g2 LayoutHandle, cfg layout.Config) {
	cfg = layout.Config{NumBlocks: 256, NumLayers: 1, OuterDim: 1, PageSize: 1, InnerDim: 2048, DtypeWidth: 2}
	emu := cuda.NewEmulated(1)
	b.Cleanup(func() { emu.Close() })
	m, err := NewManager(Config{WorkerID: 1, Driver: emu})
	require.NoError(b, err)
	b.Cleanup(func() { m.Close() })
	if registered {
		mem, err := storage.AllocDevice(emu, 0, uint64(cfg.BlockSize()*cfg.NumBlocks))
		require.NoError(b, err)
		b.Cleanup(func() { mem.Close() })
		g1, err = m.RegisterExternal(storage.Device, cfg, FullyContiguous, []uint64{mem.Addr()})
	} else {
		g1, err = m.AllocateLayout(storage.Device, cfg, FullyContiguous)
	}
	require.NoError(b, err)
	g2, err = m.AllocateLayout(storage.Pinned, cfg, FullyContiguous)
	require.NoError(b, err)
	touch(b, emu, m, g1)
	touch(b, emu, m, g2)
	return m, g1, g2, cfg
}

func BenchmarkSmallTransfer(b *testing.B) {
	m, g1, g2, cfg := smallBlocks(b, false)
	size := cfg.BlockSize()
	src, dst := make([]byte, 256*size), make([]byte, 256*size)
	copy(dst, src)
	ids := make([][]int, 256)
	for i := range ids {
		ids[i] = []int{i}
	}
	var took, limit time.Duration
	b.ResetTimer()
	for i := range b.N {
		j := i % 256
		start := time.Now()
		n, err := m.ExecuteTransfer(g2, ids[j], g1, ids[j], Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := n.WaitTimeout(time.Minute); err != nil {
			b.Fatal(err)
		}
		took += time.Since(start)
		start = time.Now()
		copy(dst[j*size:(j+1)*size], src[j*size:(j+1)*size])
		limit += time.Since(start)
	}
	b.ReportMetric(float64(took.Nanoseconds())/1e3/float64(b.N), "us/transfer")
	b.ReportMetric(float64(limit.Nanoseconds())/1e3/float64(b.N), "us/memcpy")
	b.ReportMetric(limit.Seconds()/took.Seconds(), "x-memcpy")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkManySmallTransfers issues 256 one-block G2→G1 transfers of 4 KiB
// before waiting for any (as an engine's step does), beside one transfer of
// the same 256 blocks in the same run: the per-call cost a batch pays.
// Sub-benchmarks: G1 allocated by the manager, and registered as an
// engine's is (its transfers also pass the layout's withdrawal gate).
func BenchmarkManySmallTransfers(b *testing.B) {
	b.Run("allocated-g1", func(b *testing.B) { manySmallTransfers(b, false) })
	b.Run("registered-g1", func(b *testing.B) { manySmallTransfers(b, true) })
}

func manySmallTransfers(b *testing.B, registered bool) {
	m, g1, g2, _ := smallBlocks(b, registered)
	var err error
	all := make([]int, 256)
	ids := make([][]int, 256)
	for i := range ids {
		all[i], ids[i] = i, []int{i}
	}
	ns := make([]*Notification, 256)
	var many, one time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		for j := range ids {
			if ns[j], err = m.ExecuteTransfer(g2, ids[j], g1, ids[j], Options{}); err != nil {
				b.Fatal(err)
			}
		}
		for _, n := range ns {
			if err := n.WaitTimeout(time.Minute); err != nil {
				b.Fatal(err)
			}
		}
		many += time.Since(start)
		start = time.Now()
		n, err := m.ExecuteTransfer(g2, all, g1, all, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := n.WaitTimeout(time.Minute); err != nil {
			b.Fatal(err)
		}
		one += time.Since(start)
	}
	b.ReportMetric(float64(many.Nanoseconds())/1e3/float64(b.N)/256, "us/call")
	b.ReportMetric(float64(one.Nanoseconds())/1e3/float64(b.N)/256, "us/block-in-one-call")
	b.ReportMetric(one.Seconds()/many.Seconds(), "x-one-call")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkHeadSlice pulls half the heads of 256 Llama-3-8B blocks (8 KV
// heads of 128 dims, bf16) into blocks of 4 heads, as a decode of twice the
// prefill's tensor-parallel size takes them: pinned host memory into the
// emulated device, heads outermost on both sides (one range a fragment)
// and tokens outermost (one range a token), beside a plain memcpy of the
// bytes moved, in the same run.
func BenchmarkHeadSlice(b *testing.B) {
	src := llamaConfig(benchBlocks)
	dst := src
	dst.InnerDim = 4 * 128
	for _, order := range []layout.HeadOrder{layout.HeadsOuter, layout.TokensOuter} {
		b.Run(order.String(), func(b *testing.B) {
			emu := cuda.NewEmulated(1)
			defer emu.Close()
			m, err := NewManager(Config{WorkerID: 1, Driver: emu})
			require.NoError(b, err)
			defer m.Close()
			g2, err := m.AllocateLayout(storage.Pinned, src, FullyContiguous)
			require.NoError(b, err)
			g1, err := m.AllocateLayout(storage.Device, dst, Shape{Kind: layout.LayerSeparate, BlockDim: layout.BlockIsFirstDim})
			require.NoError(b, err)
			touch(b, emu, m, g1)
			touch(b, emu, m, g2)
			s := layout.HeadSlice{Src: layout.Heads{Total: 8, Order: order}, Dst: layout.Heads{Total: 4, Order: order},
				SrcFirst: 4, Count: 4}
			timeBesideMemcpy(b, m, g2, g1, Options{Heads: &s}, uint64(benchBlocks*dst.BlockSize()))
		})
	}
}
