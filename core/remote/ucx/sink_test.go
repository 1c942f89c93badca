//go:build cgo

package ucx

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// A sink gets a message's fragments at any offsets, in any order (UCX
// checks only that each lies inside the message; an exporter picks
// them): every byte lands at its place in the destination's pieces, none
// outside them, and none once the sink is closed.
func FuzzSinkUnpack(f *testing.F) {
	f.Add(uint64(1), uint8(3), uint8(0))
	f.Add(uint64(7), uint8(1), uint8(5))
	f.Add(uint64(42), uint8(8), uint8(2))
	f.Fuzz(func(t *testing.T, seed uint64, npieces, closeAfter uint8) {
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		const guard = 8
		n := 1 + int(npieces%8)
		sizes := make([]uint64, n)
		var total uint64
		for i := range sizes {
			sizes[i] = 1 + rng.Uint64N(64)
			total += sizes[i]
		}
		// The pieces lie apart in one buffer, guard bytes around each.
		buf := bytes.Repeat([]byte{0xEE}, int(total)+guard*(n+1))
		dst := make([]piece, n)
		at := guard
		for i, sz := range sizes {
			dst[i] = piece{uint64(uintptr(unsafe.Pointer(&buf[at]))), sz}
			at += int(sz) + guard
		}
		msg := make([]byte, total)
		for i := range msg {
			msg[i] = byte(rng.Uint32())
		}
		// Cut into fragments, handed over in a shuffled order.
		type frag struct{ off, n uint64 }
		var frags []frag
		for off := uint64(0); off < total; {
			k := min(total-off, 1+rng.Uint64N(40))
			frags = append(frags, frag{off, k})
			off += k
		}
		rng.Shuffle(len(frags), func(i, j int) { frags[i], frags[j] = frags[j], frags[i] })
		closeAt := len(frags)
		if closeAfter > 0 {
			closeAt = int(closeAfter) % (len(frags) + 1)
		}

		s := newSink(dst, total)
		require.NotNil(t, s)
		defer releaseSink(s)
		want := bytes.Repeat([]byte{0xEE}, len(buf))
		var landed uint64
		for i, fr := range frags {
			if i == closeAt {
				s.open = 0
			}
			unpackInto(s, fr.off, msg[fr.off:fr.off+fr.n])
			if i >= closeAt {
				continue
			}
			landed += fr.n
			// Where the fragment's bytes belong.
			for b := fr.off; b < fr.off+fr.n; b++ {
				pos, rest := guard, b
				for _, sz := range sizes {
					if rest < sz {
						break
					}
					rest -= sz
					pos += int(sz) + guard
				}
				want[pos+int(rest)] = msg[b]
			}
		}
		require.Equal(t, want, buf, "bytes where they belong, guards untouched")
		require.Equal(t, landed, uint64(s.landed))
		require.Equal(t, total, uint64(s.landed+s.dropped))
		// Beyond the message: dropped, nothing written.
		unpackInto(s, total, []byte{1})
		require.Equal(t, want, buf)
		runtime.KeepAlive(buf)
	})
}
