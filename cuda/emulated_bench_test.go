package cuda

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkEmulatedH2D moves 256 blocks of 2 MiB (a Llama-3-8B block each)
// from pinned host memory to device memory through the emulated device, and
// in the same iteration does a plain Go copy of the same bytes between the
// same buffers. It reports both times per iteration and their ratio
// (emulated/plain): the overhead of queueing, checks and the stream
// goroutine over the raw memmove.
func BenchmarkEmulatedH2D(b *testing.B) {
	const n, size = 256, 2 << 20
	for _, mode := range []string{"async", "batch"} {
		b.Run(mode, func(b *testing.B) {
			e := NewEmulated(1)
			defer func() { require.NoError(b, e.Close()) }()
			s, err := e.StreamCreate(0)
			require.NoError(b, err)
			src, err := e.HostAlloc(0, n*size)
			require.NoError(b, err)
			dst, err := e.MemAlloc(0, n*size)
			require.NoError(b, err)
			srcB, err := e.Bytes(src, n*size)
			require.NoError(b, err)
			dstB, err := e.Bytes(dst, n*size)
			require.NoError(b, err)
			for i := range srcB {
				srcB[i] = byte(i * 7)
			}
			copy(dstB, srcB) // fault every page in before timing
			copies := make([]Copy, n)
			for i := range copies {
				copies[i] = Copy{Dst: dst + uint64(i)*size, Src: src + uint64(i)*size, Size: size}
			}

			b.SetBytes(2 * n * size) // both copies move the bytes
			var emu, plain time.Duration
			iters := 0
			for b.Loop() {
				t0 := time.Now()
				if mode == "batch" {
					require.NoError(b, e.MemcpyBatchAsync(HostToDevice, copies, s))
				} else {
					for _, c := range copies {
						if err := e.MemcpyAsync(HostToDevice, c, s); err != nil {
							b.Fatal(err)
						}
					}
				}
				require.NoError(b, e.StreamSynchronize(s))
				t1 := time.Now()
				for i := range n {
					copy(dstB[i*size:(i+1)*size], srcB[i*size:(i+1)*size])
				}
				plain += time.Since(t1)
				emu += t1.Sub(t0)
				iters++
			}
			b.ReportMetric(float64(emu.Nanoseconds())/float64(iters), "emulated-ns/op")
			b.ReportMetric(float64(plain.Nanoseconds())/float64(iters), "plain-ns/op")
			b.ReportMetric(float64(emu)/float64(plain), "emulated/plain")
		})
	}
}

// BenchmarkEmulatedEnqueueBatch enqueues the 16,384 fragments of 32 KiB of
// 256 Llama-3-8B blocks as one batch, and reports the time to enqueue a
// copy (checks included) beside the time the stream then takes to execute
// one, measured in the same run: enqueueing must stay a small fraction of
// the work it enqueues.
func BenchmarkEmulatedEnqueueBatch(b *testing.B) {
	const n, size = 16384, 32 << 10
	e := NewEmulated(1)
	defer func() { require.NoError(b, e.Close()) }()
	s, err := e.StreamCreate(0)
	require.NoError(b, err)
	src, err := e.HostAlloc(0, n*size)
	require.NoError(b, err)
	dst, err := e.MemAlloc(0, n*size)
	require.NoError(b, err)
	dstB, err := e.Bytes(dst, n*size)
	require.NoError(b, err)
	for i := range dstB {
		dstB[i] = byte(i)
	}
	copies := make([]Copy, n)
	for i := range copies {
		copies[i] = Copy{Dst: dst + uint64(i)*size, Src: src + uint64(i)*size, Size: size}
	}
	var enq, exec time.Duration
	for b.Loop() {
		t0 := time.Now()
		require.NoError(b, e.MemcpyBatchAsync(HostToDevice, copies, s))
		t1 := time.Now()
		require.NoError(b, e.StreamSynchronize(s))
		enq += t1.Sub(t0)
		exec += time.Since(t1)
	}
	b.ReportMetric(float64(enq.Nanoseconds())/float64(b.N)/n, "enqueue-ns/copy")
	b.ReportMetric(float64(exec.Nanoseconds())/float64(b.N)/n, "execute-ns/copy")
	b.ReportMetric(enq.Seconds()/exec.Seconds(), "enqueue/execute")
}
