package crc32c

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func random(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed+1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// Every length around the fold's steps, at every alignment of a 64-byte
// line, from random running values: the same value as hash/crc32.
func TestUpdateIsHashCRC32Castagnoli(t *testing.T) {
	if !folds {
		t.Skip("no folded path on this CPU or build: Update is hash/crc32 itself")
	}
	r := rand.New(rand.NewPCG(1, 2))
	buf := random(1, 9000)
	for n := 0; n <= 4200; n++ {
		off := n % 64
		p := buf[off : off+n]
		crc := r.Uint32()
		require.Equal(t, crc32.Update(crc, table, p), Update(crc, p), "length %d at offset %d from 0x%08x", n, off, crc)
	}
	require.Equal(t, crc32.Checksum(buf, table), Checksum(buf))
}

// The folded path itself from its shortest input (256 bytes, below what
// Update hands it), each input flush against unmapped pages on both sides:
// a read of one byte too many, before or after, faults.
func TestFoldReadsExactlyItsBytes(t *testing.T) {
	if !folds {
		t.Skip("no folded path on this CPU or build")
	}
	const max = 5000
	g := guarded(t, max)
	src := random(5, max)
	r := rand.New(rand.NewPCG(7, 8))
	for n := 256; n <= max; n++ {
		for _, p := range [][]byte{g.atStart(n), g.atEnd(n)} {
			copy(p, src[:n])
			crc := r.Uint32()
			require.Equal(t, crc32.Update(crc, table, p), ^fold(^crc, p), "length %d", n)
		}
	}
}

// A folded update split anywhere continues exactly as one update.
func TestUpdateInPieces(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	buf := random(3, 1<<20+37)
	want := crc32.Checksum(buf, table)
	for range 50 {
		cut := r.IntN(len(buf))
		require.Equal(t, want, Update(Checksum(buf[:cut]), buf[cut:]), "cut at %d", cut)
	}
}

// Every single flipped bit of a 4 KiB input changes its CRC, to hash/crc32's
// value.
func TestUpdateSeesEveryFlippedBit(t *testing.T) {
	buf := make([]byte, 4096)
	want := Checksum(buf)
	for bit := range len(buf) * 8 {
		buf[bit/8] ^= 1 << (bit % 8)
		got := Checksum(buf)
		require.NotEqual(t, want, got, "bit %d", bit)
		require.Equal(t, crc32.Checksum(buf, table), got, "bit %d", bit)
		buf[bit/8] ^= 1 << (bit % 8)
	}
}

func FuzzUpdate(f *testing.F) {
	f.Add(uint32(0), make([]byte, 3000))
	f.Add(uint32(0xffffffff), []byte("kvbm"))
	f.Fuzz(func(t *testing.T, crc uint32, p []byte) {
		require.Equal(t, crc32.Update(crc, table, p), Update(crc, p))
	})
}
