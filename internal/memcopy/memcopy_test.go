package memcopy

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvbm/kvbm/internal/hugepage"
)

// Every size around the streaming threshold and the 64-byte steps, at
// every alignment of source and destination mod 64, with guard bytes on
// both sides of the destination left untouched.
func TestCopyMatchesCopy(t *testing.T) {
	const guard = 64
	src := make([]byte, 3*MinStreaming+4*piece/2+256)
	for i := range src {
		src[i] = byte(i*7 + i>>8)
	}
	buf := make([]byte, len(src)+2*guard+64)
	sizes := []int{0, 1, 63, 64, 65, 4096, MinStreaming - 1, MinStreaming, MinStreaming + 1, MinStreaming + 63,
		2*MinStreaming + 17, piece - 1, piece, piece + 65, 2*piece + 100}
	for _, n := range sizes {
		for _, so := range []int{0, 1, 8, 33, 63} {
			for _, do := range []int{0, 3, 16, 40, 63} {
				region := buf[:guard+do+n+guard]
				for i := range region {
					region[i] = 0xEE
				}
				dst := buf[guard+do : guard+do+n]
				if n >= MinStreaming {
					stream(dst, src[so:so+n]) // the streaming path itself, under -race too
				} else {
					require.Equal(t, n, Copy(dst, src[so:so+n]))
				}
				require.True(t, bytes.Equal(src[so:so+n], dst), "size %d, src offset %d, dst offset %d", n, so, do)
				require.Equal(t, -1, firstNot(buf[:guard+do], 0xEE), "guard before, size %d", n)
				require.Equal(t, -1, firstNot(region[guard+do+n:], 0xEE), "guard after, size %d", n)
			}
		}
	}
}

// firstNot is the index of the first byte of b that is not v, or -1.
func firstNot(b []byte, v byte) int {
	for i, x := range b {
		if x != v {
			return i
		}
	}
	return -1
}

func TestCopyShortSide(t *testing.T) {
	src := make([]byte, 2*MinStreaming)
	for i := range src {
		src[i] = byte(i)
	}
	dst := make([]byte, MinStreaming+5)
	require.Equal(t, len(dst), Copy(dst, src))
	require.Equal(t, src[:len(dst)], dst)
	dst = make([]byte, 4*MinStreaming)
	require.Equal(t, len(src), Copy(dst, src))
	require.Equal(t, src, dst[:len(src)])
	require.Equal(t, make([]byte, len(dst)-len(src)), dst[len(src):])
}

// Overlapping ranges are moved as copy moves them.
func TestCopyOverlapping(t *testing.T) {
	for _, shift := range []int{-4097, -64, -1, 1, 64, 4097} {
		a := make([]byte, 4*MinStreaming)
		b := make([]byte, len(a))
		for i := range a {
			a[i], b[i] = byte(i*13), byte(i*13)
		}
		n := 2 * MinStreaming
		s, d := MinStreaming, MinStreaming+shift
		copy(b[d:d+n], b[s:s+n])
		Copy(a[d:d+n], a[s:s+n])
		require.Equal(t, b, a, "shift %d", shift)
	}
}

// BenchmarkFragments copies 128 MiB as fragments of each size, beside one
// copy of the same bytes: what the fragment paths of a transfer do.
func BenchmarkFragments(b *testing.B) {
	const total = 128 << 20
	src, err := hugepage.Map(total, -1)
	require.NoError(b, err)
	defer hugepage.Unmap(src)
	dst, err := hugepage.Map(total, -1)
	require.NoError(b, err)
	defer hugepage.Unmap(dst)
	hugepage.Populate(src, false)
	hugepage.Populate(dst, false)
	for i := range src {
		src[i] = byte(i)
	}
	for _, size := range []int{4 << 10, 16 << 10, 32 << 10, 256 << 10} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			var plain, streamed, whole time.Duration
			for range b.N {
				t0 := time.Now()
				for off := 0; off < total; off += size {
					copy(dst[off:off+size], src[off:off+size])
				}
				plain += time.Since(t0)
				t0 = time.Now()
				for off := 0; off < total; off += size {
					Copy(dst[off:off+size], src[off:off+size])
				}
				streamed += time.Since(t0)
				t0 = time.Now()
				copy(dst, src)
				whole += time.Since(t0)
			}
			gbps := func(d time.Duration) float64 { return float64(total) * float64(b.N) / d.Seconds() / 1e9 }
			b.ReportMetric(gbps(streamed), "GB/s")
			b.ReportMetric(gbps(plain), "copy-loop-GB/s")
			b.ReportMetric(gbps(whole), "one-copy-GB/s")
			b.ReportMetric(whole.Seconds()/streamed.Seconds(), "x-one-copy")
			b.ReportMetric(0, "ns/op")
		})
	}
}
