package tcp

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/kvbm/kvbm/core/layout"
	"github.com/kvbm/kvbm/core/storage"
	"github.com/kvbm/kvbm/core/transfer"
	"github.com/kvbm/kvbm/cuda"
	"github.com/kvbm/kvbm/internal/baseline"
	"github.com/stretchr/testify/require"
)

// benchConfig is make bench-remote-compare's block: 32 layers, K and V,
// 16 tokens of 1,024 bf16 — 2 MiB in 64 fragments of 32 KiB.
func benchConfig(blocks int) layout.Config {
	return layout.Config{NumBlocks: blocks, NumLayers: 32, OuterDim: 2, PageSize: 16, InnerDim: 1024, DtypeWidth: 2}
}

// BenchmarkRemote moves bytes between two transports of this process
// over real sockets, by both routes: whole 2 MiB blocks G2 to G2, and
// 32 blocks of 64 scattered 32 KiB fragments (every other block of the
// exporter's engine-registered layer-separate G1, block second: host
// memory, or the emulated device's as in make bench-remote-compare) to or
// from a contiguous G2 here. Beside each figure: an in-process copy of
// the same bytes and a plain stream over the same kind of socket, in the
// same run. For profiling the route; the two-process figures are make
// bench-remote-compare's.
func BenchmarkRemote(b *testing.B) {
	const fragBlocks, wholeBlocks = 32, 64
	for _, route := range []string{"same-host", "tcp"} {
		for _, tc := range []struct {
			name  string
			whole bool
			push  bool
			g1    storage.Kind // the fragments' layout: host memory, or the emulated device's
		}{
			{"pull-whole", true, false, 0}, {"push-whole", true, true, 0},
			{"pull-fragments", false, false, storage.System}, {"push-fragments", false, true, storage.System},
			{"pull-fragments-device", false, false, storage.Device}, {"push-fragments-device", false, true, storage.Device},
		} {
			b.Run(route+"/"+tc.name, func(b *testing.B) {
				emu := cuda.NewEmulated(1)
				defer emu.Close()
				exp, err := transfer.NewManager(transfer.Config{WorkerID: 0xE1, Driver: emu})
				require.NoError(b, err)
				defer exp.Close()
				imp, err := transfer.NewManager(transfer.Config{WorkerID: 0x11, Driver: emu})
				require.NoError(b, err)
				defer imp.Close()
				cfg := Config{Listen: "127.0.0.1:0", NoSameHost: route == "tcp"}
				expT, impT := New(cfg), New(cfg)
				require.NoError(b, expT.Serve(exp))
				require.NoError(b, impT.Serve(imp))
				defer expT.Close()
				defer impT.Close()

				n := wholeBlocks
				if !tc.whole {
					n = fragBlocks
				}
				local, err := imp.AllocateLayout(storage.Pinned, benchConfig(n), transfer.FullyContiguous)
				require.NoError(b, err)
				var remoteH transfer.LayoutHandle
				rids, lids := make([]int, n), make([]int, n)
				for i := range n {
					rids[i], lids[i] = i, i
				}
				if tc.whole {
					remoteH, err = exp.AllocateLayout(storage.Pinned, benchConfig(n), transfer.FullyContiguous)
					require.NoError(b, err)
				} else {
					rcfg := benchConfig(2 * fragBlocks)
					shape := transfer.Shape{Kind: layout.LayerSeparate, BlockDim: layout.BlockIsSecondDim}
					sizes, err := layout.RegionSizes(rcfg, shape.Kind, shape.BlockDim)
					require.NoError(b, err)
					var ptrs []uint64
					for _, s := range sizes {
						mem, err := storage.AllocSystem(s)
						require.NoError(b, err)
						defer mem.Close()
						bb, _ := mem.Bytes()
						for i := range bb {
							bb[i] = 1
						}
						ptrs = append(ptrs, mem.Addr())
					}
					remoteH, err = exp.RegisterExternal(tc.g1, rcfg, shape, ptrs)
					require.NoError(b, err)
					for i := range rids {
						rids[i] = 2 * i
					}
				}
				ep, err := expT.Endpoint()
				require.NoError(b, err)
				peer, err := impT.Connect(context.Background(), ep)
				require.NoError(b, err)
				d, err := exp.Describe(remoteH)
				require.NoError(b, err)
				_, err = imp.Import(peer, []transfer.Descriptor{d})
				require.NoError(b, err)

				bytes := uint64(n * benchConfig(1).BlockSize())
				src, dst := remoteH, local
				sids, dids := rids, lids
				if tc.push {
					src, dst, sids, dids = local, remoteH, lids, rids
				}
				move := func() {
					nt, err := imp.ExecuteTransfer(src, sids, dst, dids, transfer.Options{})
					require.NoError(b, err)
					require.NoError(b, nt.WaitTimeout(-1))
				}
				move() // warm up: every page faulted in, every connection open

				cp, err := baseline.NewCopy(int(bytes))
				require.NoError(b, err)
				defer cp.Close()
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(b, err)
				defer ln.Close()
				streamMem := make([]byte, bytes)
				go baseline.ServeStream(ln, streamMem)
				st, err := baseline.DialStream(ln.Addr().String())
				require.NoError(b, err)
				defer st.Close()
				buf := make([]byte, bytes)
				var took, limit, stream time.Duration
				b.ResetTimer()
				for range b.N {
					start := time.Now()
					move()
					took += time.Since(start)
					limit += cp.Run(int64(bytes), 1)
					var d time.Duration
					if tc.push {
						d, err = st.Push(buf)
					} else {
						d, err = st.Pull(buf)
					}
					require.NoError(b, err)
					stream += d
				}
				b.StopTimer()
				gbps := func(d time.Duration) float64 { return float64(bytes) * float64(b.N) / d.Seconds() / 1e9 }
				b.ReportMetric(gbps(took), "GB/s")
				b.ReportMetric(limit.Seconds()/took.Seconds(), "x-memcpy")
				b.ReportMetric(stream.Seconds()/took.Seconds(), "x-tcp-stream")
				b.ReportMetric(0, "ns/op")
				require.NoError(b, peer.Close())
			})
		}
	}
}
