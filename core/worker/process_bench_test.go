package worker

import (
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/remote"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/baseline"
	"github.com/stretchr/testify/require"
)

// The cross-process benchmarks: this process pulls from and pushes to a
// helper process over the network transport, beside two limits measured
// in the same run on the same bytes: a plain Go TCP stream between the
// same two processes, and an in-process copy.

const benchEnv = "KVBM_TEST_EXPORTER_BENCH"

// benchConfig is a 2 MiB block of 64 fragments of 32 KiB (32 layers × K,V).
func benchConfig(blocks int) layout.Config {
	return layout.Config{NumBlocks: blocks, NumLayers: 32, OuterDim: 2, PageSize: 16, InnerDim: 1024, DtypeWidth: 2}
}

const benchBlocks = 256

// serveBench is the helper's side: a G2 of benchBlocks whole blocks and a
// layer-separate G1 (whose blocks are 64 separate fragments), and a plain
// TCP server that streams or swallows the bytes asked for.
func serveBench(t *testing.T, w *PhysicalWorker, drv cuda.Driver) {
	_, err := w.AllocateG2(benchConfig(benchBlocks), transfer.FullyContiguous)
	require.NoError(t, err)
	sizes, err := layout.RegionSizes(benchConfig(benchBlocks), layout.LayerSeparate, layout.BlockIsFirstDim)
	require.NoError(t, err)
	var ptrs []uint64
	for _, s := range sizes {
		mem, err := storage.AllocDevice(drv, 0, s)
		require.NoError(t, err)
		defer mem.Close()
		ptrs = append(ptrs, mem.Addr())
	}
	_, err = w.RegisterG1(benchConfig(benchBlocks), transfer.Shape{Kind: layout.LayerSeparate, BlockDim: layout.BlockIsFirstDim}, ptrs)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	mem := make([]byte, benchBlocks*benchConfig(1).BlockSize())
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1 // fault it in, as pinned memory is
	}
	go baseline.ServeStream(ln, mem)
	md, err := w.ExportMetadata()
	require.NoError(t, err)
	fmt.Printf("raw %s\nmetadata %x\n", ln.Addr(), md)
	io.Copy(io.Discard, os.Stdin) // until the parent closes stdin or exits
}

// BenchmarkCrossProcess pulls and pushes 256 × 2 MiB whole blocks and 2,048
// × 32 KiB fragments between this process and a helper process, and prints
// each figure beside a plain TCP stream and an in-process copy of the same
// bytes measured in the same run.
func BenchmarkCrossProcess(b *testing.B) {
	exp, raw := startBenchExporter(b, []string{benchEnv + "=1"})
	drv := cuda.NewEmulated(1)
	defer drv.Close()
	network, err := remote.Open(os.Getenv("KVBM_TRANSPORT"), remote.OpenOptions{})
	require.NoError(b, err)
	dec, err := NewStandalone(StandaloneConfig{WorkerID: 0xDEC, Driver: drv, Network: network})
	require.NoError(b, err)
	defer dec.Close()
	_, err = dec.AllocateG2(benchConfig(benchBlocks), transfer.FullyContiguous)
	require.NoError(b, err)
	require.NoError(b, dec.ConnectRemote(1, [][]byte{exp.metadata}))
	stream, err := baseline.DialStream(raw)
	require.NoError(b, err)
	defer stream.Close()

	ids := make([]int, benchBlocks)
	for i := range ids {
		ids[i] = i
	}
	src := make([]byte, benchBlocks*benchConfig(1).BlockSize())
	dst := make([]byte, len(src))
	for i := range src {
		src[i] = byte(i*7 + i>>12) // written, so every page is its own (unwritten pages all read the one zero page, cache-hot)
	}
	copy(dst, src) // fault dst in
	cases := []struct {
		name   string
		tier   Tier // the remote tier: G2 whole blocks, G1 fragments
		blocks int
		push   bool
	}{
		{"pull/256x2MiB", G2, 256, false},
		{"push/256x2MiB", G2, 256, true},
		{"pull/2048x32KiB", G1, 32, false},
		{"push/2048x32KiB", G1, 32, true},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			bytes := c.blocks * benchConfig(1).BlockSize()
			h, ok := remoteHandle(dec, 1, c.tier)
			require.True(b, ok)
			var ours, plain, memcpy time.Duration
			for range b.N {
				start := time.Now()
				var n *transfer.Notification
				if c.push {
					n, err = dec.ExecuteRemoteOffload(G2, ids[:c.blocks], RemoteLayout(h, ids[:c.blocks]), transfer.Options{})
				} else {
					n, err = dec.ExecuteRemoteOnboard(RemoteLayout(h, ids[:c.blocks]), G2, ids[:c.blocks], transfer.Options{})
				}
				require.NoError(b, err)
				require.NoError(b, n.WaitTimeout(-1))
				ours += time.Since(start)
				var took time.Duration
				if c.push {
					took, err = stream.Push(dst[:bytes])
				} else {
					took, err = stream.Pull(dst[:bytes])
				}
				require.NoError(b, err)
				plain += took
				start = time.Now()
				copy(dst[:bytes], src[:bytes])
				memcpy += time.Since(start)
			}
			gbs := func(d time.Duration) float64 { return float64(bytes) * float64(b.N) / d.Seconds() / 1e9 }
			b.ReportMetric(gbs(ours), "GB/s")
			b.ReportMetric(gbs(plain), "stream-GB/s")
			b.ReportMetric(gbs(memcpy), "memcpy-GB/s")
			b.ReportMetric(plain.Seconds()/ours.Seconds(), "x-stream")
			b.ReportMetric(memcpy.Seconds()/ours.Seconds(), "x-memcpy")
		})
	}
}

func remoteHandle(w *PhysicalWorker, instance InstanceID, t Tier) (transfer.LayoutHandle, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	h, ok := w.remote[remoteTier{instance, t}]
	return h, ok
}

// startBenchExporter starts the helper in benchmark mode and returns it
// with the address of its plain TCP server.
func startBenchExporter(b *testing.B, env []string) (*exporter, string) {
	exp := startExporter(b, 0xB, env...)
	var raw string
	for _, l := range exp.lines {
		if a, ok := strings.CutPrefix(l, "raw "); ok {
			raw = a
		}
	}
	require.NotEmpty(b, raw, "the helper printed its plain TCP server's address")
	return exp, raw
}

// BenchmarkPeerFailureDetection measures how long a pull waits on a dead
// or frozen peer before its blocks fail: after kill -9 (the sockets
// reset; the figure is the time from the kill), and after SIGSTOP with a
// 300 ms deadline (the figure is the time past the deadline; the issue's
// bound is 100 ms).
func BenchmarkPeerFailureDetection(b *testing.B) {
	const deadline = 300 * time.Millisecond
	drv := cuda.NewEmulated(1)
	defer drv.Close()
	network, err := remote.Open(os.Getenv("KVBM_TRANSPORT"), remote.OpenOptions{})
	require.NoError(b, err)
	dec, err := NewStandalone(StandaloneConfig{WorkerID: 0xDEC, Driver: drv, Network: network, RemoteDeadline: deadline})
	require.NoError(b, err)
	defer dec.Close()
	_, err = dec.AllocateG2(testConfig(exporterBlocks), transfer.FullyContiguous)
	require.NoError(b, err)
	ids := []int{0, 1, 2, 3}
	var killed, frozen time.Duration
	for range b.N {
		for _, kill := range []bool{true, false} {
			exp := startExporter(b, 0xA)
			require.NoError(b, dec.ConnectRemote(7, [][]byte{exp.metadata}))
			require.NoError(b, exp.cmd.Process.Signal(syscall.SIGSTOP))
			waitStopped(b, exp)
			start := time.Now()
			n, err := dec.ExecuteRemoteOnboardForInstance(7, G2, ids, G2, ids, transfer.Options{})
			require.NoError(b, err)
			if kill {
				time.Sleep(20 * time.Millisecond) // the request is on the wire
				start = time.Now()
				require.NoError(b, exp.cmd.Process.Kill())
			}
			require.ErrorIs(b, n.WaitTimeout(-1), remote.ErrPeerUnavailable)
			if kill {
				killed += time.Since(start)
			} else {
				frozen += time.Since(start) - deadline
			}
			exp.kill()
		}
	}
	b.ReportMetric(float64(killed.Milliseconds())/float64(b.N), "ms-after-kill")
	b.ReportMetric(float64(frozen.Milliseconds())/float64(b.N), "ms-past-deadline")
}
